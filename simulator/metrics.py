"""The paper's metrics (../shared/traces/openb/FGD-PROTOCOL.md §1), from per-event logs.

After every pod event (placed or failed) the engine logs the cumulative arrived GPU demand, the
allocated GPU share and the cluster's fragmented GPU share. Curves are read at integer arrived
percentages x = 0..130: the mean over the events whose arrived % rounds to x, or, if none does,
over those rounding to x−1..x+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

X_MAX = 130
XS = np.arange(X_MAX + 1)


@dataclass
class EventLog:
    """Per-event values in GPU percent (100 = one GPU)."""

    capacity_pct: int
    arrived: np.ndarray  # cumulative GPU demand of all pods so far, placed or not
    allocated: np.ndarray  # allocated GPU share after the event
    fragmented: np.ndarray  # cluster fragmentation after the event (w.r.t. the target workload)

    @property
    def arrived_pct(self) -> np.ndarray:
        return self.arrived / self.capacity_pct * 100.0


def _round_half_up(values: np.ndarray) -> np.ndarray:
    return np.floor(values + 0.5).astype(np.int64)


def binned(log: EventLog, values: np.ndarray) -> np.ndarray:
    """``values`` (one per event) averaged per integer arrived % 0..130; NaN where no event
    lies within ±1 of x."""
    bins = _round_half_up(log.arrived_pct)
    out = np.full(len(XS), np.nan)
    if len(bins) == 0:
        return out
    # arrived is cumulative, so each bin is a contiguous run of events
    lo = np.searchsorted(bins, XS, side="left")
    hi = np.searchsorted(bins, XS, side="right")
    lo_wide = np.searchsorted(bins, XS - 1, side="left")
    hi_wide = np.searchsorted(bins, XS + 1, side="right")
    sums = np.concatenate(([0.0], np.cumsum(values)))
    for x in XS:
        a, b = (lo[x], hi[x]) if hi[x] > lo[x] else (lo_wide[x], hi_wide[x])
        if b > a:
            out[x] = (sums[b] - sums[a]) / (b - a)
    return out


@dataclass
class Curves:
    """Binned curves over arrived % 0..130, all in percent."""

    allocated: np.ndarray  # GPU allocation ratio, % of capacity
    frag_amount: np.ndarray  # fragmented GPU, % of capacity
    frag_ratio: np.ndarray  # fragmented GPU, % of idle GPU

    @property
    def unallocated(self) -> np.ndarray:
        return 100.0 - self.allocated


def curves(log: EventLog) -> Curves:
    cap = float(log.capacity_pct)
    idle = cap - log.allocated
    ratio = np.divide(log.fragmented, idle, out=np.zeros_like(log.fragmented), where=idle > 0) * 100.0
    return Curves(
        allocated=binned(log, log.allocated / cap * 100.0),
        frag_amount=binned(log, log.fragmented / cap * 100.0),
        frag_ratio=binned(log, ratio),
    )
