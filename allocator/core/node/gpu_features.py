"""The NodeTable columns GPUs contribute (features of a node's GPU summary) and the GPU model.

`allocate.fits` groups plain GPU requests by `FITS_WHOLE` or `FITS_SHARE` (the GPU handler's
`grouping`), the fragmentation term reads the per-GPU free share and the model, the topology
score the whole-card mask, and the simulator the free share as a 2-D column and the counts.
"""

from __future__ import annotations

from allocator.core.node.features import Feature, Rows, admission_key, inventory_class
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from apis import keys

gpus = GPUSummary.of


def gpu_model(state: NodeState) -> str:
    """Node label first (what kube-scheduler sees), the Device label otherwise."""
    model = state.labels.get(keys.GPU_MODEL)
    if model:
        return model
    return state.inventory.gpu_model if state.inventory is not None else ""


def _fits_whole(s: NodeState) -> tuple[int, int, int, str]:
    g = gpus(s)
    return inventory_class(s.inventory), g.whole_mask, g.used_mask, admission_key(s)


def _gpu_count(s: NodeState) -> int:
    return 0 if s.inventory is None else len(s.inventory.gpu_minors)


# What `fits` reads for whole GPUs without hints: the GPU bitmasks (see `GPUHandler.grouping`).
FITS_WHOLE = Feature("fits:whole", _fits_whole)
# ... and for one GPU with an equal share of compute and memory: the best GPU's free share.
FITS_SHARE = Feature(
    "fits:share", lambda s: (inventory_class(s.inventory), admission_key(s), gpus(s).max_share)
)
GPU_MODEL = Feature("gpu_model", gpu_model)
FREE_PCT = Feature("free_pct", lambda s: gpus(s).free_pct)
TOPOLOGY_WHOLE = Feature(
    "topology:whole", lambda s: None if s.inventory is None else (s.inventory.layout, gpus(s).whole_mask)
)
# Idle GPU of the node in percent of one GPU (the sum of the per-GPU free shares).
GPU_IDLE_PCT = Feature("gpu_idle_pct", lambda s: sum(gpus(s).free_pct), raw=True)
# The largest free share of one GPU in percent (0 without GPUs).
GPU_FREE_MAX = Feature("gpu_free_max", lambda s: max(gpus(s).free_pct, default=0), raw=True)
WHOLE_FREE = Feature("whole_free", lambda s: gpus(s).whole_free, raw=True)  # GPUs free for a whole card
GPU_COUNT = Feature("gpu_count", _gpu_count, raw=True)  # GPUs in the inventory, healthy or not
# Each GPU's free share in percent, GPUs in minor order (-1 past the node's last GPU).
FREE_PCT_ROWS = Rows("free_pct", lambda s: gpus(s).free_pct)
