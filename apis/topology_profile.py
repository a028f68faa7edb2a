"""Topology profiles: the levels above a node that a cluster's node labels describe.

A profile is an ordered list of levels, narrowest first (node < clique/accelerator < leaf < spine
< zone), each one node label whose value names a domain at that level: two nodes with the same
value share that domain. Real clusters get these labels from tools, so the presets are the label
sets those tools write (sources in docs/topology.md):

* `topograph`: NVIDIA Topograph since v1.0 (`accelerator.topograph.run/domain`,
  `fabric.topograph.run/tier-0/1/2`, tier 0 closest to the node), below it the GPU Operator's
  `nvidia.com/gpu.clique` (Topograph uses that label instead of its own when a node has it);
* `topograph-legacy`: Topograph before v1.0 (`network.topology.nvidia.com/accelerator`, `leaf`,
  `spine`, `core`), with `nvidia.com/gpu.clique` below them likewise;
* `aws`: EKS (`topology.k8s.aws/network-node-layer-3` the bottom layer, up to `-1` the top);
* `gke`: GKE (`cloud.google.com/gce-topology-host` < `-subblock` < `-block`);
* `generic`: `nvidia.com/gpu.clique` < `topoalloc.io/rack` < `topology.kubernetes.io/zone`, what
  the allocator used before profiles existed (`gang.topologyKeys`' default).

`detect` picks the preset the nodes' labels match best; `profile_named` a preset by name; `custom`
a profile from the keys a user lists. Pure and stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CLIQUE = "nvidia.com/gpu.clique"
RACK = "topoalloc.io/rack"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"  # the node level, for a wish that names it
AUTO = "auto"
CUSTOM = "custom"


@dataclass(frozen=True)
class Level:
    name: str  # what people call it (leaf, spine, rack...): shown, and accepted in annotations
    key: str  # the node label whose value names the domain


@dataclass(frozen=True)
class TopologyProfile:
    name: str
    levels: tuple[Level, ...]  # narrowest first

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(level.key for level in self.levels)

    def index(self, key_or_name: str) -> int | None:
        """The position of the level named by its label key or its name; None if unknown."""
        for i, level in enumerate(self.levels):
            if key_or_name in (level.key, level.name):
                return i
        return None

    def key_of(self, key_or_name: str) -> str:
        """The label key a wish means: a level's name becomes its key; anything else is taken as a
        label key as written."""
        i = self.index(key_or_name)
        return self.levels[i].key if i is not None else key_or_name

    def name_of(self, key: str) -> str:
        i = self.index(key)
        return self.levels[i].name if i is not None else key


def _profile(name: str, *levels: tuple[str, str]) -> TopologyProfile:
    return TopologyProfile(name, tuple(Level(n, k) for n, k in levels))


PRESETS: dict[str, TopologyProfile] = {
    p.name: p
    for p in (
        _profile(
            "topograph",
            ("clique", CLIQUE),
            ("accelerator", "accelerator.topograph.run/domain"),
            ("leaf", "fabric.topograph.run/tier-0"),
            ("spine", "fabric.topograph.run/tier-1"),
            ("core", "fabric.topograph.run/tier-2"),
        ),
        _profile(
            "topograph-legacy",
            ("clique", CLIQUE),
            ("accelerator", "network.topology.nvidia.com/accelerator"),
            ("leaf", "network.topology.nvidia.com/leaf"),
            ("spine", "network.topology.nvidia.com/spine"),
            ("core", "network.topology.nvidia.com/core"),
        ),
        _profile(
            "aws",
            ("layer-3", "topology.k8s.aws/network-node-layer-3"),
            ("layer-2", "topology.k8s.aws/network-node-layer-2"),
            ("layer-1", "topology.k8s.aws/network-node-layer-1"),
        ),
        _profile(
            "gke",
            ("host", "cloud.google.com/gce-topology-host"),
            ("subblock", "cloud.google.com/gce-topology-subblock"),
            ("block", "cloud.google.com/gce-topology-block"),
        ),
        _profile("generic", ("clique", CLIQUE), ("rack", RACK), ("zone", ZONE)),
    )
}
GENERIC = PRESETS["generic"]
PROFILE_NAMES = (AUTO, *PRESETS, CUSTOM)
# Labels that say nothing about which tool labelled a node: every cloud node has a zone, and the
# GPU Operator writes the clique whatever else runs.
_COMMON = frozenset({ZONE, CLIQUE})


def profile_named(name: str) -> TopologyProfile:
    """A preset by name; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown topology profile {name!r} (known: {', '.join(PROFILE_NAMES)})") from None


def custom(keys: Sequence[str]) -> TopologyProfile:
    """A profile from label keys listed narrowest first; a level's name is the key's last part."""
    return TopologyProfile(CUSTOM, tuple(Level(k.rsplit("/", 1)[-1], k) for k in keys))


@dataclass(frozen=True)
class Detected:
    profile: TopologyProfile
    nodes: int  # nodes carrying a label only this preset uses
    total: int  # nodes looked at


def detect(labels: Iterable[Mapping[str, str]]) -> Detected:
    """The preset most nodes carry a distinctive label of (one not every cloud or GPU node has);
    ties go to the first in PRESETS, and `generic` when no preset's labels are there at all."""
    distinctive = {name: [k for k in p.keys if k not in _COMMON] for name, p in PRESETS.items()}
    counts = dict.fromkeys(PRESETS, 0)
    total = 0
    for node in labels:
        total += 1
        for name, keys in distinctive.items():
            if any(k in node for k in keys):
                counts[name] += 1
    best = max(PRESETS, key=lambda n: counts[n])  # max keeps the first of equal counts
    if counts[best] == 0:
        return Detected(GENERIC, 0, total)
    return Detected(PRESETS[best], counts[best], total)


def resolve(
    setting: str, keys: Sequence[str], default_keys: Sequence[str], labels: Iterable[Mapping[str, str]]
) -> Detected:
    """The profile the allocator uses: `setting` names a preset, `custom` takes `keys`, `auto`
    detects from the nodes' labels unless `keys` differ from `default_keys` (a user who listed
    their own keys meant them)."""
    if setting == CUSTOM or (setting == AUTO and tuple(keys) != tuple(default_keys)):
        return Detected(custom(keys), 0, 0)
    if setting == AUTO:
        return detect(labels)
    return Detected(profile_named(setting), 0, 0)
