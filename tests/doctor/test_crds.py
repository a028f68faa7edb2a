"""The CRD checks on constructed objects: a healthy installation's CRDs pass; a missing one, one not
Established, one not serving topoalloc's version, and Koordinator's Device CRD without topoalloc's
topology fields fail, naming what the API server would prune and the fix."""

from __future__ import annotations

from typing import Any

from tests.doctor.healthy import facts
from topoalloc.commands.doctor import crds
from topoalloc.commands.doctor.findings import FAIL, OK

DEVICE = "devices.scheduling.koordinator.sh"


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def koordinators(crd: dict[str, Any]) -> dict[str, Any]:
    """Koordinator's Device CRD: the same schema without topoalloc's additions."""
    item = _schema(crd)["properties"]["spec"]["properties"]["devices"]["items"]
    del item["properties"]["nvlink"]
    for extra in ("pcieSwitchID", "pciePath"):
        del item["properties"]["topology"]["properties"][extra]
    crd["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "koordinator"}
    return crd


def test_a_healthy_installations_crds_pass() -> None:
    found = crds.check(facts())
    assert [f.status for f in found] == [OK, OK, OK]
    assert DEVICE in found[0].what


def test_koordinators_device_crd_without_the_topology_fields_fails_naming_them() -> None:
    f = facts()
    koordinators(f.crds[DEVICE])
    [device, *rest] = crds.check(f)
    assert device.status == FAIL and [r.status for r in rest] == [OK, OK]
    assert "lacks 3 field(s) topoalloc writes" in device.what and "prunes" in device.what
    assert set(device.details) == {
        "pruned: spec.devices[].topology.pcieSwitchID",
        "pruned: spec.devices[].topology.pciePath",
        "pruned: spec.devices[].nvlink",
    }
    # Another system's CRD: applied over, not re-installed (the installer leaves it alone).
    assert device.fix.startswith(
        f"kubectl apply --server-side --force-conflicts -f deploy/crds/{DEVICE}.yaml"
    )


def test_a_schema_keeping_unknown_fields_prunes_nothing() -> None:
    f = facts()
    served = koordinators(f.crds[DEVICE])
    _schema(served)["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] = True
    assert crds.check(f)[0].status == OK


def test_a_pruned_parent_is_named_once() -> None:
    wanted = {"properties": {"a": {"properties": {"b": {"type": "string"}, "c": {"type": "string"}}}}}
    assert crds.pruned_fields(wanted, {"properties": {}}) == ["a"]
    assert crds.pruned_fields(wanted, {"properties": {"a": {"properties": {"b": {}}}}}) == ["a.c"]
    listed = {"items": {"properties": {"x": {}}}, "additionalProperties": {"properties": {"y": {}}}}
    assert crds.pruned_fields(listed, {"items": {}, "additionalProperties": {}}) == ["[].x", "*.y"]


def test_missing_not_established_or_not_serving_fail() -> None:
    f = facts()
    del f.crds["reservations.scheduling.koordinator.sh"]
    f.crds["podgroups.scheduling.x-k8s.io"]["status"]["conditions"] = [
        {"type": "Established", "status": "False", "message": "the names are taken"}
    ]
    f.crds[DEVICE]["spec"]["versions"][0]["served"] = False
    device, podgroups, reservations = crds.check(f)
    assert device.status == FAIL and "does not serve v1alpha1" in device.what
    assert podgroups.status == FAIL and "not Established: the names are taken" in podgroups.what
    assert podgroups.fix.startswith("topoalloc install")  # ours: the installer applies it again
    assert reservations.status == FAIL and "is not there" in reservations.what


def test_crds_rbac_does_not_let_read_fail_saying_so() -> None:
    f = facts()
    f.unreadable["crds"] = "HTTP 403: forbidden"
    [finding] = crds.check(f)
    assert finding.status == FAIL and "HTTP 403" in finding.what
