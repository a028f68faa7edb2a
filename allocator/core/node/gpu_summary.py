"""What the allocator and the scorers read of a node's GPUs in O(1): GPUs in use, GPUs that can
take a whole card, the free and total memory share, the best free share of one GPU, and each
GPU's free share in percent. Derived values (feasible-GPU masks per request shape, the largest
free set per scope level) are computed on first use and dropped when a GPU changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.core.node.inventory import NodeInventory
from allocator.core.node.summary import Summarised, all_zero, fits_free
from allocator.core.request.pod_request import WHOLE_GPU, Resources
from apis import resources as rn

GPU = rn.DeviceType.GPU
_SHARES = (rn.GPU_CORE, rn.GPU_MEMORY_RATIO)


class GPUSummary:
    """A node's GPU summaries (a `DeviceSummary`), made for one inventory."""

    __slots__ = (
        "_derived",
        "_free",
        "_pct",
        "_shares",
        "free_ratio",
        "inventory",
        "max_share",
        "total_ratio",
        "used_mask",
        "whole_mask",
    )

    def __init__(self, inventory: NodeInventory | None) -> None:
        self.inventory = inventory
        self.used_mask = 0  # GPUs with anything taken
        self.whole_mask = 0  # GPUs that can take a whole card
        # Free and total GPU memory share over healthy GPUs, in percent of one GPU (800 = 8 GPUs).
        self.free_ratio = 0
        self.total_ratio = (
            0 if inventory is None else inventory.type_totals.get(GPU, {}).get(rn.GPU_MEMORY_RATIO, 0)
        )
        # The largest min(free gpu-core, free gpu-memory-ratio) of any healthy GPU (-1: none).
        self.max_share = -1
        self._shares: dict[int, int] = {}
        self._pct: dict[int, int] = {}  # minor -> free share in percent (`free_pct`)
        self._free: dict[int, dict[str, int]] = {}  # minor -> free resources (the node's own dicts)
        self._derived: dict[Any, Any] = {}

    @staticmethod
    def of(state: Summarised) -> GPUSummary:
        """The GPU summary of a node (every NodeState has one, empty without GPUs)."""
        return state.summaries[GPU]  # type: ignore[no-any-return]

    def update(
        self,
        minor: int,
        total: Mapping[str, int],
        used: Mapping[str, int],
        free: dict[str, int],
        old: Mapping[str, int] | None,
    ) -> None:
        bit = 1 << minor
        if old is not None and total:
            self.free_ratio -= old.get(rn.GPU_MEMORY_RATIO, 0)
        if total:
            self.free_ratio += free.get(rn.GPU_MEMORY_RATIO, 0)
        if any(used.values()):
            self.used_mask |= bit
        else:
            self.used_mask &= ~bit
        if total and not all_zero(free) and fits_free(WHOLE_GPU, free):
            self.whole_mask |= bit
        else:
            self.whole_mask &= ~bit
        shares = [free[n] for n in _SHARES if n in free]
        if total and shares and not all_zero(free):
            self._shares[minor] = min(shares)
        else:
            self._shares.pop(minor, None)
        self.max_share = max(self._shares.values(), default=-1)
        pct = [free.get(n, 0) * 100 // total[n] for n in _SHARES if total.get(n)]
        self._pct[minor] = max(0, min(100, min(pct))) if pct else 0
        self._free[minor] = free
        if self._derived:
            self._derived = {}

    def forget(self) -> None:
        self._derived = {}

    # -- reads ---------------------------------------------------------------------------------------
    @property
    def whole_free(self) -> int:
        """GPUs that can take a whole card."""
        return self.whole_mask.bit_count()

    @property
    def healthy_count(self) -> int:
        return 0 if self.inventory is None else self.inventory.gpu_healthy_mask.bit_count()

    @property
    def free_pct(self) -> tuple[int, ...]:
        """Free share of each GPU in percent (0..100), GPUs in minor order; an unhealthy GPU has 0.
        A GPU's share is the smaller of its free compute and free memory share, since a shared
        task needs both."""
        hit = self._derived.get("free_pct")
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        inv = self.inventory
        pct = self._pct
        out = () if inv is None else tuple(pct.get(m, 0) for m in inv.gpu_minors)
        self._derived["free_pct"] = out
        return out

    def fit_mask(self, per_gpu: Resources) -> int:
        """GPUs that can take `per_gpu` now: healthy, not exhausted, and `per_gpu <= free`."""
        if per_gpu == WHOLE_GPU:
            return self.whole_mask
        key = ("fit", per_gpu)
        hit = self._derived.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        mask = 0
        inv = self.inventory
        if inv is not None:
            frees = self._free
            healthy = inv.gpu_healthy_mask
            for minor in inv.gpu_minors:
                free = frees.get(minor)
                if healthy >> minor & 1 and free and not all_zero(free) and fits_free(per_gpu, free):
                    mask |= 1 << minor
        self._derived[key] = mask
        return mask

    def largest_free_set(self, level: int, per_gpu: Resources = WHOLE_GPU) -> tuple[int, str]:
        """The most GPUs that can take `per_gpu` inside one scope of `level` (inventory.LEVEL_*)
        and that scope's name; (0, "") without such scopes."""
        key = ("largest", level, per_gpu)
        hit = self._derived.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        best, name = 0, ""
        inv = self.inventory
        if inv is not None:
            feasible = self.fit_mask(per_gpu)
            for scope in inv.scopes_by_level.get(level, ()):
                n = (feasible & scope.mask).bit_count()
                if n > best:
                    best, name = n, scope.name
        self._derived[key] = (best, name)
        return best, name
