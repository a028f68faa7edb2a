"""ResourceClaims, ResourceClaimTemplates and DeviceClasses (resource.k8s.io/v1) as the allocator
reads them, and the allocation it writes.

Each `*.from_dict` raises CodecError naming the field (`spec.devices.requests[2].exactly.count`) and
the bad value; the API server has validated what it stores, so an error here means a file handed to
the CLI, or a shape this code does not know. Only what allocation reads is kept: request names,
classes, CEL selector expressions, counts and modes, constraints, the drivers of opaque configs,
and a claim's allocation and reservations.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any, Final

from apis import decode as d
from apis import dra
from apis.dra_capacity import SHARE_FIELDS, Amounts, parse_amounts
from apis.dra_taints import DeviceToleration, parse_tolerations
from apis.errors import CodecError
from apis.timestamps import format_time

EXACT_COUNT: Final = "ExactCount"
ALL: Final = "All"
MODES: Final = (EXACT_COUNT, ALL)
MAX_COUNT: Final = 128  # what one request can ask for: every device of a full slice
NODE_NAME_FIELD: Final = "metadata.name"
# On a claim the resourceclaim controller generated: the pod's name for it (spec.resourceClaims[].name).
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """`exactly` of a request, or one `firstAvailable` subrequest."""

    device_class: str
    selectors: tuple[str, ...] = ()  # CEL expressions, ANDed
    mode: str = EXACT_COUNT
    count: int = 1
    admin_access: bool = False
    capacity: Amounts = ()  # capacity.requests (consumable capacity)
    tolerations: tuple[DeviceToleration, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[tuple[str, ExactRequest], ...] = ()  # (subrequest name, request)


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request of the claim
    match_attribute: str = ""
    distinct_attribute: str = ""


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    requests: tuple[str, ...]
    driver: str


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[OpaqueConfig, ...] = ()

    def request(self, name: str) -> DeviceRequest | None:
        return next((r for r in self.requests if r.name == name), None)

    @property
    def classes(self) -> frozenset[str]:
        """Every DeviceClass a request or subrequest names."""
        out = set()
        for r in self.requests:
            if r.exactly is not None:
                out.add(r.exactly.device_class)
            out.update(sub.device_class for _, sub in r.first_available)
        return frozenset(out)


@dataclass(frozen=True, slots=True)
class DeviceResult:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    # The request's tolerations, kept with the result as kube-scheduler keeps them: the eviction
    # of a NoExecute taint reads them there.
    tolerations: tuple[DeviceToleration, ...] = ()
    # Of a device with allowMultipleAllocations: the share's id and what it consumes.
    share_id: str = ""
    consumed: Amounts = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        if self.share_id:
            out["shareID"] = self.share_id
        if self.consumed:
            out["consumedCapacity"] = {name: str(q) for name, q in self.consumed}
        return out


@dataclass(frozen=True, slots=True)
class Allocation:
    results: tuple[DeviceResult, ...]
    node: str = ""  # the one node of a node-local allocation's selector ("" for any other selector)


@dataclass(frozen=True, slots=True)
class Consumer:
    resource: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    annotations: tuple[tuple[str, str], ...] = ()
    spec: ClaimSpec = ClaimSpec()
    allocation: Allocation | None = None
    reserved_for: tuple[Consumer, ...] = ()
    deleting: bool = False
    owner_pod: str = ""  # the uid of the Pod that controls it (a claim made from a template)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def annotation(self, key: str) -> str:
        return dict(self.annotations).get(key, "")

    @property
    def opted_out(self) -> bool:
        return opted_out(dict(self.annotations))

    @property
    def allocated_by_us(self) -> bool:
        return (
            self.allocation is not None and self.annotation(dra.ALLOCATED_BY_ANNOTATION) == dra.ALLOCATED_BY
        )

    @classmethod
    def from_dict(cls, value: Any, path: str = "", *, earlier: ResourceClaim | None = None) -> ResourceClaim:
        """`earlier`: this claim as last decoded; its spec is kept for the same uid (immutable)."""
        data = d.struct(value, path, ("metadata", "spec", "status"))
        meta = _metadata(data, path)
        mpath, spath = d.join(path, "metadata"), d.join(path, "spec")
        uid = d.string(meta, "uid", mpath)
        spec = d.struct(data.get("spec") or {}, spath, ("devices",))
        kept = earlier.spec if earlier is not None and uid and earlier.uid == uid else None
        status = _status(data.get("status"), d.join(path, "status"))
        owner = ""
        for i, ref in enumerate(d.array(meta, "ownerReferences", mpath)):
            rpath = d.join(d.join(mpath, "ownerReferences"), i)
            r = d.struct(ref, rpath, ("apiVersion", "kind", "uid", "controller"))
            if d.string(r, "kind", rpath) == "Pod" and d.boolean(r, "controller", rpath):
                owner = d.string(r, "uid", rpath)
        return cls(
            namespace=d.string(meta, "namespace", mpath) or "default",
            name=d.string(meta, "name", mpath, required=True),
            uid=uid,
            resource_version=d.string(meta, "resourceVersion", mpath),
            annotations=tuple(sorted(d.str_map(meta, "annotations", mpath).items())),
            spec=kept if kept is not None else claim_spec(spec.get("devices"), d.join(spath, "devices")),
            allocation=status[0],
            reserved_for=status[1],
            deleting=bool(meta.get("deletionTimestamp")),
            owner_pod=owner,
        )


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplate:
    namespace: str
    name: str
    annotations: tuple[tuple[str, str], ...] = ()  # spec.metadata.annotations: copied to its claims
    spec: ClaimSpec = ClaimSpec()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def opted_out(self) -> bool:
        return opted_out(dict(self.annotations))

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> ResourceClaimTemplate:
        data = d.struct(value, path, ("metadata", "spec"))
        meta = _metadata(data, path)
        mpath, spath = d.join(path, "metadata"), d.join(path, "spec")
        outer = d.struct(data.get("spec") or {}, spath, ("metadata", "spec"))
        tmeta_path = d.join(spath, "metadata")
        tmeta = d.obj(outer.get("metadata") or {}, tmeta_path)
        ipath = d.join(spath, "spec")
        inner = d.struct(outer.get("spec") or {}, ipath, ("devices",))
        return cls(
            namespace=d.string(meta, "namespace", mpath) or "default",
            name=d.string(meta, "name", mpath, required=True),
            annotations=tuple(sorted(d.str_map(tmeta, "annotations", tmeta_path).items())),
            spec=claim_spec(inner.get("devices"), d.join(ipath, "devices")),
        )


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    config_drivers: tuple[str, ...] = ()  # drivers of its opaque configs

    @classmethod
    def from_dict(cls, value: Any, path: str = "") -> DeviceClass:
        data = d.struct(value, path, ("metadata", "spec"))
        meta = _metadata(data, path)
        spath = d.join(path, "spec")
        spec = d.struct(data.get("spec") or {}, spath, ("selectors", "config"))
        drivers = []
        for i, item in enumerate(d.array(spec, "config", spath)):
            cpath = d.join(d.join(spath, "config"), i)
            drivers.append(_opaque_driver(d.struct(item, cpath, ("opaque",)), cpath))
        return cls(
            name=d.string(meta, "name", d.join(path, "metadata"), required=True),
            selectors=_selectors(spec, spath),
            config_drivers=tuple(drivers),
        )


def default_classes() -> dict[str, DeviceClass]:
    """topoalloc's DeviceClasses as deploy/dra ships them (a test keeps the two the same): for
    reading claims where no cluster says what the classes are (`topoalloc allocate`)."""
    driver = dra.DRIVER
    return {
        name: DeviceClass(
            name, (f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{kind}"',)
        )
        for name, kind in dra.CLASS_TYPE.items()
    }


def opted_out(annotations: dict[str, str]) -> bool:
    """The claim (or template) asks for kube-scheduler's own allocation."""
    return annotations.get(dra.ALLOCATOR_ANNOTATION) == dra.ALLOCATOR_KUBE_SCHEDULER


