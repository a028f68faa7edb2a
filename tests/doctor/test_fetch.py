"""The fetch layer's own decisions, on a stand-in client: which webhooks are probed and with what
pod (the allocator's config decides: a component turned off is not probed, a scheduler filter names
the probe's scheduler), a probe refused or forbidden, a kind RBAC does not let the user read noted
for its check, and in kubeadm mode the configuration `install --mode kubeadm` wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.doctor.healthy import REPO, facts
from topoalloc.commands.doctor.fetch import gather, probe_all, probe_pods, scheduler_configs
from topoalloc.commands.doctor.findings import Thresholds
from topoalloc.commands.installer.cluster import ApiError


def _config(f: Any, old: str, new: str) -> None:
    cm = f.configmaps["topoalloc-allocator"]
    assert old in cm["data"]["allocator.yaml"]
    cm["data"]["allocator.yaml"] = cm["data"]["allocator.yaml"].replace(old, new)


def test_each_webhook_that_acts_is_probed_with_a_pod_it_selects() -> None:
    f = facts()
    probes = probe_pods(f)
    assert [(hook, gate) for hook, gate, _ in probes] == [
        ("placement.topoalloc.io", "topoalloc.io/placement"),
        ("podgroup.gang.topoalloc.io", "topoalloc.io/gang"),
    ]
    placement, gang = (pod for _, _, pod in probes)
    assert placement["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert gang["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "topoalloc-doctor-probe"}
    assert (
        placement["metadata"]["generateName"] == "topoalloc-doctor-probe-"
        and "schedulerName" not in placement["spec"]
    )
    _config(
        f,
        "schedulerNames: []    # gate pods of these schedulers only; empty: every pod\n  preemption",
        "schedulerNames: [my-scheduler]\n  preemption",
    )
    _config(f, "gang:\n  enabled: true", "gang:\n  enabled: false")
    [(hook, _, pod)] = probe_pods(f)
    assert hook == "placement.topoalloc.io" and pod["spec"]["schedulerName"] == "my-scheduler"


class Stub:
    """The client's reads and the dry-run create, answering from a table (an ApiError to raise)."""

    host = "https://cluster.test"

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, str, Any, Any]] = []

    def _answer(self, key: str, default: Any) -> Any:
        found = self.answers.get(key, default)
        if isinstance(found, ApiError):
            raise found
        return found

    def request(self, method: str, path: str, *, body: Any = None, query: Any = None) -> Any:
        self.sent.append((method, path, body, query))
        return self._answer(f"{method} {path}", {})

    def get(self, path: str) -> Any:
        return self._answer(f"GET {path}", None)

    def list(self, api_version: str, kind: str, *, selector: str = "", namespace: str = "") -> list[Any]:
        return self._answer(f"LIST {kind}", [])

    def path(self, api_version: str, kind: str, name: str = "", namespace: str = "") -> str:
        return f"/{kind}/{name}"

    def server_time(self) -> float:
        return 1_800_000_000.0

    def version(self) -> str:
        return "v1.36.3"


def test_probes_say_what_kube_apiserver_answered_and_stop_where_creating_is_forbidden() -> None:
    f = facts()
    f.probes = []
    refused = ApiError(500, 'failed calling webhook "podgroup.gang.topoalloc.io": x509')
    stub = Stub({"POST /api/v1/namespaces/default/pods": refused})
    probe_all(stub, f, "default")  # type: ignore[arg-type]
    assert [(p.webhook, p.refused) for p in f.probes] == [
        ("placement.topoalloc.io", refused.message),
        ("podgroup.gang.topoalloc.io", refused.message),
    ]
    assert all(query == {"dryRun": "All"} for method, _, _, query in stub.sent if method == "POST")
    f.probes = []
    probe_all(Stub({"POST /api/v1/namespaces/default/pods": ApiError(403, "forbidden")}), f, "default")  # type: ignore[arg-type]
    assert f.probes == [] and f.probe_note.startswith("creating pods in namespace default is not allowed")


def test_an_opted_out_namespace_is_not_probed_for_placement() -> None:
    f = facts()
    f.probes = []
    stub = Stub(
        {
            "GET /api/v1/namespaces/default": {"metadata": {"labels": {"topoalloc.io/placement": "false"}}},
            "POST /api/v1/namespaces/default/pods": {
                "spec": {"schedulingGates": [{"name": "topoalloc.io/gang"}]}
            },
        }
    )
    probe_all(stub, f, "default")  # type: ignore[arg-type]
    assert [p.webhook for p in f.probes] == ["podgroup.gang.topoalloc.io"]
    assert "opted out of placement" in f.probe_note


def test_what_rbac_forbids_is_noted_for_its_check_and_nothing_else_fails() -> None:
    stub = Stub(
        {
            "LIST Pod": ApiError(403, "pods is forbidden"),
            "GET /api/v1/namespaces/topoalloc-system/secrets/topoalloc-allocator-tls": ApiError(
                403, "secrets is forbidden"
            ),
        }
    )
    got = gather(stub, REPO, Thresholds(), probe_namespace=None)  # type: ignore[arg-type]
    assert got.unreadable == {
        "pods": "HTTP 403: pods is forbidden",
        "secrets": "HTTP 403: secrets is forbidden",
    }
    assert got.now == 1_800_000_000.0 and got.server_version == "v1.36.3" and got.probe_note == "--no-probe"
    assert set(got.wanted_crds) == {
        "devices.scheduling.koordinator.sh",
        "podgroups.scheduling.x-k8s.io",
        "reservations.scheduling.koordinator.sh",
    }


def test_kubeadm_mode_reads_the_file_install_wrote(tmp_path: Path) -> None:
    f = facts()
    assert scheduler_configs(f, None, tmp_path) == []  # placement mode: only a file given
    f.record = {"mode": "kubeadm"}
    assert scheduler_configs(f, None, tmp_path) == []  # not written here
    (tmp_path / "kube-scheduler-config.yaml").write_text("extenders: []\n")
    [found] = scheduler_configs(f, None, tmp_path)
    assert (
        found.source == f"file {tmp_path / 'kube-scheduler-config.yaml'}" and found.text == "extenders: []\n"
    )
    # Nothing installed any more: the file left there is read too (kube-scheduler may still use it).
    f.record, f.deployments, f.webhooks = {}, {}, None
    assert f.mode()[0] == "no" and len(scheduler_configs(f, None, tmp_path)) == 1
