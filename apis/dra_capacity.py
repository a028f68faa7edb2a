"""Consumable capacity (resource.k8s.io/v1, DRAConsumableCapacity: beta and on from Kubernetes 1.36;
with the gate off the API server drops these fields on write): a device published with
`allowMultipleAllocations` is handed out to several claims, each consuming part of its capacities.

A capacity's `requestPolicy` says what a request consumes: `default` when the request names the
capacity not, else the amount asked rounded up into `validRange` (to its `min`, then to a multiple
of its `step` above `min`) or to the next of its `validValues`; an amount beyond `max`, off the step
or not a valid value breaks the policy and the device cannot be given. `consumed` computes this the
way kube-scheduler's allocator does, so that both allocators write, and count, the same numbers.
Names are compared as written: a claim's `capacity.requests` key is the slice's capacity key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis import decode as d
from apis.quantity import Format, Quantity

SHARE_FIELDS = ("shareID", "consumedCapacity")  # of an allocation result
Amounts = tuple[tuple[str, Quantity], ...]  # (capacity name as written, amount), sorted


@dataclass(frozen=True, slots=True)
class DeviceCapacity:
    """One capacity of a device: its value and, when sharable, its request policy."""

    value: Quantity
    default: Quantity | None = None
    minimum: Quantity | None = None
    maximum: Quantity | None = None
    step: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()


def parse_capacity(raw: Any, path: str) -> DeviceCapacity:
    """A slice device's `capacity.<name>`."""
    data = d.struct(raw, path, ("value", "requestPolicy"))
    value = Quantity.parse(data.get("value"), d.join(path, "value"))
    policy = data.get("requestPolicy")
    if policy is None:
        return DeviceCapacity(value)
    ppath = d.join(path, "requestPolicy")
    p = d.struct(policy, ppath, ("default", "validRange", "validValues"))
    rpath = d.join(ppath, "validRange")
    r = d.struct(p.get("validRange") or {}, rpath, ("min", "max", "step"))
    vpath = d.join(ppath, "validValues")
    return DeviceCapacity(
        value,
        _quantity(p, "default", ppath),
        _quantity(r, "min", rpath),
        _quantity(r, "max", rpath),
        _quantity(r, "step", rpath),
        tuple(Quantity.parse(v, d.join(vpath, i)) for i, v in enumerate(d.array(p, "validValues", ppath))),
    )


def parse_amounts(data: Mapping[str, Any], name: str, path: str) -> Amounts:
    """A map of quantities (`capacity.requests` of a request, `consumedCapacity` of a result)."""
    mpath = d.join(path, name)
    return tuple(
        sorted(
            (k, Quantity.parse(v, d.join(mpath, k))) for k, v in d.obj(data.get(name) or {}, mpath).items()
        )
    )


def _quantity(data: Mapping[str, Any], name: str, path: str) -> Quantity | None:
    raw = data.get(name)
    return None if raw is None else Quantity.parse(raw, d.join(path, name))


def _round_up(asked: Quantity, cap: DeviceCapacity) -> Quantity:
    """What a request asking `asked` of the capacity consumes (before the policy check)."""
    if cap.minimum is not None:
        if asked < cap.minimum:
            return cap.minimum
        if cap.step is None:
            return asked
        low, step = cap.minimum.value(), cap.step.value()
        # Whole units, as kube-scheduler rounds them (Value() rounds up), in the binary format.
        return Quantity.of(low + step * -(-(asked.value() - low) // step), Format.BINARY_SI)
    if cap.valid_values:
        return next((v for v in cap.valid_values if not v < asked), asked)
    return asked


def _breaks(amount: Quantity, cap: DeviceCapacity) -> bool:
    """Whether a consumed amount breaks the capacity's request policy."""
    if cap.default is not None and amount == cap.default:
        return False
    if cap.minimum is not None or cap.maximum is not None or cap.step is not None:
        if cap.maximum is not None and cap.maximum < amount:
            return True
        if cap.step is not None and cap.step.value():
            low = cap.minimum.value() if cap.minimum is not None else 0
            return (amount.value() - low) % cap.step.value() != 0
        return False
    if cap.valid_values:
        return amount not in cap.valid_values
    return False


def consumed(
    asked: Mapping[str, Quantity], capacities: Mapping[str, DeviceCapacity]
) -> dict[str, Quantity] | None:
    """What a request asking `asked` consumes of each of a device's capacities; None when it asks
    for a capacity the device does not have or an amount its policy does not allow."""
    if any(name not in capacities for name in asked):
        return None
    out = {}
    for name, cap in capacities.items():
        got = asked.get(name)
        if got is None:
            amount = cap.default if cap.default is not None else cap.value
        else:
            amount = _round_up(got, cap)
            if _breaks(amount, cap):
                return None
        out[name] = amount
    return out


def fits(
    amounts: Mapping[str, Quantity], used: Mapping[str, Quantity], capacities: Mapping[str, DeviceCapacity]
) -> bool:
    """Whether `amounts` fit on top of `used` within each capacity's value."""
    zero = Quantity(0)
    return all(
        not cap.value < used.get(name, zero) + amounts.get(name, zero) for name, cap in capacities.items()
    )
