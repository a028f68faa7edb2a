"""ResourceSlices (resource.k8s.io/v1) as the allocator reads them: which devices a node's pool
publishes, with their attributes and capacities by fully-qualified name.

A pool is the set of slices of one driver with one pool name; only the slices of its highest
generation count, and the pool is complete once `resourceSliceCount` of them are seen (kube-scheduler
reads pools the same way). Attribute names without a domain belong to the driver's domain, so
`type` on a topoalloc.io device is read as `topoalloc.io/type`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apis import decode as d
from apis.dra_capacity import DeviceCapacity, parse_capacity
from apis.dra_taints import DeviceTaint, parse_taints
from apis.errors import CodecError

_VALUE_KINDS = ("int", "bool", "string", "version")


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    attributes: tuple[tuple[str, str | int | bool], ...]  # (qualified name, value), sorted
    capacity: tuple[tuple[str, int], ...]  # (qualified name, milli-units), sorted
    taints: tuple[DeviceTaint, ...] = ()
    # allowMultipleAllocations: several claims may each consume part of the device's capacities,
    # by name as written in the slice (apis/dra_capacity.py).
    shared: bool = False
    capacities: tuple[tuple[str, DeviceCapacity], ...] = ()


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str  # spec.nodeName ("" for slices of several nodes)
    devices: tuple[SliceDevice, ...]

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> ResourceSlice:
        data = d.struct(value, path, ("metadata", "spec"))
        mpath, spath = d.join(path, "metadata"), d.join(path, "spec")
        meta = d.obj(data.get("metadata") or {}, mpath)
        spec = d.struct(data.get("spec") or {}, spath, ("driver", "pool", "nodeName", "devices"))
        driver = d.string(spec, "driver", spath, required=True)
        ppath = d.join(spath, "pool")
        pool = d.struct(spec.get("pool") or {}, ppath, ("name", "generation", "resourceSliceCount"))
        devices = tuple(
            _device(item, driver, d.join(d.join(spath, "devices"), i))
            for i, item in enumerate(d.array(spec, "devices", spath))
        )
        return cls(
            name=d.string(meta, "name", mpath, required=True),
            driver=driver,
            pool=d.string(pool, "name", ppath, required=True),
            generation=d.integer(pool, "generation", ppath, minimum=0, maximum=2**63 - 1) or 0,
            slice_count=d.integer(pool, "resourceSliceCount", ppath, default=1, minimum=1) or 1,
            node=d.string(spec, "nodeName", spath),
            devices=devices,
        )


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _device(value: Any, driver: str, path: str) -> SliceDevice:
    data = d.struct(value, path, ("name", "attributes", "capacity", "taints", "allowMultipleAllocations"))
    apath, cpath = d.join(path, "attributes"), d.join(path, "capacity")
    attributes = []
    for name, raw in d.obj(data.get("attributes") or {}, apath).items():
        vpath = d.join(apath, name)
        typed = {k: v for k, v in d.obj(raw, vpath).items() if k in _VALUE_KINDS}
        if len(typed) != 1:
            raise CodecError(vpath, "needs exactly one of int, bool, string, version", raw)
        kind, val = next(iter(typed.items()))
        ok = (
            isinstance(val, bool)
            if kind == "bool"
            else (
                isinstance(val, int) and not isinstance(val, bool) if kind == "int" else isinstance(val, str)
            )
        )
        if not ok:
            raise CodecError(d.join(vpath, kind), f"expected a value of type {kind}", val)
        attributes.append((qualify(name, driver), val))
    capacities = sorted(
        (name, parse_capacity(raw, d.join(cpath, name)))
        for name, raw in d.obj(data.get("capacity") or {}, cpath).items()
    )
    return SliceDevice(
        d.string(data, "name", path, required=True),
        tuple(sorted(attributes)),
        tuple(sorted((qualify(name, driver), cap.value.milli_value()) for name, cap in capacities)),
        parse_taints(data, path),
        d.boolean(data, "allowMultipleAllocations", path),
        tuple(capacities),
    )
