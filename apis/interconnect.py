"""How well two GPUs of one node talk: the pairwise interconnect matrix both halves share.

The agent derives its partition table from it, the allocator chooses GPU sets by it (see
docs/gpu-sets.md). A pair's value, best first:

1. NVLink bandwidth per direction: live links between the two × the per-link rate of the GPU's
   generation. Through an NVSwitch fabric every pair of the fabric gets the smaller GPU's fabric
   links (the Device CR lists every fabric peer with that GPU's links into the fabric). A link
   NVML reports down is not in the CR, so it counts as missing.
2. The host relation: same PCIe switch > same root complex > same NUMA node > same socket >
   across sockets (or unknown). Two GPUs joined by NVLink talk over NVLink, so for them the PCIe
   part stops at "same NUMA node": what is left is which CPU memory they sit next to.

Both parts fold into one integer (`bandwidth MB/s × 8 + tier`), so comparing two pairs compares
the bandwidth first and the host relation second (`values`). `pcie_values` are the same with the
whole PCIe relation of NVLink pairs kept (same switch > same root complex): between choices the
first values tie on, the pair behind one switch is better (NVIDIA's go-gpuallocator rates a
DGX-1 Pascal's single-link pair behind one switch above one across the host bridge), and the
GPU set chooser compares them only then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

# Host relation tiers, closest first.
SAME_SWITCH, SAME_ROOT, SAME_NUMA, SAME_SOCKET, CROSS_SOCKET = 4, 3, 2, 1, 0
TIER_NAMES = {
    SAME_SWITCH: "PIX",
    SAME_ROOT: "PHB",
    SAME_NUMA: "NODE",
    SAME_SOCKET: "SOCKET",
    CROSS_SOCKET: "SYS",
}
_TIER_SPAN = 8  # > the largest tier: the tier never spills into the bandwidth

# GB/s per NVLink per direction, by GPU model (NVIDIA's architecture white papers and data sheets):
# P100 NVLink 1 at 20 GB/s (4 links); V100 NVLink 2 at 25 (6); A100 NVLink 3 at 25 (12; A800 8);
# H100/H800/H200/H20 NVLink 4 at 25 (18; H800 8); B200/GB200 NVLink 5 at 50 (18). The GA102 boards
# (RTX A6000/A5000/A4500, A40, RTX 3090) run NVLink 3 bridges at 14.0625 GB/s per link.
NVLINK_GBPS_BY_MODEL = (
    ("P100", 20.0),
    ("V100", 25.0),
    ("A100", 25.0),
    ("A800", 25.0),
    ("H100", 25.0),
    ("H800", 25.0),
    ("H200", 25.0),
    ("H20", 25.0),
    ("B200", 50.0),
    ("B100", 50.0),
    ("RTX A6000", 14.0625),
    ("RTX-A6000", 14.0625),
    ("RTX A5000", 14.0625),
    ("RTX-A5000", 14.0625),
    ("RTX A4500", 14.0625),
    ("RTX-A4500", 14.0625),
    ("A40", 14.0625),
    ("RTX 3090", 14.0625),
    ("RTX-3090", 14.0625),
)
# By NVLink version, when the model is not in the list (NVML reports the version).
NVLINK_GBPS_BY_VERSION = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
DEFAULT_NVLINK_GBPS = 25.0  # one rate for every pair of a node: only the link count orders pairs


def nvlink_gbps(model: str, version: int = 0) -> float:
    """GB/s per link per direction for GPUs named `model` (NVML name or the Device label)."""
    known = known_nvlink_gbps(model, version)
    return DEFAULT_NVLINK_GBPS if known is None else known


def known_nvlink_gbps(model: str, version: int = 0) -> float | None:
    """As `nvlink_gbps`, but None when neither the model nor the NVLink version says."""
    for marker, gbps in NVLINK_GBPS_BY_MODEL:
        if marker in model:
            return gbps
    return NVLINK_GBPS_BY_VERSION.get(version)


@dataclass(frozen=True)
class GpuPlace:
    """Where one GPU sits: what the matrix needs of it ("" / -1 when unknown)."""

    minor: int
    numa: int = -1
    socket: int = -1
    pcie_root: str = ""
    pcie_switch: str = ""
    nvlinks: Mapping[int, int] = field(default_factory=dict)  # peer minor -> live NVLinks


def host_tier(a: GpuPlace, b: GpuPlace) -> int:
    if a.pcie_switch and a.pcie_switch == b.pcie_switch:
        return SAME_SWITCH
    if a.pcie_root and a.pcie_root == b.pcie_root:
        return SAME_ROOT
    if a.numa >= 0 and a.numa == b.numa:
        return SAME_NUMA
    if a.socket >= 0 and a.socket == b.socket:
        return SAME_SOCKET
    return CROSS_SOCKET


@dataclass(frozen=True)
class Interconnect:
    """The pairwise matrix of one node, over its GPUs in ascending minor order."""

    minors: tuple[int, ...]
    link_gbps: float
    links: tuple[tuple[int, ...], ...]  # [i][j]: live NVLinks between minors[i] and minors[j]
    tiers: tuple[tuple[int, ...], ...]  # [i][j]: host relation tier
    values: tuple[tuple[int, ...], ...]  # [i][j]: the folded pair value (0 on the diagonal)
    # [i][j]: the folded value with the PCIe relation of NVLink pairs kept (a tie-break)
    pcie_values: tuple[tuple[int, ...], ...]

    def index(self, minor: int) -> int:
        return self.minors.index(minor)

    def bandwidth_gbps(self, i: int, j: int) -> float:
        return self.links[i][j] * self.link_gbps

    @property
    def has_nvlink(self) -> bool:
        return any(any(row) for row in self.links)

    @property
    def uniform_nvlink(self) -> bool:
        """Every pair has the same NVLink count (none at all, or one NVSwitch fabric)."""
        n = len(self.minors)
        counts = {self.links[i][j] for i in range(n) for j in range(i + 1, n)}
        return len(counts) <= 1

    @property
    def pcie_breaks_ties(self) -> bool:
        """Some NVLink pair's PCIe relation is closer than its NUMA node (`pcie_values` differ)."""
        return self.pcie_values != self.values

    def signature(self) -> tuple:
        return (self.minors, self.values, self.pcie_values)