# -- the claim spec --------------------------------------------------------------------------------


def claim_spec(value: Any, path: str) -> ClaimSpec:
    """`spec.devices` of a claim (`spec.spec.devices` of a template)."""
    if value is None:
        return ClaimSpec()
    data = d.struct(value, path, ("requests", "constraints", "config"))
    requests = tuple(
        _request(r, d.join(d.join(path, "requests"), i))
        for i, r in enumerate(d.array(data, "requests", path))
    )
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise CodecError(d.join(path, "requests"), "request names must be unique", names)
    constraints = []
    for i, item in enumerate(d.array(data, "constraints", path)):
        cpath = d.join(d.join(path, "constraints"), i)
        c = d.struct(item, cpath, ("requests", "matchAttribute", "distinctAttribute"))
        refs = tuple(_strings(c, "requests", cpath))
        for ref in refs:
            if ref.split("/", 1)[0] not in names:
                raise CodecError(d.join(cpath, "requests"), f"names no request of the claim: {ref}", ref)
        match = d.string(c, "matchAttribute", cpath)
        distinct = d.string(c, "distinctAttribute", cpath)
        if bool(match) == bool(distinct):
            raise CodecError(cpath, "needs exactly one of matchAttribute and distinctAttribute", item)
        for name, attr in (("matchAttribute", match), ("distinctAttribute", distinct)):
            if attr and "/" not in attr:
                raise CodecError(d.join(cpath, name), "must be a fully-qualified name (domain/name)", attr)
        constraints.append(Constraint(refs, match, distinct))
    config = []
    for i, item in enumerate(d.array(data, "config", path)):
        cpath = d.join(d.join(path, "config"), i)
        c = d.struct(item, cpath, ("requests", "opaque"))
        config.append(OpaqueConfig(tuple(_strings(c, "requests", cpath)), _opaque_driver(c, cpath)))
    return ClaimSpec(requests, tuple(constraints), tuple(config))


