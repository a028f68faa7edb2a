"""`topoalloc allocate`: run the allocator core on files, without a cluster.

Exit status: 0 and the `device-allocated` annotation on stdout when the pod fits; 1 and the reason
on stdout when it does not; 2 when an input cannot be read or decoded (or, with `--strict`, when
anything about it was warned: docs/cli.md, "Silent mistakes"). `--explain` writes the
candidate devices, their scores and the allocator's choices to stderr. `--reservation FILE` (any
number) counts Reservations' rooms on the node (placing those not placed yet) and places the pod
as bind would: from a room it owns, else beside them; --explain says which room was used or why
none was. `--claim FILE` (any number) prints the pod's DRA claims' allocations instead
(allocate_claims.py); the two do not mix (one node is in one mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from allocator.core.devices.allocate import Allocation
from allocator.core.devices.allocate import allocate as allocate_devices
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState, node_facts
from allocator.core.node.summary import fits_free
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.request.usage import pod_usage
from allocator.core.reservation.on_node import Outcome, allocate_pod, hold_rooms
from allocator.core.scoring.device import STRATEGIES, DeviceScoring
from apis import keys
from apis.documents import load_documents, object_of_kind, single_object
from apis.errors import CodecError, InputError
from apis.pod_checks import annotation_warnings, near_miss, resource_names, resource_warnings
from apis.quantity import Format, Quantity
from apis.reservation import Reservation
from apis.reservation_pod import RESERVATION_ALLOCATED, ReservationAllocated
from apis.resources import KOORD, RESOURCE_DEVICE_TYPE
from topoalloc.commands import allocate_claims as claims_mod
from topoalloc.output import dump, output_option

EXIT_FITS, EXIT_REJECTED, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    pass


def _load(path: Path, what: str) -> list[Any]:
    try:
        return load_documents(path, what)
    except InputError as exc:
        raise BadInput(str(exc)) from None


def _object(docs: list[Any], path: Path, what: str, kind: str) -> dict[str, Any]:
    try:
        return single_object(docs, what, str(path), kind)
    except InputError as exc:
        raise BadInput(str(exc)) from None


def _pod(docs: list[Any], path: Path) -> dict[str, Any]:
    """The Pod to place: the file's one object, or its one Pod among others (a DRA example's
    template beside it)."""
    try:
        return object_of_kind(docs, "pod file", str(path), "Pod")
    except InputError as exc:
        raise BadInput(str(exc)) from None


def _pods(docs: list[Any], path: Path) -> list[dict[str, Any]]:
    items: list[Any] = []
    for doc in docs:
        items.extend(doc.get("items") or [] if isinstance(doc, dict) and doc.get("kind") == "List" else [doc])
    for item in items:
        if not isinstance(item, dict) or item.get("kind", "Pod") != "Pod":
            raise BadInput(f"assigned pods ({path}): expected Pods or a List of Pods")
    return items


def build_state(
    device: dict[str, Any], node: dict[str, Any] | None, assigned: list[dict[str, Any]]
) -> tuple[NodeState, list[str]]:
    """The node's state from the files; warnings for assigned pods whose annotation is unusable."""
    try:
        labels = None
        name, allocatable = "", {}
        if node is not None:
            name, labels, allocatable = node_facts(node)
        inv = build_inventory(device, labels)
    except CodecError as exc:
        raise BadInput(str(exc)) from None
    if labels is None:
        labels = dict(inv.labels)  # the slo-controller copies the Device's labels to the Node
    state = NodeState(name or inv.name, inv, labels, allocatable)
    warnings = list(inv.warnings)
    for pod in assigned:
        usage = pod_usage(pod)
        if usage.error:
            warnings.append(f"assigned pod {usage.key}: {usage.error}; counted without devices")
        state.add_usage(usage)
    return state, warnings


