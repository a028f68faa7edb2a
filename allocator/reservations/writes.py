"""The Reservation controller's writes: the reserved devices as the `device-allocated` annotation
(metadata, with a uid precondition so a Reservation deleted and created again under the same name
is never written), the status subresource (its body built by allocator/core/reservation/status.py),
and the PriorityClass lookups a template's priorityClassName needs. A refused write is logged (by
the client) and returns False: the controller writes again after a pause.
"""

from __future__ import annotations

import logging
from typing import Any

from allocator.runtime.kube import ApiError, KubeApi
from apis.kinds import PRIORITYCLASSES, RESERVATIONS

log = logging.getLogger(__name__)

JSON = dict[str, Any]


async def annotate(api: KubeApi, name: str, uid: str, annotations: dict[str, str | None]) -> bool:
    patch = {"metadata": {"uid": uid, "annotations": annotations}}
    return bool(await api.patch(RESERVATIONS.path(name), patch, what=f"annotating Reservation {name}"))


async def patch_status(api: KubeApi, name: str, uid: str, status: JSON) -> bool:
    patch = {"metadata": {"uid": uid}, "status": status}
    path = RESERVATIONS.path(name, subresource="status")
    return bool(await api.patch(path, patch, what=f"updating the status of Reservation {name}"))


async def priority_value(api: KubeApi, name: str) -> int | None:
    """The value of PriorityClass `name` (None when it does not exist or cannot be read)."""
    try:
        got = await api.raw("GET", PRIORITYCLASSES.path(name))
    except ApiError as exc:
        if not exc.not_found:
            log.warning("reading PriorityClass %s: %s", name, exc)
        return None
    value = got.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
