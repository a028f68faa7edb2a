"""`upgrade`: a downgrade only when asked for (against the fake API server holding an
installation's record: refused, exit 2, nothing changed), help that states what it does (the
recorded choices, not install's defaults), and settings changed outside topoalloc named from the
API server's conflict answer (the real server's 409 in tests/cluster/test_install.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client

from tests.support.fakeapi.behaviour import DEFAULT_BEHAVIOUR
from tests.support.fakeapi.builtin import METADATA_ONLY_SCHEMA, field_getters
from tests.support.fakeapi.resources import ResourceType
from tests.support.rest import kubeconfig_text
from topoalloc.cli import main
from topoalloc.commands.install import _check_downgrade
from topoalloc.commands.installer import conflicts
from topoalloc.commands.installer.manifests import NAMESPACE, RECORD, InstallOptions, record_configmap
from topoalloc.errors import BadInput


def _invoke(*args: str) -> tuple[int, str, str]:
    ran = CliRunner().invoke(main, list(args), env={"TOPOALLOC_DEBUG": ""})
    assert ran.exception is None or isinstance(ran.exception, SystemExit), ran.exception
    return ran.exit_code, ran.stdout, ran.stderr


def test_upgrade_help_shows_no_default_it_does_not_use() -> None:
    code, out, _ = _invoke("upgrade", "--help")
    assert code == 0
    text = " ".join(out.split())
    for wrong in ("[default: Ignore]", "[default: placement]", "[default: generate]", "[default: topoalloc]",
                  "[default: off]", "[default: Fail in placement mode", "[default: registry.k8s.io"):  # fmt: skip
        assert wrong not in text, wrong
    assert text.count("[default: as the installation recorded it]") == 7  # every recorded choice
    assert "[default: this package's]" in text  # --version: this package's, as the command does
    assert "--allow-downgrade" in text
    # install's own help keeps its defaults: they are what a first install uses.
    code, out, _ = _invoke("install", "--help")
    assert code == 0 and "[default: placement]" in " ".join(out.split())


@pytest.mark.parametrize(
    ("installed", "wanted", "lower"),
    [("0.1.1", "0.1.0", True), ("0.1.9", "0.1.10", False), ("0.2.0", "0.2.0rc1", True),
     ("0.2.0rc1", "0.2.0", False), ("1.0.0", "1.0.0", False), ("0.10.0", "0.9.9", True)],
)  # fmt: skip
def test_versions_are_ordered_as_versions_not_text(installed: str, wanted: str, lower: bool) -> None:
    if lower:
        with pytest.raises(BadInput, match="--allow-downgrade"):
            _check_downgrade(installed, wanted, allowed=False)
    else:
        _check_downgrade(installed, wanted, allowed=False)
    _check_downgrade(installed, wanted, allowed=True)


def test_an_upgrade_to_a_lower_version_is_refused_and_changes_nothing(
    fake_api_thread: Any, fake_api_sync_client: Any, tmp_path: Path
) -> None:
    # The fake serves no ConfigMaps of its own: the installation's record is one.
    fake_api_thread.types.add(
        ResourceType(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True,
                     behaviour=DEFAULT_BEHAVIOUR, singular="configmap", status_subresource=False,
                     field_getters=field_getters(True), merge_schema=METADATA_ONLY_SCHEMA)
    )  # fmt: skip
    core = client.CoreV1Api(fake_api_sync_client)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    record = record_configmap(InstallOptions("0.1.1", mode="secondary"))
    record["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "topoalloc"}
    core.create_namespaced_config_map(NAMESPACE, record)
    before = core.read_namespaced_config_map(RECORD, NAMESPACE)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(fake_api_thread.url))

    code, out, err = _invoke("upgrade", "--kubeconfig", str(kubeconfig), "--version", "0.1.0")
    assert code == 2 and out == "", (code, out, err)
    assert err.strip() == (
        "error: upgrade (0.1.1 -> 0.1.0): 0.1.0 is older than the installed 0.1.1: a downgrade; pass "
        "--allow-downgrade to go back to it (its manifests must know every setting the installation has)"
    )
    after = core.read_namespaced_config_map(RECORD, NAMESPACE)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.data["version"] == "0.1.1"
    assert [c.metadata.name for c in core.list_namespaced_config_map(NAMESPACE).items] == [RECORD]


# What kube-apiserver answers (v1.35.6) to an apply over `kubectl replace`'s edit of the agent's
# ConfigMap, and to one over two fields `kubectl edit` changed in a Deployment.
ONE = 'Apply failed with 1 conflict: conflict with "kubectl-replace" using v1: .data.agent.yaml'
TWO = (
    'Apply failed with 2 conflicts: conflicts with "kubectl-edit" using apps/v1:\n'
    "- .spec.replicas\n"
    '- .spec.template.spec.containers[name="allocator"].image'
)
AGENT = "mode: device-plugin\nresyncSeconds: 10\nhealth:\n  xidHoldSeconds: 300\n"
EDITED = "mode: dra\nresyncSeconds: 10\nhealth:\n  xidHoldSeconds: 60\n  ignoredXids: [13]\n"


def _configmap(text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "topoalloc-agent", "namespace": NAMESPACE},
        "data": {"agent.yaml": text},
    }


def test_a_configuration_edited_outside_is_named_setting_by_setting() -> None:
    found = conflicts.conflict(_configmap(AGENT), _configmap(EDITED), ONE)
    assert found.fields == ((".data.agent.yaml", "kubectl-replace"),)
    assert found.settings == (
        "agent.yaml: health.ignoredXids is [13] in the cluster, not in the installation",
        "agent.yaml: health.xidHoldSeconds is 60 in the cluster, 300 in the installation",
        "agent.yaml: mode is dra in the cluster, device-plugin in the installation",
    )
    text = conflicts.refusal([found])
    assert text.startswith(
        "settings changed outside topoalloc, nothing applied: ConfigMap topoalloc-system/topoalloc-agent: "
        ".data.agent.yaml changed by kubectl-replace (agent.yaml: health.ignoredXids is [13]"
    )
    assert "--set KEY=VALUE or --values FILE" in text and "--force-conflicts" in text


def test_several_conflicting_fields_of_one_manager_are_each_named() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a", "namespace": "n"}}
    found = conflicts.conflict(deployment, deployment, TWO)
    assert found.fields == (
        (".spec.replicas", "kubectl-edit"),
        ('.spec.template.spec.containers[name="allocator"].image', "kubectl-edit"),
    )
    assert found.describe() == (
        'Deployment n/a: .spec.replicas, .spec.template.spec.containers[name="allocator"].image changed by '
        "kubectl-edit"
    )
