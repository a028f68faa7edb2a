"""The allocator's topology profile and what a gang or an RL job group asks of it.

`Topology` resolves the profile once per change of the Nodes (allocator/assembly.py tells it of
every Node event): `gang.topologyProfile` names a preset or `custom`, and `auto` detects the preset the
nodes' labels match (apis/topology_profile.py). `levels_for` turns a group's wish (apis/
topology_constraint.py, read from its PodGroup and its members' annotations) into the levels the
core's planner keeps to (allocator/core/gang/levels.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from allocator.core.gang.levels import Levels, levels_of
from allocator.core.gang.view import MemberPod
from allocator.runtime.cache.records import NodeFacts
from allocator.runtime.gang_settings import DEFAULT_TOPOLOGY_KEYS, GangSettings
from apis.errors import CodecError
from apis.topology_constraint import group_topology
from apis.topology_profile import Detected, TopologyProfile, resolve

log = logging.getLogger(__name__)
JSON = dict[str, Any]


class Wisher(Protocol):
    """A member as its group's topology wish reads it."""

    @property
    def key(self) -> str: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...


class NodeSource(Protocol):
    @property
    def nodes(self) -> Mapping[str, NodeFacts]: ...


class Topology:
    """The profile, resolved from the Nodes of `cache` and kept until `nodes_changed`; one per
    process, shared by every component that keeps groups to topology levels."""

    def __init__(self, settings: GangSettings, cache: NodeSource) -> None:
        self.settings = settings
        self.cache = cache
        self._detected: Detected | None = None
        self._said: TopologyProfile | None = None  # the profile last logged

    def nodes_changed(self) -> None:
        self._detected = None

    @property
    def detected(self) -> Detected:
        if self._detected is None:
            s = self.settings
            labels = (facts.labels for facts in self.cache.nodes.values())
            found = resolve(s.topology_profile, s.topology_keys, DEFAULT_TOPOLOGY_KEYS, labels)
            if found.profile != self._said:
                self._said = found.profile
                log.info("topology profile %s: levels %s", found.profile.name, ", ".join(found.profile.keys))
            self._detected = found
        return self._detected

    @property
    def profile(self) -> TopologyProfile:
        return self.detected.profile

    def levels_for(
        self,
        members: Iterable[MemberPod] | Iterable[Wisher],
        podgroup: Mapping[str, Any] | None = None,
        podgroup_key: str = "",
        *,
        native: bool | None = None,
    ) -> Levels | None:
        """The levels the group keeps to (None: none). `podgroup` is the object defining the gang
        as read (either PodGroup, a Workload); `native`: it is a Kubernetes PodGroup, whose own
        field states a level (None: told by its apiVersion, which a LIST's items may lack). Raises
        CodecError for a wish that does not decode, naming where it was read."""
        meta = (podgroup or {}).get("metadata") or {}
        own = podgroup if (_native(podgroup) if native is None else native) else None
        wish = group_topology(
            ((m.key, m.annotations) for m in members),
            meta.get("annotations") or {},
            podgroup_key,
            own,
        )
        return levels_of(self.profile, wish)

    def levels_or_problem(
        self,
        members: Iterable[MemberPod] | Iterable[Wisher],
        podgroup: Mapping[str, Any] | None = None,
        podgroup_key: str = "",
        *,
        native: bool | None = None,
    ) -> tuple[Levels | None, str]:
        try:
            return self.levels_for(members, podgroup, podgroup_key, native=native), ""
        except CodecError as exc:
            return None, f"topology: {exc}"


def _native(podgroup: Mapping[str, Any] | None) -> bool:
    """The Kubernetes PodGroup (scheduling.k8s.io, 1.36+), whose own field states a level."""
    if podgroup is None or podgroup.get("kind", "PodGroup") != "PodGroup":
        return False  # a Workload (1.35) states none
    return str(podgroup.get("apiVersion", "")).startswith("scheduling.k8s.io/")