def _request(value: Any, path: str) -> DeviceRequest:
    data = d.struct(value, path, ("name", "exactly", "firstAvailable"))
    name = d.string(data, "name", path, required=True)
    exactly = data.get("exactly")
    subs = d.array(data, "firstAvailable", path)
    if (exactly is None) == (not subs):
        raise CodecError(path, "needs exactly one of exactly and firstAvailable", value)
    if exactly is not None:
        return DeviceRequest(name, exactly=_exact(exactly, d.join(path, "exactly")))
    out = []
    for i, sub in enumerate(subs):
        spath = d.join(d.join(path, "firstAvailable"), i)
        out.append((d.string(d.obj(sub, spath), "name", spath, required=True), _exact(sub, spath)))
    return DeviceRequest(name, first_available=tuple(out))


def _exact(value: Any, path: str) -> ExactRequest:
    data = d.struct(
        value,
        path,
        ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "capacity", "tolerations"),
    )
    mode = d.string(data, "allocationMode", path) or EXACT_COUNT
    d.one_of(mode, MODES, d.join(path, "allocationMode"))
    count = d.integer(data, "count", path, default=1, minimum=1, maximum=MAX_COUNT) or 1
    cpath = d.join(path, "capacity")
    capacity = parse_amounts(d.struct(data.get("capacity") or {}, cpath, ("requests",)), "requests", cpath)
    return ExactRequest(
        device_class=d.string(data, "deviceClassName", path, required=True),
        selectors=_selectors(data, path),
        mode=mode,
        count=count if mode == EXACT_COUNT else 0,
        admin_access=d.boolean(data, "adminAccess", path),
        capacity=capacity,
        tolerations=parse_tolerations(data, path),
    )


def _selectors(data: dict[str, Any], path: str) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(d.array(data, "selectors", path)):
        spath = d.join(d.join(path, "selectors"), i)
        sel = d.struct(item, spath, ("cel",))
        if sel.get("cel") is None:
            raise CodecError(spath, "expected a cel selector", item)
        cpath = d.join(spath, "cel")
        out.append(d.string(d.struct(sel["cel"], cpath, ("expression",)), "expression", cpath, required=True))
    return tuple(out)


def _opaque_driver(data: dict[str, Any], path: str) -> str:
    opath = d.join(path, "opaque")
    opaque = d.struct(data.get("opaque") or {}, opath, ("driver", "parameters"))
    return d.string(opaque, "driver", opath, required=True)


def _strings(data: dict[str, Any], name: str, path: str) -> list[str]:
    items = d.array(data, name, path)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise CodecError(d.join(d.join(path, name), i), "expected a string", item)
    return items


def _metadata(data: dict[str, Any], path: str) -> dict[str, Any]:
    return d.obj(data.get("metadata") or {}, d.join(path, "metadata"))


# -- status ----------------------------------------------------------------------------------------


def _status(value: Any, path: str) -> tuple[Allocation | None, tuple[Consumer, ...]]:
    if value is None:
        return None, ()
    data = d.struct(value, path, ("allocation", "reservedFor"))
    consumers = []
    for i, item in enumerate(d.array(data, "reservedFor", path)):
        rpath = d.join(d.join(path, "reservedFor"), i)
        r = d.struct(item, rpath, ("resource", "name", "uid"))
        consumers.append(
            Consumer(d.string(r, "resource", rpath), d.string(r, "name", rpath), d.string(r, "uid", rpath))
        )
    raw = data.get("allocation")
    if raw is None:
        return None, tuple(consumers)
    apath = d.join(path, "allocation")
    alloc = d.struct(raw, apath, ("devices", "nodeSelector"))
    dpath = d.join(apath, "devices")
    devices = d.struct(alloc.get("devices") or {}, dpath, ("results",))
    results = []
    for i, item in enumerate(d.array(devices, "results", dpath)):
        rpath = d.join(d.join(dpath, "results"), i)
        r = d.struct(item, rpath, _RESULT_FIELDS)
        results.append(
            DeviceResult(
                d.string(r, "request", rpath, required=True),
                d.string(r, "driver", rpath, required=True),
                d.string(r, "pool", rpath, required=True),
                d.string(r, "device", rpath, required=True),
                d.boolean(r, "adminAccess", rpath),
                parse_tolerations(r, rpath),
                d.string(r, "shareID", rpath),
                parse_amounts(r, "consumedCapacity", rpath),
            )
        )
    node = _selected_node(alloc.get("nodeSelector"), d.join(apath, "nodeSelector"))
    return Allocation(tuple(results), node), tuple(consumers)


