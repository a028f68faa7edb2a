"""The node decision for one pod, as the extender's filter makes it and the placement controller
makes it ahead of kube-scheduler: the components' steering first (a gang member to its plan's node,
a room's owner to its room), else the core's verdicts over the nodes offered; then the one node
prioritize would rank first (the steering's scores, the core's ranking among their equals).

One function for both, so a pod placed at admission lands where the extender would have put it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest
from allocator.runtime.steering import Steering
from apis.extender import MAX_PRIORITY

JSON = dict[str, Any]
# At most this many distinct reasons in one note.
REASONS_SAID = 3


@dataclass(frozen=True)
class Decision:
    verdicts: FilterVerdicts
    result: str  # "ok", "no_fit", "no_devices", "invalid_request" (the extender's metric label)
    steered: bool  # a component decided the verdicts (it explains a refusal itself)


def verdicts_for(
    core: CoreAdapter, steering: Steering, pod: JSON, req: PodRequest, names: Sequence[str]
) -> Decision:
    """Which of `names` can take the pod, and why not the others."""
    steered = steering.filter(pod, req, names)
    if req.invalid is not None:
        verdicts = FilterVerdicts([], unresolvable=dict.fromkeys(names, req.invalid.message))
        verdicts.codes[req.invalid.code] = len(names)
        return Decision(verdicts, "invalid_request", steered is not None)
    if steered is None and not req.wants_devices:
        return Decision(FilterVerdicts(list(names)), "no_devices", False)
    # Else the columns' answer, no per-node Python (docs/service.md, performance).
    verdicts = steered if steered is not None else core.filter_nodes(req, names)
    return Decision(verdicts, "ok" if verdicts.passed else "no_fit", steered is not None)


def best_of(core: CoreAdapter, steering: Steering, pod: JSON, req: PodRequest, passed: Sequence[str]) -> str:
    """The node prioritize would rank first among `passed` (which must not be empty)."""
    if len(passed) == 1:
        return passed[0]
    scores = core.score_nodes(req, passed)
    steered = steering.scores(pod, req, passed, scores)
    if steered is not None:
        scores = np.asarray(steered, np.int64) * (MAX_PRIORITY + 1) + scores
    return passed[int(np.argmax(scores))]


def why_not(core: CoreAdapter, req: PodRequest, rejected: Mapping[str, str]) -> str:
    """Why no node takes the pod, kube-scheduler's way: the reasons by count (the stable messages
    kube-scheduler aggregates), each with what one such node has left (the rejection's detail, which
    a verdict never carries)."""
    counts = Counter(rejected.values())
    example: dict[str, str] = {}
    for name, msg in rejected.items():
        example.setdefault(msg, name)
    parts = []
    for msg, n in counts.most_common(REASONS_SAID):
        node = example[msg]
        rejection = core.node_rejection(req, node)
        detail = rejection.detail if rejection is not None and rejection.message == msg else ""
        parts.append(f"{n} {msg}" + (f" (e.g. {node}: {detail})" if detail else ""))
    more = len(counts) - REASONS_SAID
    return f"0/{len(rejected)} nodes can host the pod's devices: {'; '.join(parts)}" + (
        f"; and {more} other reasons" if more > 0 else ""
    )
