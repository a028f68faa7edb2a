"""`topoalloc allocate --claim`: the allocation the allocator would write for a pod's DRA claims on
one node, from files (the claims controller's choice, allocator/core/claims/).

The node's pool is its ResourceSlices (`--slices`), or else what its agent would publish in dra mode
from the Device CR (agent/dra/slices.py; without NVML there is no `productName`). The classes are
`--device-class` files, or else topoalloc's three as deploy/dra ships them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from agent.dra.slices import DEFAULT_MAX_VFS_PER_NIC, pool_devices, pool_slices
from allocator.core.claims.published import NodeDevices, results_usage
from allocator.core.claims.published import pool_devices as node_pool
from allocator.core.claims.solve import solve
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.cel import SelectorError
from allocator.core.request.claims import OURS, ClaimsRequest, classify, translate
from allocator.core.request.parse import pod_request
from allocator.core.scoring.device import DeviceScoring
from apis import dra
from apis.device import Device
from apis.documents import load_documents
from apis.dra_claims import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    allocation_status,
    default_classes,
)
from apis.dra_slices import ResourceSlice
from apis.errors import CodecError, InputError
from topoalloc.output import dump


class ClaimsInputError(Exception):
    """A claim, class or slice file that cannot be used (said as `<what> (<where>): <why>`)."""


def read_claim(doc: dict[str, Any], path: Path, namespace: str) -> ResourceClaim:
    """A ResourceClaim, or a template read as the claim made from it (named after it)."""
    kind = doc.get("kind")
    try:
        if kind == "ResourceClaimTemplate":
            tmpl = ResourceClaimTemplate.from_dict(doc)
            return ResourceClaim(namespace, tmpl.name, annotations=tmpl.annotations, spec=tmpl.spec)
        if kind in ("ResourceClaim", None):
            claim = ResourceClaim.from_dict(doc)
            return claim if claim.namespace != "default" else ResourceClaim(
                namespace, claim.name, claim.uid, claim.resource_version, claim.annotations,
                claim.spec, claim.allocation, claim.reserved_for,
            )  # fmt: skip
    except CodecError as exc:
        raise ClaimsInputError(f"claim file ({path}): {exc}") from None
    raise ClaimsInputError(
        f"claim file ({path}): expected a ResourceClaim or a ResourceClaimTemplate, not {kind}"
    )


def read_classes(docs: list[tuple[dict[str, Any], Path]]) -> dict[str, DeviceClass]:
    if not docs:
        return default_classes()
    out = {}
    for doc, path in docs:
        try:
            cls = DeviceClass.from_dict(doc)
        except CodecError as exc:
            raise ClaimsInputError(f"device class file ({path}): {exc}") from None
        out[cls.name] = cls
    return out


def node_devices(device: dict[str, Any], node: str, slices: list[tuple[dict[str, Any], Path]]) -> NodeDevices:
    """The node's pool: its slices when given, else what its agent would publish."""
    if not slices:
        built = pool_devices(Device.from_dict(device), max_vfs=DEFAULT_MAX_VFS_PER_NIC)
        docs = [(s, Path("-")) for s in pool_slices(node, built, 1)]
    else:
        docs = slices
    parsed = []
    for doc, path in docs:
        try:
            parsed.append(ResourceSlice.from_dict(doc))
        except CodecError as exc:
            raise ClaimsInputError(f"slices file ({path}): {exc}") from None
    pool = node_pool(node, parsed)
    if pool is None:
        where = docs[0][1] if docs else "-"
        raise ClaimsInputError(f"slices file ({where}): no complete pool of topoalloc.io devices for {node}")
    return pool


def allocate_claims(
    state: NodeState,
    pod: dict[str, Any],
    claims: list[ResourceClaim],
    classes: dict[str, DeviceClass],
    pool: NodeDevices,
    scoring: DeviceScoring,
    explain: list[str],
) -> tuple[dict[str, Any], bool]:
    """(what to print, whether the claims fit). Claims already allocated count as used on the
    node; claims topoalloc does not allocate are named with the reason."""
    todo, left = [], {}
    for claim in claims:
        if claim.allocation is not None:
            usage, _ = results_usage(state.inventory, pool.pool, claim.allocation.results)
            state.add_pod(f"claim:{claim.key}", usage)
            left[claim.name] = "already allocated (counted as used)"
            continue
        verdict = classify(claim.spec, opted_out=claim.opted_out)
        if verdict.kind == OURS:
            todo.append(claim)
        else:
            left[claim.name] = verdict.reason or "no request names a topoalloc.io DeviceClass"
    out: dict[str, Any] = {"node": state.name, "claims": {}, "left": left}
    if not todo:
        out["fits"] = True
        return out, True
    creq = translate(pod_request(pod), [(c.key, c.spec) for c in todo], classes)
    if isinstance(creq, Rejection):
        out.update(fits=False, reason=creq.explained, code=creq.code)
        return out, False
    explain.extend(_candidates(creq, pool))
    answer = solve(state, creq, pool, scoring=scoring, explain=explain)
    if isinstance(answer, Rejection):
        out.update(fits=False, reason=answer.explained, code=answer.code)
        return out, False
    out["fits"] = True
    out["claims"] = {c.name: allocation_status(answer.results[c.key], answer.node, 0) for c in todo}
    for c in todo:
        out["claims"][c.name].pop("allocationTimestamp")  # written at the time of the write
    return out, True