@click.command("allocate")
@click.option(
    "--device", "device_path", type=click.Path(path_type=Path), required=True, help="Device CR (YAML/JSON)."
)
@click.option(
    "--pod",
    "pod_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The Pod to place (a file may hold it beside its claims or templates: the one Pod is taken).",
)
@click.option(
    "--assigned",
    "assigned_path",
    type=click.Path(path_type=Path),
    help="List of Pods already bound to the node; their device-allocated annotations count as used.",
)
@click.option(
    "--node",
    "node_path",
    type=click.Path(path_type=Path),
    help="The Node (labels, allocatable). Without it the Device's labels stand in for the Node's.",
)
@click.option(
    "--device-scoring",
    type=click.Choice(STRATEGIES),
    default="LeastAllocated",
    show_default=True,
    help="Device-level strategy (DeviceShareArgs.scoringStrategy.type).",
)
@click.option(
    "--reservation",
    "reservation_paths",
    type=click.Path(path_type=Path),
    multiple=True,
    help="A Reservation on the node (repeatable): its room counts as used, and the pod takes from it "
    "when it is an owner. One not placed yet is placed on this node first.",
)
@click.option(
    "--claim",
    "claim_paths",
    type=click.Path(path_type=Path),
    multiple=True,
    help="A ResourceClaim or ResourceClaimTemplate of the pod (repeatable): print the claims' "
    "allocation (status.allocation per claim) instead of the annotation.",
)
@click.option(
    "--device-class",
    "class_paths",
    type=click.Path(path_type=Path),
    multiple=True,
    help="DeviceClasses the claims name (default: topoalloc's, as deploy/dra ships them).",
)
@click.option(
    "--slices",
    "slices_path",
    type=click.Path(path_type=Path),
    help="The node's ResourceSlices (default: what its agent publishes in dra mode from DEVICE).",
)
@click.option("--explain", is_flag=True, help="Show the candidates, their scores and the choices on stderr.")
@click.option(
    "--strict",
    is_flag=True,
    help="Any warning about the inputs (an unknown annotation key, a resource topoalloc does not "
    "allocate, claims not given, an unusable assigned pod) is an error: exit 2.",
)
@output_option("annotation", "the device-allocated annotation, or with --claim each claim's allocation")
@click.pass_context
def allocate(
    ctx: click.Context,
    device_path: Path,
    pod_path: Path,
    assigned_path: Path | None,
    node_path: Path | None,
    device_scoring: str,
    reservation_paths: tuple[Path, ...],
    claim_paths: tuple[Path, ...],
    class_paths: tuple[Path, ...],
    slices_path: Path | None,
    explain: bool,
    strict: bool,
    output: str,
) -> None:
    """Choose the GPUs and RDMA VFs for POD on the node of DEVICE, Koordinator-compatible.

    Prints the scheduling.koordinator.sh/device-allocated annotation and exits 0, or prints why
    the pod does not fit and exits 1; exits 2 when an input cannot be read (with --strict, also
    when anything about it was warned). With --claim, the
    devices for the pod's DRA claims instead: each claim's status.allocation as topoalloc would
    write it.
    """
    if claim_paths and reservation_paths:
        # One node is in one mode: claims on a DRA-mode node, rooms of device resources on a
        # device-plugin node (the allocator never places a Reservation's devices in DRA mode).
        click.echo(
            "error: --claim and --reservation: a node hands its devices out through ResourceClaims "
            "(dra mode) or device resources, and Reservations hold device resources; give one",
            err=True,
        )
        ctx.exit(EXIT_BAD_INPUT)
    try:
        device = _object(_load(device_path, "device file"), device_path, "device file", "Device")
        pod = _pod(_load(pod_path, "pod file"), pod_path)
        node = _object(_load(node_path, "node file"), node_path, "node file", "Node") if node_path else None
        assigned = _pods(_load(assigned_path, "assigned pods"), assigned_path) if assigned_path else []
        state, warnings = build_state(device, node, assigned)
        reservations = [_reservation(path) for path in reservation_paths]
    except BadInput as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_BAD_INPUT)
    typos, about_pod = pod_file_checks(pod, bool(claim_paths))
    if typos:
        click.echo(f"error: pod file ({pod_path}): {'; '.join(typos)}", err=True)
        ctx.exit(EXIT_BAD_INPUT)
    _warn(ctx, strict, [*warnings, *(f"pod file ({pod_path}): {w}" for w in about_pod)])
    if claim_paths:
        files = claims_mod.ClaimFiles(claim_paths, class_paths, slices_path)
        ctx.exit(claims_mod.run(state, pod, device, files, DeviceScoring(device_scoring), explain, output))
    req = pod_request(pod)
    if req.invalid is not None:
        # A pod Kubernetes or Koordinator would refuse is bad input, not a node that lacks room.
        click.echo(f"error: pod file ({pod_path}): {req.invalid.message}", err=True)
        ctx.exit(EXIT_BAD_INPUT)
    scoring = DeviceScoring(device_scoring)
    notes: list[str] = []
    if reservations:
        rooms, room_warnings = hold_rooms(state, reservations, assigned, scoring=scoring)
        _warn(ctx, strict, room_warnings)
        outcome = allocate_pod(state, pod, req, rooms, scoring=scoring)
        notes = outcome.notes
    else:
        outcome = Outcome(allocate_devices(state, req, scoring=scoring, explain=notes))
    result = outcome.result
    if explain:
        for line in explanation(state, req, scoring, result, notes):
            click.echo(line, err=True)
    if output != "annotation":
        click.echo(dump(_result_data(state, result, outcome, reservations), output), nl=False)
    elif isinstance(result, Rejection):
        click.echo(result.explained)
    else:
        click.echo(result.to_json())
    ctx.exit(EXIT_REJECTED if isinstance(result, Rejection) else EXIT_FITS)


def _reservation(path: Path) -> Reservation:
    obj = _object(_load(path, "reservation file"), path, "reservation file", "Reservation")
    try:
        return Reservation.from_dict(obj)
    except CodecError as exc:
        raise BadInput(f"reservation file ({path}): {exc}") from None


# Domains of device resources: a name there that topoalloc does not know and that is no near miss
# of one it does is most likely another plugin's real resource (`nvidia.com/mig-1g.10gb`).
DEVICE_DOMAINS = ("nvidia.com/", "amd.com/", "dcu.com/", "huawei.com/", KOORD)


