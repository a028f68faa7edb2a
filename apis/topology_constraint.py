"""Which topology level a gang or an RL job group keeps to, as its objects say it.

Three places say it, read in this order (the first that says anything wins):

1. the native PodGroup (`scheduling.k8s.io/v1alpha2`, Kubernetes 1.36 alpha, gate
   `TopologyAwareWorkloadScheduling`): `spec.schedulingConstraints.topology[].key`, at most one
   item (kube-apiserver refuses a second), a node label key every pod must share a value of:
   a *required* level;
2. topoalloc's annotations, on a scheduler-plugins PodGroup or on the pods:
   `topoalloc.io/required-topology` or `topoalloc.io/preferred-topology`, a node label key or a
   level's name in the allocator's topology profile (`rack`, `leaf`, ...);
3. Kueue's pod-set annotations on the pods, for users coming from Kueue:
   `kueue.x-k8s.io/podset-required-topology` / `-preferred-topology` (a node label key);
   `kueue.x-k8s.io/podset-unconstrained-topology` asks for nothing.

*Required*: every member in one domain of that level, or none placed. *Preferred*: one domain of
the narrowest level that holds them all, else as few domains as possible. Either annotation pair
states one of the two, never both (as Kueue refuses); a malformed value is a CodecError naming the
annotation, so the gang waits with that reason instead of being placed against the user's wish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apis import keys
from apis.errors import CodecError
from apis.selector import check_key

NATIVE_FIELD = "spec.schedulingConstraints.topology"


@dataclass(frozen=True)
class TopologyWish:
    required: str = ""  # a node label key, or a level's name
    preferred: str = ""
    source: str = ""  # where it was read, for messages ("PodGroup team-a/x", "pod team-a/w0", ...)

    @property
    def level(self) -> str:
        return self.required or self.preferred

    @property
    def mode(self) -> str:
        return "required" if self.required else "preferred" if self.preferred else ""


def native_topology(podgroup: Mapping[str, Any], where: str = "") -> TopologyWish | None:
    """The required level of a native PodGroup (scheduling.k8s.io/v1alpha2), None when it sets none."""
    spec = podgroup.get("spec") or {}
    constraints = spec.get("schedulingConstraints") if isinstance(spec, Mapping) else None
    items = constraints.get("topology") if isinstance(constraints, Mapping) else None
    if not items:
        return None
    if not isinstance(items, list) or not isinstance(items[0], Mapping):
        raise CodecError(NATIVE_FIELD, "expected a list of {key: ...}", items)
    key = items[0].get("key")
    if not isinstance(key, str) or not key:
        raise CodecError(f"{NATIVE_FIELD}[0].key", "expected a node label key", key)
    check_key(key, f"{NATIVE_FIELD}[0].key")
    return TopologyWish(required=key, source=where)


def _pair(annotations: Mapping[str, str], required: str, preferred: str, where: str) -> TopologyWish | None:
    req, pref = annotations.get(required), annotations.get(preferred)
    if req is not None and pref is not None:
        raise CodecError(required, f"give one of {required} and {preferred}, not both", req)
    name, value = (required, req) if req is not None else (preferred, pref)
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise CodecError(name, "expected a node label key or a topology level's name", value)
    check_key(value, name)
    return TopologyWish(value if req is not None else "", value if pref is not None else "", where)


def annotated_topology(annotations: Mapping[str, str], where: str = "") -> TopologyWish | None:
    """What one object's annotations ask for: topoalloc's, else Kueue's (an empty wish for Kueue's
    unconstrained one); None when they say nothing."""
    ours = _pair(annotations, keys.REQUIRED_TOPOLOGY, keys.PREFERRED_TOPOLOGY, where)
    if ours is not None:
        return ours
    kueue = _pair(annotations, keys.KUEUE_REQUIRED_TOPOLOGY, keys.KUEUE_PREFERRED_TOPOLOGY, where)
    if kueue is not None:
        return kueue
    if keys.KUEUE_UNCONSTRAINED_TOPOLOGY in annotations:
        return TopologyWish(source=where)
    return None


def group_topology(
    members: Iterable[tuple[str, Mapping[str, str]]],
    podgroup_annotations: Mapping[str, str] | None = None,
    podgroup: str = "",
    native: Mapping[str, Any] | None = None,
) -> TopologyWish | None:
    """A gang's or a job group's wish: the native PodGroup's, else its PodGroup's annotations,
    else the first member (`(key, annotations)`, oldest first) that states one. A member whose
    annotation is malformed raises, naming it, even when another member states a good one."""
    if native is not None:
        found = native_topology(native, f"PodGroup {podgroup}")
        if found is not None:
            return found
    if podgroup_annotations:
        found = annotated_topology(podgroup_annotations, f"PodGroup {podgroup}")
        if found is not None:
            return found
    first: TopologyWish | None = None
    for key, notes in members:
        try:
            found = annotated_topology(notes, f"pod {key}")
        except CodecError as exc:
            raise CodecError(f"pod {key}: {exc.field}", exc.problem, exc.value) from None
        if first is None and found is not None:
            first = found
    return first