def _candidates(creq: ClaimsRequest, pool: NodeDevices) -> list[str]:
    lines = [f"core request: {_describe(creq)}"]
    for slot in creq.slots:
        names = []
        for name, dev in sorted(pool.devices.items()):
            parsed = dra.parse_device_name(name)
            if parsed is None or parsed.type != slot.kind:
                continue
            try:
                if all(p.matches(dev) for p in slot.selectors):
                    names.append(name)
            except SelectorError as exc:  # said here as the solve will say it
                names.append(f"{name} ({exc})")
        head = f"claim {slot.claim}, request {slot.request} ({slot.count} x {slot.kind})"
        lines.append(f"{head}: candidates {', '.join(names) or '-'}")
    for c in creq.constraints:
        what = "distinctAttribute" if c.distinct else "matchAttribute"
        over = ", ".join(creq.slots[i].request for i in c.slots)
        lines.append(f"constraint {what} {c.attribute} over {over}")
    return lines


def _describe(creq: ClaimsRequest) -> str:
    parts = [f"{t} {dict(r)}" for t, r in creq.pod.devices]
    g = creq.pod.gpu
    if g is not None and g.required_scope:
        parts.append(f"GPU scope {g.required_scope}")
    if g is not None and g.restricted_partition:
        parts.append("GPUs from one partition")
    if creq.pod.joint_types:
        required = " (same PCIe switch, required)" if creq.pod.joint_same_pcie else ""
        parts.append("NICs beside the GPUs" + required)
    if creq.regroup is not None:
        parts.append(f"GPUs of one {creq.regroup.attribute}")
    return "; ".join(parts) or "no devices"


def human(out: dict[str, Any]) -> str:
    """What `allocate --claim` prints by default: each claim's status.allocation, or the reason."""
    if not out["fits"]:
        return str(out["reason"])
    return dump(out["claims"], "yaml").rstrip("\n")


@dataclass(frozen=True)
class ClaimFiles:
    claims: tuple[Path, ...]
    classes: tuple[Path, ...] = ()
    slices: Path | None = None


def run(
    state: NodeState,
    pod: dict[str, Any],
    device: dict[str, Any],
    files: ClaimFiles,
    scoring: DeviceScoring,
    explain: bool,
    output: str,
) -> int:
    """`allocate --claim`: print the claims' allocation on the node; the exit status."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    try:
        claims = [read_claim(d, p, namespace) for p in files.claims for d in _claim_docs(p)]
        classes = read_classes([(d, p) for p in files.classes for d in _load(p, "device class file")])
        slices = [(d, files.slices) for d in _load(files.slices, "slices file")] if files.slices else []
        pool = node_devices(device, state.name, slices)
    except (InputError, ClaimsInputError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    notes: list[str] = []
    out, fits = allocate_claims(state, pod, claims, classes, pool, scoring, notes)
    if explain:
        for line in [*(f"claim {c}: not allocated here: {why}" for c, why in out["left"].items()), *notes]:
            click.echo(line, err=True)
    if output == "annotation":
        click.echo(human(out))
    else:
        click.echo(dump(out, output), nl=False)
    return 0 if fits else 1


def _claim_docs(path: Path) -> list[dict[str, Any]]:
    """The claims and templates of a claim file (the examples carry their pod beside them)."""
    docs = [d for d in _load(path, "claim file") if d.get("kind") != "Pod"]
    if not docs:
        raise InputError("claim file", str(path), "holds no ResourceClaim or ResourceClaimTemplate")
    return docs


def _load(path: Path, what: str) -> list[dict[str, Any]]:
    """The file's objects, the items of a List spread out."""
    out: list[dict[str, Any]] = []
    for doc in load_documents(path, what):
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            out.extend(i for i in doc.get("items") or [] if isinstance(i, dict))
        elif isinstance(doc, dict):
            out.append(doc)
        else:
            raise InputError(what, str(path), "expected objects")
    return out
