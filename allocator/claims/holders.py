"""Which allocated ResourceClaims hold each topoalloc.io device, as the watch cache shows them, and
since when (the resourceVersion at which the cache first showed the claim's current allocation).

kube-scheduler's own allocator and topoalloc allocate from the same slices, each counting only the
allocations its cache already has, so two claims can name one device (allocator/core/claims/
race.py decides what moves). Fed by the claims controller from every ResourceClaim watch event;
devices taken with admin access, or as a share of a device that takes several allocations
(`shareID`), are meant to be shared and are not counted.
"""

from __future__ import annotations

from typing import Any

from apis import dra

JSON = dict[str, Any]
Device = tuple[str, str]  # (pool, device name)


def _version(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _devices(obj: JSON) -> frozenset[Device]:
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(
        (str(r.get("pool") or ""), str(r.get("device") or ""))
        for r in results
        if isinstance(r, dict)
        and r.get("driver") == dra.DRIVER
        and not r.get("adminAccess")
        and not r.get("shareID")  # a share of a device that takes several allocations
    )


class ClaimHolders:
    def __init__(self) -> None:
        self._claims: dict[str, tuple[str, frozenset[Device], int]] = {}  # key -> uid, devices, since
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
        devices = _devices(obj) if obj is not None else frozenset()
        old = self._claims.get(key)
        if old is not None and old[0] == uid and old[1] == devices:
            return False
        if old is not None:
            for d in old[1] - devices:
                holders = self._devices.get(d)
                if holders is not None:
                    holders.discard(key)
                    if len(holders) < 2:
                        self.contested.discard(d)
                    if holders:
                        self.dropped.add(d)
                    else:
                        del self._devices[d]
                        self.dropped.discard(d)
            del self._claims[key]
        if not devices:
            return False
        self._claims[key] = (uid, devices, _version(meta.get("resourceVersion")))
        grew = False
        for d in devices:
            holders = self._devices.setdefault(d, set())
            holders.add(key)
            if len(holders) > 1:
                grew = grew or d not in self.contested
                self.contested.add(d)
        return grew

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
        for d in found[1]:
            if d in self.contested:
                out.update(self._devices[d])
        out.discard(key)
        return tuple(sorted(out))
