"""Evicting a preemption victim through the Eviction API with a uid precondition, so
PodDisruptionBudgets hold: a budget that allows no disruption answers 429, and the caller (the gang
lifecycle, the Reservation controller) tries again on its next pass."""

from __future__ import annotations

from allocator.core.gang.victims import Candidate
from allocator.runtime.kube import KubeApi, Written
from apis.kinds import PODS

# Answers that are no failure of ours: the pod is gone (404), another pod has its name now (409),
# or a budget allows no disruption yet (429: said to the caller, not logged).
EXPECTED = (404, 409, 429)


async def evict(api: KubeApi, victim: Candidate) -> str:
    """Evict one pod (uid precondition); "" when done or already gone, else why not."""
    namespace, _, name = victim.key.partition("/")
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": victim.uid}},
    }
    path = PODS.path(name, namespace=namespace, subresource="eviction")
    got = await api.create(path, body, what=f"evicting {victim.key}", quiet=EXPECTED)
    if isinstance(got, Written) or got.status in (404, 409):  # gone, or another pod of that name now
        return ""
    if got.status == 429:
        return "a PodDisruptionBudget allows no disruption now"
    return str(got)
