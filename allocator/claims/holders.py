"""Which allocated ResourceClaims hold each topoalloc.io device, as the watch cache shows them, and
since when (the resourceVersion at which the cache first showed the claim's current allocation).

kube-scheduler's own allocator and topoalloc allocate from the same slices, each counting only the
allocations its cache already has, so two claims can name one device (allocator/core/claims/
race.py decides what moves). Fed by the claims controller from every ResourceClaim watch event;
devices taken with admin access are meant to be shared and are not counted. A share of a device
that takes several allocations (a result with `shareID` and `consumedCapacity`) holds that much of
it: its holders conflict only when what they consume together exceeds the device's capacity (from
its slice), or when one of them holds it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from allocator.core.claims.race import Use, overflows
from apis import dra

JSON = dict[str, Any]
Device = tuple[str, str]  # (pool, device name)
Capacity = Callable[[Device], Mapping[str, int] | None]  # a device's capacities (None: not known)


def _version(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _devices(obj: JSON) -> dict[Device, Use]:
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    out: dict[Device, Use] = {}
    for r in results:
        if not isinstance(r, dict) or r.get("driver") != dra.DRIVER or r.get("adminAccess"):
            continue
        device = (str(r.get("pool") or ""), str(r.get("device") or ""))
        out[device] = _use(r) if device not in out else None  # one device twice in a claim: whole
    return out


def _use(result: JSON) -> Use:
    """What a result consumes: a share's consumedCapacity, or None (the whole device) for a result
    without a shareID (kube-scheduler counts those whole too) or with an unreadable amount."""
    if not dra.share_id(result):
        return None
    try:
        found = dra.consumed_capacity(result)
    except (ValueError, TypeError):
        return None
    return None if found is None else tuple(sorted(found.items()))


class ClaimHolders:
    def __init__(self, capacity: Capacity = lambda device: None) -> None:
        self.capacity = capacity
        self._claims: dict[str, tuple[str, dict[Device, Use], int]] = {}  # key -> uid, devices, since
        self._devices: dict[Device, set[str]] = {}
        self.contested: set[Device] = set()  # devices in two claims or more
        # Devices a claim let go of while another claim still held them: kube-scheduler counts
        # them free (its count is a set) until a claim allocated with them is seen again.
        self.dropped: set[Device] = set()
        self.announcing: dict[Device, tuple[str, bool]] = {}  # device -> announcing claim, allocated

    def update(self, key: str, obj: JSON | None) -> bool:
        """The claim as the watch shows it now (None: deleted); whether a device became contested."""
        meta = (obj or {}).get("metadata") or {}
        announces = str((meta.get("annotations") or {}).get(dra.ANNOUNCES_ANNOTATION) or "")
        if announces or key in self._announcers:
            self._announcer(key, announces, obj)
            return False
        uid = str(meta.get("uid") or "")
        devices = _devices(obj) if obj is not None else {}
        old = self._claims.get(key)
        if old is not None and old[0] == uid and old[1] == devices:
            return False
        if old is not None:
            del self._claims[key]
            for d, use in old[1].items():
                holders = self._devices.get(d)
                if holders is None or (d in devices and devices[d] == use):
                    continue
                holders.discard(key)
                if not self._overflows(d):
                    self.contested.discard(d)
                if not holders:
                    del self._devices[d]
                    self.dropped.discard(d)
                elif use is None and any(self._claims[k][1][d] is None for k in holders):
                    # kube-scheduler counts whole holders as a set: it now counts the device free
                    self.dropped.add(d)
        if not devices:
            return False
        self._claims[key] = (uid, devices, _version(meta.get("resourceVersion")))
        grew = False
        for d in devices:
            self._devices.setdefault(d, set()).add(key)
            if self._overflows(d):
                grew = grew or d not in self.contested
                self.contested.add(d)
        return grew

    def _overflows(self, device: Device) -> bool:
        keys = self._devices.get(device, ())
        if len(keys) < 2:
            return False  # the usual device of a claim event: no capacity to look up
        return overflows([self._claims[k][1][device] for k in keys], self.capacity(device))

    def use(self, key: str, device: Device) -> Use:
        found = self._claims.get(key)
        return None if found is None else found[1].get(device)

    @property
    def _announcers(self) -> dict[str, Device]:
        return {key: d for d, (key, _) in self.announcing.items()}

    def _announcer(self, key: str, announces: str, obj: JSON | None) -> None:
        """A claim of the allocator's own holding one device in kube-scheduler's count."""
        for d, (k, _) in list(self.announcing.items()):
            if k == key:
                del self.announcing[d]
                if obj is None and d in self._devices:
                    self.dropped.add(d)  # its deletion took the device out of kube-scheduler's count
        if obj is None:
            return
        pool, _, name = announces.partition("/")
        self.announcing[(pool, name)] = (key, bool(_devices(obj)))

    def held(self, device: Device) -> bool:
        return bool(self._devices.get(device))

    def since(self, key: str) -> int:
        found = self._claims.get(key)
        return found[2] if found is not None else 0

    def holders(self, device: Device) -> tuple[str, ...]:
        return tuple(sorted(self._devices.get(device, ())))

    def rivals(self, key: str) -> tuple[str, ...]:
        """The other claims holding a device of this one."""
        found = self._claims.get(key)
        if found is None:
            return ()
        out: set[str] = set()
        for d, use in found[1].items():
            if d not in self.contested:
                continue
            if use is not None and key in self._fitting(d):
                continue  # a share that fits with the shares allocated before it
            out.update(self._devices[d])
        out.discard(key)
        return tuple(sorted(out))

    def _fitting(self, device: Device) -> set[str]:
        """The holders of a device that fit it, taken in the order they were allocated."""
        kept: list[Use] = []
        out = set()
        for k in sorted(self._devices.get(device, ()), key=lambda k: (self._claims[k][2], k)):
            use = self._claims[k][1][device]
            if not overflows([*kept, use], self.capacity(device)):
                kept.append(use)
                out.add(k)
        return out
