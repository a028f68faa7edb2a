"""A prepared score component that says which nodes it cannot tell apart.

`NodeScorer` scores many nodes at once by evaluating its components once per group of nodes that
every component scores alike (`fine_grouped`). A component states its groups with a
`GroupedScore`: `group(table, slots)` gives one int per slot, equal for nodes on which `score`
is equal because it reads nothing else (usually a `NodeTable` feature column). Components
without it are evaluated per node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from allocator.core.node.features import Feature
    from allocator.core.node.state import NodeState
    from allocator.core.node.table import NodeTable

Group = Callable[["NodeTable", np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class GroupedScore:
    score: Callable[[NodeState], float | None]
    group: Group

    def __call__(self, state: NodeState) -> float | None:
        return self.score(state)


def by_feature(spec: Feature) -> Group:
    """Groups of nodes equal in one feature."""

    def group(table: NodeTable, slots: np.ndarray) -> np.ndarray:
        return table.feature(spec)[slots]

    return group
