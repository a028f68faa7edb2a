"""Touching a pending pod so kube-scheduler tries it again now.

kube-scheduler keeps a pod it could not place in its unschedulable queue until a cluster event it
watches might help (a Node added, a bound pod deleted...) or five minutes pass. A pod the extender
refused was rejected by no plugin of its own, so any update of the pod that changes more than its
status moves it out of that queue at once (to the active queue, or to the backoff queue while its
backoff since the last attempt runs). Room freed by something kube-scheduler does not watch (a
Reservation given back, a gang's plan) needs such an update: one annotation, `topoalloc.io/nudged`,
saying why and when (a value that changes with every nudge, so the write is never a no-op).
"""

from __future__ import annotations

import logging

from allocator.core.actions import ObjectRef
from allocator.runtime.kube import ApiError, KubeApi
from apis import keys
from apis.timestamps import micro_time

log = logging.getLogger(__name__)


def nudge_note(why: str, now: float) -> str:
    return f"{why} at {micro_time(now)}"


async def nudge(api: KubeApi, pod: ObjectRef, why: str, now: float) -> bool:
    """Annotate `pod` (uid precondition: never a re-created pod of the name). False when refused."""
    patch = {"metadata": {"uid": pod.uid, "annotations": {keys.NUDGED: nudge_note(why, now)}}}
    try:
        await api.patch_pod(pod.namespace, pod.name, patch)
    except ApiError as exc:
        if not exc.not_found:
            log.warning("nudging %s: %s", pod.key, exc)
        return False
    return True
