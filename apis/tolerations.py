"""Whether tolerations tolerate a taint (corev1's ToleratesTaint): for Node taints (gang planning)
and Reservation taints alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JSON = dict[str, Any]


def tolerates(tolerations: Iterable[JSON], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        effect = t.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = t.get("key") or ""
        if (t.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
