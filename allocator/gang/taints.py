"""Which nodes kube-scheduler would let a pod onto at all: taints and cordons (the TaintToleration
and NodeUnschedulable plugins). The planner checks devices, cpu, memory, pod slots and node
affinity itself; without this a plan could name a node kube-scheduler then refuses, and the member
would wait for `bindTimeout` before its gang is planned again."""

from __future__ import annotations

from apis.tolerations import BLOCKING, UNSCHEDULABLE, admits, tolerates, tolerations_of

__all__ = ["BLOCKING", "UNSCHEDULABLE", "admits", "tolerates", "tolerations_of"]
