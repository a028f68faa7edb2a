"""The agent and device-plugin checks on constructed objects: an agent on every GPU node the
DaemonSet selects, ready; a Device not refreshed within the threshold (its agent stopped) fails
naming the node; a node advertising GPUs without a GPU label warns with `install --gpu-nodes`; a
dra-mode node without ResourceSlices fails; kubelet advertising no GPU resource (the plugin not
registered) fails; a second device plugin DaemonSet on the agent's nodes fails naming it."""

from __future__ import annotations

import copy

from tests.doctor.healthy import facts, iso, node, pod
from topoalloc.commands.doctor import agents, plugins
from topoalloc.commands.doctor.findings import FAIL, OK, WARN

SKEW = 5.0


def statuses(found: list) -> list[tuple[str, str]]:
    return [(f.check, f.status) for f in found]


def test_healthy_agents_pass() -> None:
    [found] = agents.check(facts(), None, SKEW)
    assert found.status == OK and "refreshed within 10m" in found.what
    assert found.details == (
        "gpu-a (selected by nvidia.com/gpu.present)",
        "gpu-b (selected by topoalloc.io/gpu-node)",
    )


def test_a_stale_device_fails_naming_its_node() -> None:
    f = facts()
    f.devices[0]["status"]["updateTime"] = iso(700)
    [found] = agents.check(f, None, SKEW)
    assert found.status == FAIL
    assert found.what.startswith("Device gpu-a is stale: last refreshed 11m ago (more than 10m)")
    assert "spec.nodeName=gpu-a" in found.fix
    # --stale-after decides; so does the installed agents' statusRefreshSeconds.
    assert agents.check(f, 900.0, SKEW)[0].status == OK
    cm = f.configmaps["topoalloc-agent"]
    cm["data"]["agent.yaml"] += "statusRefreshSeconds: 600\n"
    assert agents.stale_after(f, None) == 1210.0
    cm["data"]["agent.yaml"] = cm["data"]["agent.yaml"].replace(
        "statusRefreshSeconds: 600", "statusRefreshSeconds: 0"
    )
    assert agents.stale_after(f, None) is None and agents.check(f, None, SKEW)[0].status == OK


def test_a_device_without_update_time_warns_and_one_in_the_future_says_the_clock() -> None:
    f = facts()
    del f.devices[0]["status"]["updateTime"]
    f.devices[1]["status"]["updateTime"] = iso(-60)
    found = agents.check(f, None, SKEW)
    assert statuses(found) == [("agents", WARN), ("clock", WARN)]
    assert "gpu-b's clock runs ahead" in found[1].what


def test_no_agent_pod_no_device_or_an_agent_not_ready_fail() -> None:
    f = facts()
    f.pods = [p for p in f.pods if p["metadata"]["name"] != "topoalloc-agent-gpu-b"]
    f.pods[2]["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    f.devices = f.devices[1:]
    found = agents.check(f, None, SKEW)
    assert statuses(found) == [("agents", FAIL), ("agents", FAIL), ("agents", FAIL)]
    assert found[0].what == "node gpu-a: the agent is not ready"
    assert found[1].what == "node gpu-a: no Device published"
    assert found[2].what.startswith("node gpu-b: no agent pod")


def test_a_gpu_node_without_a_gpu_label_warns_with_the_install_flag() -> None:
    f = facts()
    f.nodes.append(node("gpu-c", 8, {}))
    found = agents.check(f, None, SKEW)
    assert statuses(found) == [("agents", WARN), ("agents", OK)]
    assert found[0].fix.startswith("topoalloc install --gpu-nodes gpu-c")


def test_a_dra_node_needs_its_resource_slices() -> None:
    f = facts()
    f.nodes[1]["metadata"]["labels"]["topoalloc.io/device-mode"] = "dra"
    found = agents.check(f, None, SKEW)
    assert (
        statuses(found) == [("agents", FAIL)]
        and "gpu-b is in dra mode but has no ResourceSlice" in found[0].what
    )
    f.slices = [{"spec": {"driver": "topoalloc.io", "nodeName": "gpu-b", "devices": []}}]
    assert statuses(agents.check(f, None, SKEW)) == [("agents", OK)]


def test_no_daemonset_fails() -> None:
    f = facts()
    f.daemonsets = []
    assert statuses(agents.check(f, None, SKEW)) == [("agents", FAIL)]
    assert plugins.check(f) == []


def test_registered_plugins_pass() -> None:
    assert statuses(plugins.check(facts())) == [("plugins", OK)]


def test_kubelet_advertising_no_gpu_resource_is_a_plugin_not_registered() -> None:
    f = facts()
    for key in ("capacity", "allocatable"):
        for name in ("nvidia.com/gpu", "koordinator.sh/gpu-core"):
            del f.nodes[0]["status"][key][name]
    [found] = plugins.check(f)
    assert found.status == FAIL and "node gpu-a: kubelet advertises none of" in found.what
    assert "not registered with kubelet" in found.what


def test_a_count_that_disagrees_with_the_device_warns() -> None:
    f = facts()
    f.nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] = "16"
    [found] = plugins.check(f)
    assert found.status == WARN and "advertises 16 nvidia.com/gpu, its Device 8 healthy" in found.what


def test_a_dra_node_advertising_nvidia_gpus_has_another_plugin() -> None:
    f = facts()
    f.nodes[1]["metadata"]["labels"]["topoalloc.io/device-mode"] = "dra"
    [found] = plugins.check(f)
    assert (
        found.status == FAIL and "node gpu-b is in dra mode, yet it advertises 4 nvidia.com/gpu" in found.what
    )


def _plugin_daemonset(name: str, namespace: str, hostpath: str = "") -> dict:
    volumes = [{"name": "dp", "hostPath": {"path": hostpath}}] if hostpath else []
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"containers": [{"name": "p"}], "volumes": volumes}}},
    }


def test_a_second_device_plugin_on_the_agents_nodes_fails_naming_it() -> None:
    f = facts()
    f.daemonsets.append(_plugin_daemonset("nvidia-device-plugin-daemonset", "gpu-operator"))
    f.pods.append(
        pod("plugin-x", "gpu-operator", {}, "gpu-a", ("DaemonSet", "nvidia-device-plugin-daemonset"))
    )
    [found] = plugins.check(f)
    assert found.status == FAIL
    assert found.what.startswith(
        "DaemonSet gpu-operator/nvidia-device-plugin-daemonset runs a second device plugin on the agent's node(s) gpu-a"
    )
    assert "nvidia.com/gpu.deploy.device-plugin=false" in found.fix


def test_a_plugin_is_known_by_kubelets_socket_folder_and_only_counts_on_agent_nodes() -> None:
    f = facts()
    f.daemonsets.append(_plugin_daemonset("vendor-gpu", "vendor", "/var/lib/kubelet/device-plugins/"))
    f.pods.append(pod("vendor-gpu-1", "vendor", {}, "cpu-1", ("DaemonSet", "vendor-gpu")))
    assert statuses(plugins.check(f)) == [("plugins", OK)]  # not on an agent's node
    moved = copy.deepcopy(f.pods[-1])
    moved["spec"]["nodeName"] = "gpu-b"
    f.pods.append(moved)
    [found] = plugins.check(f)
    assert found.status == FAIL and "DaemonSet vendor/vendor-gpu" in found.what and "gpu-b" in found.what
