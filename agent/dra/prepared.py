"""The claims this node has prepared, kept in a msgpack checkpoint (agent/checkpoint.py) that is
written before kubelet gets an answer: a restarted agent answers a repeated prepare from it,
unprepares what an earlier process prepared, and still refuses a device already prepared for
another claim (several claims hold one GPU only as shares that fit it together: each prepared
device keeps its shareID and consumed capacity). The CDI spec of each claim is kept with it, so a
spec the runtime's folder lost (/var/run is a tmpfs) is written again when kubelet asks for the
claim once more.
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
    share_id: str = ""  # a share of a sharable GPU (the allocation result's shareID)
    consumed: dict[str, int] | None = None  # what the share consumes; None: the whole device

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdi": list(self.cdi_ids),
            "admin": self.admin_access,
        }
        if self.share_id:
            out["share"] = self.share_id
        if self.consumed is not None:
            out["consumed"] = dict(self.consumed)
        return out

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
        share, consumed = data.get("share", ""), data.get("consumed")
        if not isinstance(share, str):
            raise ValueError("share is not a string")
        if consumed is not None and not (
            isinstance(consumed, dict)
            and all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in consumed.items())
        ):
            raise ValueError("consumed is not a map of names to amounts")
        return cls(
            tuple(lists[0] or ()),
            pool,
            device,
            tuple(lists[1] or ()),
            data.get("admin") is True,
            share,
            consumed,
        )


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

    def holders(
        self, pool: str, device: str, *, other_than: str
    ) -> list[tuple[PreparedClaim, PreparedDevice]]:
        """The claims (other than `other_than`) a device is prepared for, with what each holds of it,
        not counting admin access."""
        out = []
        for uid, claim in self.claims.items():
            if uid == other_than:
                continue
            out.extend(
                (claim, d)
                for d in claim.devices
                if d.pool == pool and d.device == device and not d.admin_access
            )
        return out
