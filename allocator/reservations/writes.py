"""The Reservation controller's writes: the reserved devices as the `device-allocated` annotation
(metadata, with a uid precondition so a Reservation deleted and created again under the same name
is never written), the status subresource (its body built by allocator/core/reservation/status.py),
and the PriorityClass lookups a template's priorityClassName needs. A refused write is logged and
returns False: the controller writes again after a pause.
"""

from __future__ import annotations

import logging
from typing import Any

from allocator.runtime.kube import MERGE_PATCH, ApiError, KubeApi
from apis import reservation as rv

log = logging.getLogger(__name__)

JSON = dict[str, Any]


def path(name: str) -> str:
    return f"/apis/{rv.GROUP}/{rv.VERSION}/{rv.PLURAL}/{name}"


async def annotate(api: KubeApi, name: str, uid: str, annotations: dict[str, str | None]) -> bool:
    patch = {"metadata": {"uid": uid, "annotations": annotations}}
    try:
        await api.raw("PATCH", path(name), body=patch, content_type=MERGE_PATCH)
    except ApiError as exc:
        log.warning("annotating Reservation %s: %s", name, exc)
        return False
    return True


async def patch_status(api: KubeApi, name: str, uid: str, status: JSON) -> bool:
    patch = {"metadata": {"uid": uid}, "status": status}
    try:
        await api.raw("PATCH", path(name) + "/status", body=patch, content_type=MERGE_PATCH)
    except ApiError as exc:
        log.warning("updating the status of Reservation %s: %s", name, exc)
        return False
    return True


async def priority_value(api: KubeApi, name: str) -> int | None:
    """The value of PriorityClass `name` (None when it does not exist or cannot be read)."""
    try:
        got = await api.raw("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    except ApiError as exc:
        if not exc.not_found:
            log.warning("reading PriorityClass %s: %s", name, exc)
        return None
    value = got.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
