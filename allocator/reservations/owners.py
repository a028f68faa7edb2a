"""Which Reservations could have a pod among their owners, found without looking at them all.

Each owner entry of a Reservation is filed under its most selective key: the pod's uid, its name,
its controller's uid, or the first matchLabels pair of its selector; an entry with none of these
(`{}`, a namespace alone, matchExpressions only) is looked at for every pod. A pod's candidates are
the union of its keys' files, so finding them costs O(the pod's labels and owner references), not
O(Reservations); the full owner match (apis.reservation.Owner) then decides among the few found.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from apis.reservation import Owner

Key = tuple[str, str, str]  # (what, first part, second part)


def _key(owner: Owner) -> Key | None:
    obj, ctl, sel = owner.obj, owner.controller, owner.selector
    if obj is not None and obj.uid:
        return ("uid", obj.uid, "")
    if obj is not None and obj.name:
        return ("name", obj.name, "")
    if ctl is not None and ctl.uid:
        return ("controller", ctl.uid, "")
    if sel is not None and sel.match_labels:
        k, v = min(sel.match_labels.items())
        return ("label", k, v)
    return None


class OwnerIndex:
    def __init__(self) -> None:
        self._files: dict[Key, set[str]] = defaultdict(set)
        self._scan: set[str] = set()
        self._keys: dict[str, list[Key | None]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def set(self, name: str, owners: Iterable[Owner]) -> None:
        self.remove(name)
        keys = [_key(o) for o in owners]
        self._keys[name] = keys
        for key in keys:
            if key is None:
                self._scan.add(name)
            else:
                self._files[key].add(name)

    def remove(self, name: str) -> None:
        for key in self._keys.pop(name, ()):
            if key is None:
                self._scan.discard(name)
                continue
            names = self._files.get(key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._files[key]

    def candidates(self, meta: Mapping[str, Any]) -> set[str]:
        """Names of the Reservations that may list this pod among their owners (a superset)."""
        files = self._files
        found = set(self._scan)
        if not files:
            return found
        for key in _keys_of(meta):
            hit = files.get(key)
            if hit:
                found |= hit
        return found


def _keys_of(meta: Mapping[str, Any]) -> Iterable[Key]:
    if meta.get("uid"):
        yield ("uid", str(meta["uid"]), "")
    if meta.get("name"):
        yield ("name", str(meta["name"]), "")
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("uid"):
            yield ("controller", str(ref["uid"]), "")
    for k, v in (meta.get("labels") or {}).items():
        yield ("label", k, v)
