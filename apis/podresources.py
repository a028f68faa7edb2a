"""The amounts a pod or a Device may state, checked the way kube-apiserver checks a pod's resources,
so the CLI, the extender, the agent and the simulator refuse the same inputs with the same words:
no negative amounts, no magnitude beyond 2^63-1 (never silently capped), and whole numbers for
extended resources (`nvidia.com/gpu: 1.5` is refused, as Kubernetes refuses it, never rounded)."""

from __future__ import annotations

from typing import Any

from apis import resources as rn
from apis.errors import CodecError
from apis.quantity import NANO, Quantity

#: Device resources that are a percentage of one device: a Device may state 0 to 100 of each.
DEVICE_PERCENT_RESOURCES = (rn.GPU_CORE, rn.GPU_MEMORY_RATIO, rn.RDMA, rn.FPGA)


def is_extended_resource(name: str) -> bool:
    """Kubernetes' rule: a domain-prefixed name outside kubernetes.io (and not a quota's
    `requests.` name) is an extended resource, counted in whole units."""
    if "/" not in name or "kubernetes.io/" in name:
        return False
    return not name.startswith("requests.")


def resource_quantity(name: str, value: Any, where: str) -> Quantity:
    """A container's request or limit (or a pod overhead) for `name`."""
    qty = Quantity.parse(value, where, clamp=False)
    if qty.nanos < 0:
        raise CodecError(where, "must not be negative", value)
    if is_extended_resource(name) and qty.nanos % NANO:
        raise CodecError(
            where, f"must be a whole number: {name} is an extended resource, counted in whole units", value
        )
    return qty


def device_quantity(name: str, value: Any, where: str) -> Quantity:
    """A resource a Device CR advertises for one device."""
    qty = Quantity.parse(value, where, clamp=False)
    if qty.nanos < 0:
        raise CodecError(where, "must not be negative", value)
    if name in DEVICE_PERCENT_RESOURCES and qty.nanos > 100 * NANO:
        raise CodecError(where, f"{name} is a percentage of one device: 0 to 100", value)
    return qty