_RESULT_FIELDS: Final = ("request", "driver", "pool", "device", "adminAccess", "tolerations", *SHARE_FIELDS)


def _selected_node(value: Any, path: str) -> str:
    """The node of a selector `matchFields metadata.name In [node]` (the shape allocators write for
    node-local devices); "" for no selector or any other."""
    if value is None:
        return ""
    terms = d.array(d.obj(value, path), "nodeSelectorTerms", path)
    if len(terms) != 1:
        return ""
    tpath = d.join(d.join(path, "nodeSelectorTerms"), 0)
    term = d.struct(terms[0], tpath, ("matchFields", "matchExpressions"))
    fields = d.array(term, "matchFields", tpath)
    if len(fields) != 1 or d.array(term, "matchExpressions", tpath):
        return ""
    fpath = d.join(d.join(tpath, "matchFields"), 0)
    f = d.struct(fields[0], fpath, ("key", "operator", "values"))
    values = _strings(f, "values", fpath)
    if (
        d.string(f, "key", fpath) != NODE_NAME_FIELD
        or d.string(f, "operator", fpath) != "In"
        or len(values) != 1
    ):
        return ""
    return values[0]


def allocation_status(
    results: list[DeviceResult] | tuple[DeviceResult, ...], node: str, at: float | None = None
) -> dict[str, Any]:
    """`status.allocation` for devices of one node, in the shape kube-scheduler writes, stamped
    `at` (now when None). The stamp matters on 1.36: kube-scheduler reserves an allocated claim by
    writing its allocation back with an allocationTimestamp, which the API server refuses as a
    change of the (immutable) allocation when the one stored has none; 1.35 drops the field. A
    result consuming capacity gets a fresh shareID, as kube-scheduler gives one to each."""
    shared = [replace(r, share_id=r.share_id or str(uuid.uuid4())) if r.consumed else r for r in results]
    return {
        "allocationTimestamp": format_time(at),
        "devices": {"results": [r.to_dict() for r in shared]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}
            ]
        },
    }


# -- the pod's side --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's spec.resourceClaims, with the claim it stands for once known."""

    name: str  # the pod's name for it
    claim_name: str = ""  # resourceClaimName
    template_name: str = ""  # resourceClaimTemplateName
    generated: str | None = None  # for a template: the claim the resourceclaim controller made


def pod_claims(pod: Any) -> tuple[PodClaim, ...]:
    """The pod's claims (spec.resourceClaims), each with its generated claim's name from
    status.resourceClaimStatuses when the resourceclaim controller has made it."""
    data = d.obj(pod, "")
    spec = d.obj(data.get("spec") or {}, "spec")
    status = d.obj(data.get("status") or {}, "status")
    made: dict[str, str] = {}
    for i, item in enumerate(d.array(status, "resourceClaimStatuses", "status")):
        spath = d.join("status.resourceClaimStatuses", i)
        s = d.struct(item, spath, ("name", "resourceClaimName"))
        made[d.string(s, "name", spath, required=True)] = d.string(s, "resourceClaimName", spath)
    out = []
    for i, item in enumerate(d.array(spec, "resourceClaims", "spec")):
        cpath = d.join("spec.resourceClaims", i)
        c = d.struct(item, cpath, ("name", "resourceClaimName", "resourceClaimTemplateName"))
        name = d.string(c, "name", cpath, required=True)
        claim = d.string(c, "resourceClaimName", cpath)
        template = d.string(c, "resourceClaimTemplateName", cpath)
        if bool(claim) == bool(template):
            raise CodecError(
                cpath, "needs exactly one of resourceClaimName and resourceClaimTemplateName", item
            )
        out.append(PodClaim(name, claim, template, made.get(name) if template else None))
    return tuple(out)


def claim_name(claim: PodClaim) -> str | None:
    """The name of the ResourceClaim a pod claim stands for; None while a template's claim is not
    made yet ("" when the controller decided the pod needs none)."""
    return claim.claim_name if claim.claim_name else claim.generated