def pod_file_checks(pod: dict[str, Any], with_claims: bool) -> tuple[list[str], list[str]]:
    """(sentences about resource names that are near misses of a device resource: refused, the pod
    would get nothing for them; warnings: other unknown names in a device domain, unknown annotation
    keys, claims the pod names but that are not given). The sentences are the extender's and the
    webhooks' (apis/pod_checks.py); only here, where a person typed the file, is a near miss an
    error rather than a warning."""
    names = resource_names(pod)
    typos = resource_warnings(names)
    unknown = [
        f"{name} is not a resource topoalloc allocates"
        for name in sorted(names)
        if name not in RESOURCE_DEVICE_TYPE and name.startswith(DEVICE_DOMAINS) and near_miss(name) is None
    ]
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    warnings = [*unknown, *annotation_warnings(annotations)]
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    claims = [c.get("name", "") for c in spec.get("resourceClaims") or [] if isinstance(c, dict)]
    if claims and not with_claims:
        warnings.append(
            f"the pod's DRA claims ({', '.join(claims)}) are not given: placed without them; "
            "--claim FILE allocates them (the example's own file holds its template)"
        )
    return typos, warnings


def _warn(ctx: click.Context, strict: bool, warnings: list[str]) -> None:
    """Say each warning on stderr; with --strict, any of them ends the command (exit 2)."""
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if strict and warnings:
        click.echo(f"error: --strict: {len(warnings)} warning(s) about the inputs, above", err=True)
        ctx.exit(EXIT_BAD_INPUT)


def _result_data(
    state: NodeState, result: Allocation | Rejection, outcome: Outcome, reservations: list[Reservation]
) -> dict[str, Any]:
    """What -o json|yaml prints: whether the pod fits, and the annotations or the reason."""
    if isinstance(result, Rejection):
        return {"node": state.name, "fits": False, "reason": result.explained, "code": result.code}
    annotations = {keys.DEVICE_ALLOCATED: result.to_json()}
    if outcome.room:
        uid = next((r.uid for r in reservations if r.name == outcome.room), "")
        annotations[RESERVATION_ALLOCATED] = ReservationAllocated(outcome.room, uid).to_json()
    out = {
        "node": state.name,
        "fits": True,
        "annotations": annotations,
        "allocation": json.loads(result.to_json()),
    }
    if reservations:
        out["reservation"] = outcome.room or None
    return out


def explanation(
    state: NodeState,
    req: PodRequest,
    scoring: DeviceScoring,
    result: Allocation | Rejection,
    notes: list[str],
) -> list[str]:
    """Human lines: the request, every candidate device with its fit and score, then the choices."""
    gpus = GPUSummary.of(state)
    lines = [f"node {state.name}: {gpus.healthy_count} healthy GPUs, {gpus.whole_free} whole GPUs free"]
    if req.invalid is not None:
        return [*lines, f"request invalid: {req.invalid.message}"]
    if not req.devices:
        return [*lines, "request: no devices"]
    for dtype, resources in req.devices:
        if dtype == "gpu" and req.gpu is not None:
            g = req.gpu
            per = g.per_gpu
            lines.append(f"request gpu: {g.count} x {_res(dict(per))}{' (shared)' if g.shared else ''}")
        else:
            per = resources
            lines.append(f"request {dtype}: {_res(dict(per))}")
        inv = state.inventory
        if inv is None:
            continue
        for slot in inv.slots(dtype):
            free = state.free.get(dtype, {}).get(slot.minor, {})
            ok = bool(slot.total) and any(free.values()) and fits_free(per, free)
            score = scoring.score_device(dict(per), slot.total, free)
            where = f"NUMA {slot.numa}, PCIe {slot.pcie_scope or '-'}"
            if slot.nvlink_domain:
                where += f", NVLink {slot.nvlink_domain}"
            vfs = f", {state.free_vfs(dtype, slot.minor)} free VFs" if slot.vf_groups else ""
            health = "" if slot.health else " unhealthy"
            verdict = "fits" if ok else "does not fit"
            # The same exclusions the allocator applies, so a line never says "fits" for a
            # device the choice could not use.
            hint = req.hint(dtype)
            if not slot.health:
                verdict = "unhealthy, not used"
            elif hint is not None and hint.selector is not None and not hint.selector.matches(slot.labels):
                verdict = "excluded by the device selector"
            lines.append(
                f"  {dtype} {slot.minor}{health}: free {_res(free)}{vfs} ({where}); {verdict}, score {score}"
            )
    lines.extend(f"choice: {n}" for n in notes)
    if isinstance(result, Rejection):
        lines.append(f"rejected: {result.explained} [{result.code}]")
    else:
        lines.append(f"allocated via {result.path or 'per-device selection'}")
    return lines


def _res(res: dict[str, int]) -> str:
    parts = []
    for name, value in sorted(res.items()):
        short = name.rsplit("/", 1)[-1]
        text = str(Quantity.of(value, Format.BINARY_SI)) if short == "gpu-memory" else str(value)
        parts.append(f"{short}={text}")
    return ", ".join(parts) or "-"
