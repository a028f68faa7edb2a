"""The device types that keep a node summary, each with its summary class (one module per type).

A new device type whose allocator or scorers need node summaries adds its class here; `NodeState`
does not change. The allocation half of a type lives in `devices/registry.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import NodeInventory
from allocator.core.node.summary import DeviceSummary, Summarised
from apis import resources as rn

SUMMARIES: Mapping[str, Callable[[NodeInventory | None], DeviceSummary]] = {
    rn.DeviceType.GPU: GPUSummary,
}


def whole_gpus_free(state: Summarised) -> int:
    """`NodeState.whole_gpus_free`, kept for allocator/gang until it reads
    `GPUSummary.of(state).whole_free` (issue 25: the branches are merged separately)."""
    return GPUSummary.of(state).whole_free
