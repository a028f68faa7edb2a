"""`topoalloc topology` on files of Nodes and Pods: the tree of domains with free GPUs, the
profile detected from each preset's labels, JSON for scripts, and bad input refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.publish.device_builder import node_resources
from apis.device import Device
from apis.topology_profile import PRESETS
from tests.cli.conftest import Ran
from tests.defrag.scenario import NODES, world
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig
from tests.support.machines import machine_device

Run = Callable[..., Ran]


def node(name: str, labels: dict[str, str], gpus: int = 8) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"}},
    }


def bound(name: str, where: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    res = {"nvidia.com/gpu": str(gpus)}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"nodeName": where, "containers": [{"name": "c", "resources": {"requests": res}}]},
        "status": {"phase": phase},
    }


def write(tmp_path: Path, items: list[dict[str, Any]]) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def preset_nodes(preset: str) -> list[dict[str, Any]]:
    """Four nodes in two domains of the preset's second-widest level, one domain of its widest."""
    keys = PRESETS[preset].keys
    top, below = keys[-1], keys[-2]
    return [node(f"n{i}", {top: "t1", below: f"b{i // 2}"}) for i in range(4)]


@pytest.mark.parametrize("preset", ["topograph", "topograph-legacy", "aws", "gke", "generic"])
def test_each_preset_is_detected_and_drawn_as_its_tree(topoalloc: Run, tmp_path: Path, preset: str) -> None:
    items = [*preset_nodes(preset), bound("a", "n0", 3), bound("done", "n1", 8, "Succeeded")]
    got = topoalloc("topology", write(tmp_path, items))
    assert got.code == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0] == f"profile {preset} (detected: 4 of 4 nodes carry its labels)"
    levels = PRESETS[preset].levels
    top, below = levels[-1].name, levels[-2].name
    rows = [line.split() for line in lines[4:]]
    assert rows[0] == [top, "t1", "4", "29", "/", "32"]  # 3 GPUs taken on n0; the finished pod frees its 8
    assert rows[1] == [below, "b0", "2", "13", "/", "16"]
    assert rows[2] == ["node", "n0", "5", "/", "8"]
    assert rows[4] == [below, "b1", "2", "16", "/", "16"]


def test_json_has_the_levels_and_the_nested_domains(topoalloc: Run, tmp_path: Path) -> None:
    items = [*preset_nodes("aws"), node("cpu", {}, gpus=0)]
    got = topoalloc("topology", write(tmp_path, items), "-o", "json", "--no-nodes")
    assert got.code == 0
    data = json.loads(got.stdout)
    assert data["profile"] == "aws" and data["detected"] == {"nodes": 4, "of": 5}
    assert [lv["name"] for lv in data["levels"]] == ["layer-3", "layer-2", "layer-1"]
    (top, loose) = data["domains"]
    assert (top["level"], top["value"], top["nodes"], top["freeGPUs"], top["gpus"]) == (
        "layer-1",
        "t1",
        4,
        32,
        32,
    )
    assert [d["value"] for d in top["domains"]] == ["b0", "b1"]
    assert loose["value"] == "(no topology labels)" and loose["nodeList"] == [
        {"name": "cpu", "freeGPUs": 0, "gpus": 0}
    ]


def test_a_named_or_custom_profile_is_used_as_given(topoalloc: Run, tmp_path: Path) -> None:
    path = write(tmp_path, [node("n0", {"example.com/rack": "r1", "example.com/row": "w"})])
    got = topoalloc(
        "topology", path, "--profile", "custom", "--key", "example.com/rack", "--key", "example.com/row"
    )
    assert got.code == 0
    assert got.stdout.splitlines()[:2] == [
        "profile custom (as configured)",
        "levels: rack (example.com/rack) < row (example.com/row)",
    ]
    assert got.stdout.splitlines()[4].split() == ["row", "w", "1", "8", "/", "8"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "a"], "--key needs --profile custom"),
        (["--profile", "custom"], "--profile custom needs at least one --key"),
    ],
)
def test_flags_that_do_not_go_together_are_refused(
    topoalloc: Run, tmp_path: Path, args: list[str], message: str
) -> None:
    got = topoalloc("topology", write(tmp_path, preset_nodes("gke")), *args)
    assert got.code == 2 and message in got.stderr


def test_a_file_without_nodes_is_refused_in_one_line(topoalloc: Run, tmp_path: Path) -> None:
    got = topoalloc("topology", write(tmp_path, [bound("a", "n0", 1)]))
    assert got.code == 2 and got.clean_error
    assert got.stderr.strip().endswith("holds no Node (kubectl get nodes -o yaml writes them)")


def test_a_node_with_kubelets_and_the_agents_gpu_resources_counts_each_gpu_once(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    """The device plugin announces `nvidia.com/gpu: 8`, the agent the same cards as
    `koordinator.sh/gpu: 800`: `topology` and `defrag` show the same 8 GPUs per node (and the
    same free ones), not 16."""
    world(fake_api_thread)
    for name in NODES:
        published = node_resources(Device.from_dict(machine_device("dgx-h100", name)))
        obj = fake_api_thread.get("nodes", name)
        assert obj is not None
        obj["status"]["allocatable"].update({k: v for k, v in published.items() if v is not None})
        fake_api_thread.put(obj)
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    tree = topoalloc("topology", "--kubeconfig", config, "-o", "json")
    defrag = topoalloc("defrag", "--kubeconfig", config, "--min-wait", "0", "-o", "json")
    assert tree.code == 0 and defrag.code == 0, tree.stderr + defrag.stderr
    [domain] = json.loads(tree.stdout)["domains"]
    counted = {n["name"]: (n["gpus"], n["freeGPUs"]) for n in domain["nodeList"]}
    assert counted == {n["node"]: (n["gpus"], n["freeGPUs"]) for n in json.loads(defrag.stdout)["nodes"]}
    assert set(counted.values()) == {(8, 6)}
