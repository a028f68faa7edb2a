"""Evicting a preemption victim through the Eviction API with a uid precondition, so
PodDisruptionBudgets hold: a budget that allows no disruption answers 429, and the caller (the gang
lifecycle, the Reservation controller) tries again on its next pass."""

from __future__ import annotations

import logging

from allocator.core.gang.victims import Candidate
from allocator.runtime.kube import ApiError, KubeApi

log = logging.getLogger(__name__)


async def evict(api: KubeApi, victim: Candidate) -> str:
    """Evict one pod (uid precondition); "" when done or already gone, else why not."""
    namespace, _, name = victim.key.partition("/")
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": victim.uid}},
    }
    try:
        await api.raw("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
    except ApiError as exc:
        if exc.status in (404, 409):  # gone, or another pod of that name now
            return ""
        if exc.status == 429:
            return "a PodDisruptionBudget allows no disruption now"
        log.warning("evicting %s: %s", victim.key, exc)
        return str(exc)
    return ""
