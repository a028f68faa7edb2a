"""Device taints and tolerations (resource.k8s.io/v1, DRADeviceTaints: beta and on from Kubernetes
1.36; with the gate off the API server drops them on write).

A driver taints a device in its ResourceSlice; a claim's request tolerates a taint the way a pod
tolerates a node taint. `NoSchedule` keeps new allocations off the device, `NoExecute` also makes
kube-controller-manager evict the pods of claims already allocated it, `None` only tells. The agent
taints a device that turned unhealthy with `topoalloc.io/unhealthy` (the reason as value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from apis import decode as d

UNHEALTHY_KEY: Final = "topoalloc.io/unhealthy"
NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
NONE: Final = "None"
EFFECTS: Final = (NO_SCHEDULE, NO_EXECUTE, NONE)
EXISTS: Final = "Exists"
EQUAL: Final = "Equal"
MAX_TAINTS: Final = 16
# The first release whose API server keeps device taints by default (DRADeviceTaints beta and on).
SERVED_SINCE_MINOR: Final = 36

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    effect: str
    value: str = ""
    time_added: str = ""

    @property
    def blocks_allocation(self) -> bool:
        """NoSchedule and NoExecute keep a device out of new allocations unless tolerated."""
        return self.effect in (NO_SCHEDULE, NO_EXECUTE)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = EQUAL
    value: str = ""
    effect: str = ""  # "" tolerates every effect
    seconds: int | None = None

    def tolerates(self, taint: DeviceTaint) -> bool:
        """Kubernetes' rule: the effect matches (or is empty), and the key and value match (Equal),
        or the key matches or is empty (Exists)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == EXISTS:
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        for name, value in (("key", self.key), ("value", self.value), ("effect", self.effect)):
            if value:
                out[name] = value
        if self.seconds is not None:
            out["tolerationSeconds"] = self.seconds
        return out


def blocking(taints: tuple[DeviceTaint, ...], tolerations: tuple[DeviceToleration, ...]) -> list[DeviceTaint]:
    """The taints that keep a device from a request with `tolerations`."""
    return [t for t in taints if t.blocks_allocation and not any(x.tolerates(t) for x in tolerations)]


def taint_value(reason: str) -> str:
    """A reason as a taint value (a label value: at most 63 of [A-Za-z0-9_.-], alphanumeric ends)."""
    return _LABEL_VALUE.sub("-", reason)[:63].strip("-_.")


def parse_taints(data: dict[str, Any], path: str) -> tuple[DeviceTaint, ...]:
    out = []
    for i, item in enumerate(d.array(data, "taints", path)):
        tpath = d.join(d.join(path, "taints"), i)
        t = d.struct(item, tpath, ("key", "value", "effect", "timeAdded"))
        out.append(
            DeviceTaint(
                key=d.string(t, "key", tpath, required=True),
                effect=d.string(t, "effect", tpath),
                value=d.string(t, "value", tpath),
                time_added=d.string(t, "timeAdded", tpath),
            )
        )
    return tuple(out)


def parse_tolerations(data: dict[str, Any], path: str) -> tuple[DeviceToleration, ...]:
    out = []
    for i, item in enumerate(d.array(data, "tolerations", path)):
        tpath = d.join(d.join(path, "tolerations"), i)
        t = d.struct(item, tpath, ("key", "operator", "value", "effect", "tolerationSeconds"))
        operator = d.string(t, "operator", tpath) or EQUAL
        d.one_of(operator, (EXISTS, EQUAL), d.join(tpath, "operator"))
        seconds = t.get("tolerationSeconds")
        out.append(
            DeviceToleration(
                key=d.string(t, "key", tpath),
                operator=operator,
                value=d.string(t, "value", tpath),
                effect=d.string(t, "effect", tpath),
                seconds=d.integer(t, "tolerationSeconds", tpath) if seconds is not None else None,
            )
        )
    return tuple(out)
