"""NodePrepareResources and NodeUnprepareResources, independent of the gRPC version kubelet speaks.

Prepare, per claim: a claim prepared before gets the same answer (its CDI spec rewritten if the
runtime's folder lost it); otherwise the claim is read from the API (by namespace and name) and must
be the one kubelet means (same UID) and allocated; of its results only topoalloc's in this node's
pool count, each mapped to the node's current Device by its name (`apis.dra`). A device that is
unknown, unhealthy or already prepared for another claim (the last guard against double use) fails
the claim with an error naming it, never the call. A shared GPU is the exception: a result with a
shareID is prepared for its claim alone (its CDI spec carries HAMi-core's limits when the share is
less than the GPU, the gRPC Device its share_id), and several claims may hold one GPU when each
holds it as a share and their consumed capacity together fits it (memory and cores); a whole
allocation beside anything else, or shares beyond the GPU, are refused. The claim's CDI spec is
written, and the new state checkpointed, before the answer goes out.

Unprepare, per claim: forget it and remove its CDI spec; a claim never prepared here (or already
unprepared, possibly by an earlier process) is a success.

Calls are serialized: a prepare and an unprepare never interleave.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.dra.cdi import CdiError, ClaimSpecs, Resolved, cdi_device_id, whole_gpu
from agent.dra.claims import ClaimDevice, ClaimError, ClaimRef, claim_devices
from agent.dra.prepared import PreparedClaim, PreparedClaims, PreparedDevice
from agent.kube import TRANSPORT_ERRORS, short_error, status_of
from agent.metrics import CLAIM_PREPARES
from apis import dra
from apis.device import Device, DeviceInfo

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """The answer for one claim: its devices, or an error."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class Preparer:
    def __init__(
        self,
        *,
        node: str,
        get_claim: Callable[[str, str], dict[str, Any]],
        store: PreparedClaims,
        specs: ClaimSpecs,
    ) -> None:
        self.node = node
        self.get_claim = get_claim
        self.store = store
        self.specs = specs
        self.device: Device | None = None  # the node's current Device (each discovery pass)
        self._lock = threading.Lock()
        self.refusals = 0

    # -- prepare ----------------------------------------------------------------------------------
    def prepare(self, claims: list[ClaimRef]) -> dict[str, Prepared]:
        with self._lock:
            out: dict[str, Prepared] = {}
            new: list[str] = []
            for ref in claims:
                try:
                    claim = self._prepare_one(ref)
                except (ClaimError, CdiError, OSError) as exc:
                    self.refusals += 1
                    CLAIM_PREPARES.labels("failed").inc()
                    message = str(exc) if not isinstance(exc, OSError) else f"claim {ref}: {exc}"
                    log.warning("prepare refused: %s", message)
                    out[ref.uid] = Prepared(error=message)
                    continue
                if ref.uid not in self.store.claims:
                    self.store.claims[ref.uid] = claim
                    new.append(ref.uid)
                CLAIM_PREPARES.labels("prepared").inc()
                out[ref.uid] = Prepared(list(claim.devices))
            if new and not self._saved(new, [], out):
                for uid in new:
                    with contextlib.suppress(OSError):  # a stray spec names no device anyone uses
                        self.specs.remove(uid)
            return out

    def _prepare_one(self, ref: ClaimRef) -> PreparedClaim:
        if not (ref.uid and ref.namespace and ref.name):
            raise ClaimError(f"kubelet named a claim without namespace, name or UID: {ref} ({ref.uid})")
        done = self.store.claims.get(ref.uid)
        if done is not None:
            if done.cdi_spec is not None:
                self.specs.ensure(ref.uid, done.cdi_spec)
            return done
        device = self.device
        if device is None:
            raise ClaimError(f"claim {ref}: the agent has not discovered this node's devices yet")
        wanted = claim_devices(self._read(ref), ref, self.node)
        resolved, requests, shares = self._resolve(ref, device, wanted)
        spec = self.specs.build(ref.uid, resolved) if resolved else None
        devices = [
            PreparedDevice(
                tuple(requests[str(r.name)]),
                self.node,
                str(r.name),
                (cdi_device_id(ref.uid, str(r.name)),),
                all(w.admin_access for w in wanted if w.device == str(r.name)),
                *shares.get(str(r.name), ("", None)),
            )
            for r in resolved
        ]
        if spec is not None:
            self.specs.write(ref.uid, spec)
        return PreparedClaim(ref.uid, ref.namespace, ref.name, devices, spec)

    def _read(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            return self.get_claim(ref.namespace, ref.name)
        except TRANSPORT_ERRORS as exc:
            if status_of(exc) == 404:
                raise ClaimError(f"claim {ref} not found: it was deleted") from None
            raise ClaimError(f"claim {ref} cannot be read: {short_error(exc)}") from None

    def _resolve(
        self, ref: ClaimRef, device: Device, wanted: list[ClaimDevice]
    ) -> tuple[list[Resolved], dict[str, list[str]], dict[str, tuple[str, dict[str, int]]]]:
        """Each device once (a device may serve several requests), checked against the node; with
        the share (shareID, consumed capacity) this claim holds of each shared GPU."""
        resolved: list[Resolved] = []
        requests: dict[str, list[str]] = {}
        shares: dict[str, tuple[str, dict[str, int]]] = {}
        for item in wanted:
            if item.device in requests:
                if item.request not in requests[item.device]:
                    requests[item.device].append(item.request)
                continue
            name = dra.parse_device_name(item.device)
            if name is None:
                raise ClaimError(f"claim {ref}: {item.device} is not a {dra.DRIVER} device name")
            found = dra.find_device(device, name)
            if found is None:
                raise ClaimError(f"claim {ref}: node {self.node} has no device {item.device}")
            info, vf = found
            if not info.health:
                reason = info.conditions[0].reason if info.conditions else "unhealthy"
                raise ClaimError(f"claim {ref}: device {item.device} is unhealthy ({reason})")
            share = None
            if item.share_id and name.type == dra.TYPE_GPU:
                # every result of this claim on the device: one claim may hold it by several requests
                mine = [w for w in wanted if w.device == item.device]
                shares[item.device] = (item.share_id, self._consumed(ref, info, item.device, mine))
                share = _limits(info, shares[item.device][1])
            if not item.admin_access:
                self._check_holders(ref, info, item.device, shares.get(item.device))
            resolved.append(Resolved(name, info, vf, share))
            requests[item.device] = [item.request]
        return resolved, requests, shares

    def _consumed(
        self, ref: ClaimRef, info: DeviceInfo, device: str, mine: list[ClaimDevice]
    ) -> dict[str, int]:
        """What this claim's results on a shared GPU consume together (a result without
        consumedCapacity, or without one of the two, takes all of it)."""
        whole = whole_gpu(info)
        if any(not w.share_id for w in mine):
            raise ClaimError(f"claim {ref}: device {device} is allocated both whole and as a share")
        total = dict.fromkeys(whole, 0)
        for w in mine:
            for key in total:
                total[key] += (w.consumed or {}).get(key, whole[key])
        return total

    def _check_holders(
        self, ref: ClaimRef, info: DeviceInfo, device: str, share: tuple[str, dict[str, int]] | None
    ) -> None:
        """The last guard against double use: a device prepared for another claim is refused, unless
        every claim holding it, this one too, holds a share and the shares fit the GPU together."""
        holders = self.store.holders(self.node, device, other_than=ref.uid)
        whole = [(c, d) for c, d in holders if not d.share_id or d.consumed is None]
        if holders and (share is None or whole):
            holder = (whole or holders)[0][0]
            what = "as a whole device" if whole else "as a share, and this claim wants it whole"
            raise ClaimError(
                f"claim {ref}: device {device} is already prepared for claim {holder} "
                f"(UID {holder.uid}) {what}"
            )
        if share is None:
            return
        for key, total in whole_gpu(info).items():
            used = sum((d.consumed or {}).get(key, total) for _, d in holders)
            asked = share[1][key]
            if used + asked > total:
                names = ", ".join(f"{c} (share {d.share_id})" for c, d in holders)
                raise ClaimError(
                    f"claim {ref}: device {device} cannot take this share: {key} {asked} asked, "
                    f"{used} of {total} already prepared" + (f" for {names}" if names else "")
                )

    # -- unprepare --------------------------------------------------------------------------------
    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        """claim UID -> error ("" when done)."""
        with self._lock:
            out: dict[str, str] = {}
            gone: list[PreparedClaim] = []
            for ref in claims:
                claim = self.store.claims.pop(ref.uid, None)
                if claim is not None:
                    try:
                        self.specs.remove(ref.uid)
                    except OSError as exc:
                        self.store.claims[ref.uid] = claim
                        out[ref.uid] = f"claim {ref}: CDI spec not removed: {exc}"
                        continue
                    gone.append(claim)
                out[ref.uid] = ""
            if gone:
                self._saved([], gone, out)
            return out

    # -- checkpoint -------------------------------------------------------------------------------
    def _saved(self, new: list[str], gone: list[PreparedClaim], out: dict[str, Any]) -> bool:
        """Checkpoint the changes of this call; when that fails, undo them and fail their claims."""
        try:
            self.store.save()
            return True
        except OSError as exc:
            error = f"checkpoint {self.store.path} not written: {exc}"
            log.warning("%s", error)
            for uid in new:
                self.store.claims.pop(uid, None)
                out[uid] = Prepared(error=error)
            for claim in gone:
                self.store.claims[claim.uid] = claim
                if claim.cdi_spec is not None:
                    with contextlib.suppress(OSError):  # kubelet retries; prepare writes it again
                        self.specs.write(claim.uid, claim.cdi_spec)
                out[claim.uid] = error
            return False


def _limits(info: DeviceInfo, consumed: dict[str, int]) -> tuple[int, int] | None:
    """A share's (memory, cores) limits; None when it consumes the whole GPU (no limits)."""
    if all(consumed[key] >= total for key, total in whole_gpu(info).items()):
        return None
    return consumed[dra.CAPACITY_MEMORY], consumed[dra.CAPACITY_CORES]
