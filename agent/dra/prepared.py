"""The claims this node has prepared, kept in a msgpack checkpoint (agent/checkpoint.py) that is
written before kubelet gets an answer: a restarted agent answers a repeated prepare from it,
unprepares what an earlier process prepared, and still refuses a device already prepared for
another claim. The CDI spec of each claim is kept with it, so a spec the runtime's folder lost
(/var/run is a tmpfs) is written again when kubelet asks for the claim once more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import checkpoint

log = logging.getLogger(__name__)

FILE_NAME = "dra-checkpoint.msgpack"
VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]  # base request names
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    admin_access: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdi": list(self.cdi_ids),
            "admin": self.admin_access,
        }

    @classmethod
    def from_wire(cls, data: Any) -> PreparedDevice:
        if not isinstance(data, dict):
            raise ValueError("a prepared device is not a map")
        lists = [data.get(k) for k in ("requests", "cdi")]
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
            raise ValueError("requests or cdi is not a list of strings")
        pool, device = data.get("pool"), data.get("device")
        if not isinstance(pool, str) or not pool or not isinstance(device, str) or not device:
            raise ValueError("pool or device missing")
        return cls(tuple(lists[0] or ()), pool, device, tuple(lists[1] or ()), data.get("admin") is True)


@dataclass
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: list[PreparedDevice] = field(default_factory=list)
    cdi_spec: dict[str, Any] | None = None  # None: no device of ours, no spec written

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_wire(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.to_wire() for d in self.devices],
            "cdiSpec": self.cdi_spec,
        }

    @classmethod
    def from_wire(cls, uid: str, data: Any) -> PreparedClaim:
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise ValueError("a prepared claim is not a map with devices")
        spec = data.get("cdiSpec")
        return cls(
            uid,
            str(data.get("namespace", "")),
            str(data.get("name", "")),
            [PreparedDevice.from_wire(d) for d in data["devices"]],
            spec if isinstance(spec, dict) else None,
        )


class PreparedClaims:
    """claim UID -> what was prepared for it, saved on every change."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        loaded = checkpoint.load(self.path, version=VERSION)
        if loaded is None:
            return
        state, _ = loaded
        claims = state.get("claims")
        for uid, entry in (claims if isinstance(claims, dict) else {}).items():
            try:
                self.claims[str(uid)] = PreparedClaim.from_wire(str(uid), entry)
            except ValueError as exc:
                log.warning("DRA checkpoint: prepared claim %s dropped: %s", uid, exc)
        log.info("DRA checkpoint restored: %d prepared claims", len(self.claims))

    def save(self) -> None:
        """Raises OSError: a prepare or unprepare that cannot be recorded must not be reported done."""
        checkpoint.save(
            self.path, {"claims": {uid: c.to_wire() for uid, c in self.claims.items()}}, version=VERSION
        )

    def holder(self, pool: str, device: str, *, other_than: str) -> PreparedClaim | None:
        """The claim (other than `other_than`) a device is prepared for, not counting admin access."""
        for uid, claim in self.claims.items():
            if uid == other_than:
                continue
            if any(d.pool == pool and d.device == device and not d.admin_access for d in claim.devices):
                return claim
        return None