def pair_value(links: int, link_gbps: float, tier: int) -> int:
    return round(links * link_gbps * 1000) * _TIER_SPAN + tier


def split_value(value: int) -> tuple[int, int]:
    """A pair value's two parts: NVLink MB/s per direction, host relation tier."""
    return divmod(value, _TIER_SPAN)


def describe_value(value: int) -> str:
    """A pair value as people read it: "50 GB/s NODE" or "PIX"."""
    mbps, tier = split_value(value)
    return f"{mbps / 1000:g} GB/s {TIER_NAMES[tier]}" if mbps else TIER_NAMES[tier]


def build_interconnect(places: Iterable[GpuPlace], link_gbps: float) -> Interconnect:
    gpus = sorted(places, key=lambda p: p.minor)
    n = len(gpus)
    links = [[0] * n for _ in range(n)]
    tiers = [[0] * n for _ in range(n)]
    values = [[0] * n for _ in range(n)]
    pcie = [[0] * n for _ in range(n)]
    for i, a in enumerate(gpus):
        for j in range(i + 1, n):
            b = gpus[j]
            # A link counts when both ends report it (a link down shows on both sides).
            count = min(a.nvlinks.get(b.minor, 0), b.nvlinks.get(a.minor, 0))
            full = tier = host_tier(a, b)
            if count:
                tier = min(tier, SAME_NUMA)  # over NVLink the PCIe path hardly matters
            links[i][j] = links[j][i] = count
            tiers[i][j] = tiers[j][i] = tier
            values[i][j] = values[j][i] = pair_value(count, link_gbps, tier)
            pcie[i][j] = pcie[j][i] = pair_value(count, link_gbps, full)
    return Interconnect(
        minors=tuple(g.minor for g in gpus),
        link_gbps=link_gbps,
        links=tuple(tuple(r) for r in links),
        tiers=tuple(tuple(r) for r in tiers),
        values=tuple(tuple(r) for r in values),
        pcie_values=tuple(tuple(r) for r in pcie),
    )


EXACT_GROUPING = 8  # members up to which `best_groups` tries every grouping


def best_groups(ic: Interconnect, members: tuple[int, ...], size: int) -> list[tuple[int, ...]]:
    """`len(members) // size` disjoint groups of `size` GPUs from `members` (minors, in the order
    ties should follow) that maximise the weakest group's bottleneck pair, then the sum of all
    pair values; among equals the first in `members` order. Beyond EXACT_GROUPING members, or for
    single GPUs, consecutive runs of `members`."""
    count = len(members) // size
    if size < 2 or count == 0 or len(members) > EXACT_GROUPING:
        return [tuple(members[i * size : (i + 1) * size]) for i in range(count)]
    pos = {m: ic.index(m) for m in members}
    best: tuple[tuple[int, int], list[tuple[int, ...]]] | None = None
    for grouping in _groupings(list(members), size, count):
        low, total = 1 << 62, 0
        for group in grouping:
            vals = [ic.values[pos[a]][pos[b]] for a, b in combinations(group, 2)]
            low, total = min(low, min(vals)), total + sum(vals)
        if best is None or (low, total) > best[0]:
            best = ((low, total), grouping)
    assert best is not None
    return best[1]


def _groupings(members: list[int], size: int, count: int) -> list[list[tuple[int, ...]]]:
    """Every choice of `count` disjoint `size`-groups from `members`, earliest members first."""
    if count == 0:
        return [[]]
    out: list[list[tuple[int, ...]]] = []
    first, rest = members[0], members[1:]
    for others in combinations(rest, size - 1):
        group = (first, *others)
        remaining = [m for m in rest if m not in others]
        out.extend([group, *tail] for tail in _groupings(remaining, size, count - 1))
    if len(rest) >= count * size:  # the first member left out of every group
        out.extend(_groupings(rest, size, count))
    return out
