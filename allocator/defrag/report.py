"""A defragmentation plan as the dry run's report ConfigMap (and `topoalloc defrag -o json`) shows it."""

from __future__ import annotations

from typing import Any

from allocator.core.defrag.plan import DefragPlan

JSON = dict[str, Any]


def report(plan: DefragPlan, now: float) -> JSON:
    return {
        "time": now,
        "largestFreeBlock": {"before": plan.largest_before, "after": plan.largest_after},
        "moves": [
            {
                "pod": m.key,
                "from": m.source,
                "to": m.target,
                "gpus": m.gpus,
                "devices": m.allocation.minors("gpu"),
                "gpuHoursLost": round(m.gpu_hours, 3),
                "unblocks": m.unblocks,
            }
            for m in plan.moves
        ],
        "unblocked": [
            {"waiter": u.waiter, "moves": list(u.moves), "cheapest": u.exact} for u in plan.unblocked
        ],
        "fitWithoutMoves": list(plan.fits),
        "stuck": [{"waiter": w, "why": why} for w, why in plan.stuck],
    }
