"""Events the agent posts (core/v1), shared by the device plugins (on pods) and dra mode (on the
Node)."""

from __future__ import annotations

import logging

from agent.kube import TRANSPORT_ERRORS, Kube, short_error
from apis.timestamps import format_time

log = logging.getLogger(__name__)

COMPONENT = "topoalloc-agent"


def post_event(kube: Kube, host: str, involved: dict[str, str], kind: str, reason: str, message: str) -> None:
    """Post a core/v1 Event (type `kind`) on `involved` (kind, name, uid, and namespace unless it is
    a Node: its Events go to "default", as kubelet's do); a failure is logged, never raised."""
    namespace = involved.get("namespace") or "default"
    name = involved.get("name", "")
    now = format_time()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        # A generateName may end in "-", not "." (kube-apiserver refuses that with 422).
        "metadata": {"generateName": f"{name}-", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", **involved},
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.create_event(namespace, body)
    except TRANSPORT_ERRORS as exc:
        log.warning(
            "event %s on %s %s/%s not posted: %s",
            reason,
            involved.get("kind"),
            namespace,
            name,
            short_error(exc),
        )
