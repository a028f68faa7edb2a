"""Which nodes kube-scheduler would let a pod onto at all: taints and cordons (the TaintToleration
and NodeUnschedulable plugins). The gang planner and the claims controller check devices, cpu,
memory, pod slots and node affinity themselves; without this a gang plan, or a claim's allocation,
could name a node kube-scheduler then refuses (a member waiting for `bindTimeout` before its gang
is planned again, a claim allocated again elsewhere)."""

from __future__ import annotations

from apis.tolerations import BLOCKING, UNSCHEDULABLE, admits, tolerates, tolerations_of

__all__ = ["BLOCKING", "UNSCHEDULABLE", "admits", "tolerates", "tolerations_of"]
