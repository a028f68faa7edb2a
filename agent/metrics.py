"""The agent's own Prometheus metrics (the process's default registry, which both HTTP listeners
serve): its node's devices by health, and the DRA plugin's claim prepares. The device plugins'
counters live beside the code that counts them (agent/deviceplugin/events.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from apis.device import Device

DEVICES = Gauge(
    "topoalloc_agent_devices",
    "Devices of this node in the Device the agent last built, by type and health (healthy, unhealthy)",
    ["type", "health"],
)
CLAIM_PREPARES = Counter(
    "topoalloc_agent_claim_prepares",
    "Claims kubelet asked the DRA plugin to prepare, by result (prepared, failed)",
    ["result"],
)
for _result in ("prepared", "failed"):  # at zero from the start: an alert on failures has a series
    CLAIM_PREPARES.labels(_result)


_published: set[tuple[str, str]] = set()  # the label sets DEVICES holds


def record_devices(device: Device) -> None:
    """The gauge after a pass: every type the node has, both health states (0 included), so that
    an alert on unhealthy devices sees a series even while none is."""
    counts: dict[tuple[str, str], int] = {}
    for d in device.devices:
        counts.setdefault((d.type, "healthy"), 0)
        counts.setdefault((d.type, "unhealthy"), 0)
        counts[(d.type, "healthy" if d.health else "unhealthy")] += 1
    for (dtype, health), n in counts.items():
        DEVICES.labels(dtype, health).set(n)
    # Types the node no longer has go after the new values are in: a scrape never sees none.
    for key in _published - counts.keys():
        DEVICES.remove(*key)
    _published.clear()
    _published.update(counts)
