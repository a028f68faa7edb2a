"""Room kept on a GPU model for the pods held to it.

A gang whose pods accept only some GPU models (pretraining on H100 only) starts only while that
model has room for all its members at once. What fills the model first is pods that could run
anywhere, drawn there by its NVLink (the topology score). `GangRoom` learns, per GPU model, the
largest groups of pods held to it that need room at once: each gang of such pods (members ×
whole GPUs per member, from the pods the cluster placed) and each model-constrained shape of the
learned workload mix (a group of one). `keeps_room(state, count)` says whether taking `count`
whole GPUs on the node would still leave every such group room on the node's model: room is
counted in units of the member size, `whole_free // size` summed over the model's nodes (a table
total kept incrementally), so 2 × 8 GPUs needs two whole 8-GPU nodes and 4 × 4 GPUs four halves.

The scorer gives an unconstrained pod no topology credit where the room would go
(`FragmentationTerm.spoken_for`). The rule replaced a cut-off on model pressure alone (credit
withheld wherever the pressure was at least 0.7), which kept the gangs' start but took NVLink from
4- and 8-GPU pods at every moment, whether or not a gang would have needed the GPUs
(docs/simulator.md, gang wait).
"""

from __future__ import annotations

from collections import OrderedDict

from allocator.core.node.features import Feature
from allocator.core.node.gpu_features import GPU_MODEL, gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.node.table import NodeTable
from allocator.core.request.pod_request import PodRequest, required_gpu_models
from allocator.core.scoring.workload_mix import TaskShape

#: Gangs remembered (the most recently placed first): older gangs stop holding room.
GANGS_REMEMBERED = 64
#: The version tracks each model's room up to this many units above the largest group: a node
#: gives up at most count // size + 1 units, so nodes of up to 16 GPUs see every change that can
#: flip their answer, while a roomy model does not rescore the cluster on each placement.
_SLACK = 17

Needs = dict[str, dict[int, int]]  # model -> member size (whole GPUs) -> members needing room at once

_UNITS: dict[int, Feature] = {}


def units_feature(size: int) -> Feature:
    """A node's whole free GPUs in units of `size` (a NodeTable column, summed per model)."""
    hit = _UNITS.get(size)
    if hit is None:
        hit = _UNITS[size] = Feature(
            f"whole_units:{size}", lambda s: GPUSummary.of(s).whole_free // size, raw=True
        )
    return hit


class GangRoom:
    def __init__(self) -> None:
        # gang key -> (models, whole GPUs per member, member pod keys)
        self._gangs: OrderedDict[str, tuple[tuple[str, ...], int, set[str]]] = OrderedDict()
        self._needs: tuple[tuple[TaskShape, ...], Needs] | None = None  # (mix shapes, needs)

    def observe(self, req: PodRequest) -> None:
        """Count a placed pod of a gang held to some GPU models."""
        g = req.gpu
        if req.gang is None or g is None or not g.whole or g.count < 1:
            return
        models = required_gpu_models(req)
        if not models:
            return
        key = req.gang.key
        hit = self._gangs.get(key)
        if hit is None:
            hit = self._gangs[key] = (models, g.count, set())
            while len(self._gangs) > GANGS_REMEMBERED:
                self._gangs.popitem(last=False)
        else:
            self._gangs.move_to_end(key)
        members = hit[2]
        if req.key not in members:
            members.add(req.key)
            self._needs = None

    def needs(self, shapes: tuple[TaskShape, ...]) -> Needs:
        """The room each model keeps: the learned gangs, and a group of one for each constrained
        whole-GPU shape of the mix (`shapes`). Remembered until either changes."""
        if self._needs is not None and self._needs[0] is shapes:
            return self._needs[1]
        out: Needs = {}
        groups = [(models, size, len(members)) for models, size, members in self._gangs.values()]
        groups += [
            (s.gpu_models, s.gpu_count, 1)
            for s in shapes
            if s.gpu_models and s.gpu_count and s.gpu_pct >= 100
        ]
        for models, size, members in groups:
            for model in models:
                per = out.setdefault(model, {})
                per[size] = max(per.get(size, 0), members)
        self._needs = (shapes, out)
        return out

    @staticmethod
    def units(table: NodeTable, size: int) -> dict[str, int]:
        """Units of `size` whole free GPUs per model over the table's nodes."""
        return {m: v for m, v in table.totals(GPU_MODEL, units_feature(size)).items() if m}

    def key(self, table: NodeTable, needs: Needs) -> tuple[tuple[str, int, int], ...]:
        """Changes whenever `keeps_room` may answer differently for some node."""
        out = []
        for model, per in sorted(needs.items()):
            for size, members in sorted(per.items()):
                have = self.units(table, size).get(model, 0)
                out.append((model, size, min(have, members + _SLACK)))
        return tuple(out)

    def keeps_room(self, state: NodeState, count: int, needs: Needs) -> bool:
        """Whether every group held to the node's model still has room after `count` of the
        node's whole free GPUs are taken (True off a cluster table)."""
        table = state.table
        model = gpu_model(state)
        per = needs.get(model)
        if not per or not isinstance(table, NodeTable):
            return True
        free = GPUSummary.of(state).whole_free
        left = max(free - count, 0)
        for size, members in per.items():
            lost = free // size - left // size
            if self.units(table, size).get(model, 0) - lost < members:
                return False
        return True
