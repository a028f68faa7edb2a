"""The one seam through which components steer the core's node decisions for a pod: which nodes
pass (a gang member to its plan's node, a room's owner to its room), how they rank, and whether a
bind may go ahead now. The extender's verbs ask it (filter, prioritize, bind), and so does anything
else that places pods with the same core.

Components that steer (gang scheduling, Reservations) implement `Steering` structurally without
importing each other or the extender; allocator/assembly.py hands the extender a `SteeringChain`
of those that are on, in order: the first that answers for a pod decides, the others leave it
alone. A process with none steers nothing (an empty chain answers None everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from allocator.runtime.coreadapter import FilterVerdicts, PodRequest, Rejection

JSON = dict[str, Any]


class Steering(Protocol):
    def filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        """The verdicts for a pod this component steers (None: not one of its pods)."""
        ...

    def scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        """The 0..10 scores of `names` for a pod it steers, given the core's (None: keep them)."""
        ...

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        """Why the pod must not be bound to `node` now (None: go ahead)."""
        ...


class SteeringChain:
    """Every steering component that is on, asked in order; the first answer stands."""

    def __init__(self, steerers: Sequence[Steering] = ()) -> None:
        self.steerers = tuple(steerers)

    def filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        for s in self.steerers:
            got = s.filter(pod, req, names)
            if got is not None:
                return got
        return None

    def scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        for s in self.steerers:
            got = s.scores(pod, req, names, scores)
            if got is not None:
                return got
        return None

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        for s in self.steerers:
            got = s.bind_refusal(req, node)
            if got is not None:
                return got
        return None


NO_STEERING = SteeringChain()  # a process with no steering component
