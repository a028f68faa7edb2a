"""The image and the pods that run it: the Containerfile's final stage runs as a numeric non-root
user, writes nothing at run time and installs only the wheel built in its first stage (which
carries the manifests); in every installation the installer renders, the allocator (and the second
kube-scheduler) run non-root on a read-only root filesystem with no privilege escalation, no
capabilities and seccomp RuntimeDefault, and the agent's DaemonSet is the only pod that runs the
image as root, with the same restrictions otherwise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from topoalloc.commands.installer.manifests import CERTS, MODES, ClusterFacts, InstallOptions, render

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = (REPO / "Containerfile").read_text()


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n\s*", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    return [(m[1].upper(), m[2].strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.M)]


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions(CONTAINERFILE)
    start = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[start:]


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [args for op, args in _final_stage() if op == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, users[-1]  # runAsNonRoot can only check a numeric UID
    assert not gid or (gid.isdigit() and int(gid) > 0)
    assert int(uid) == _allocator_pod()["securityContext"]["runAsUser"]


def test_the_image_writes_nothing_at_run_time() -> None:
    stage = _final_stage()
    env = " ".join(args for op, args in stage if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert not [args for op, args in stage if op == "VOLUME"]  # what is writable is the pod's choice
    # Every cache a library might want lies under /tmp (an emptyDir where a pod needs one).
    for value in re.findall(r"\w*(?:DIR|HOME)=(\S+)", env):
        assert value.startswith("/tmp/"), value


def test_the_final_stage_installs_only_the_wheel_built_in_the_first() -> None:
    stage = _final_stage()
    copies = [args for op, args in stage if op == "COPY"]
    assert copies == ["--from=build /wheels /wheels"]  # no sources in the image
    (install,) = [args for op, args in stage if op == "RUN" and "pip install" in args]
    assert "--no-index" in install and "topoalloc" in install
    first = _instructions(CONTAINERFILE)[: len(_instructions(CONTAINERFILE)) - len(stage)]
    copied = [w for op, args in first if op == "COPY" for w in args.split()[:-1]]
    for tree in ("deploy", "daemonset", "charts", "build_bundle.py", "pyproject.toml", "MANIFEST.in"):
        assert tree in copied, tree  # the wheel is built with the manifests it carries
    for path in copied:
        assert (REPO / path).exists(), path
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not set(copied) & set(ignored)
    assert dict(stage)["ENTRYPOINT"] == '["topoalloc"]'


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _workloads() -> list[dict[str, Any]]:
    docs = []
    for mode in MODES:
        for certs in CERTS:
            options = InstallOptions("0.1.0", mode=mode, certs=certs, scheduler_version="v1.35.6")
            docs += [d for d in render(options, ClusterFacts()) if d["kind"] in ("Deployment", "DaemonSet")]
    return docs


def _allocator_pod() -> dict[str, Any]:
    docs = render(InstallOptions("0.1.0"), ClusterFacts())
    allocator = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "topoalloc-allocator"
    )
    return allocator["spec"]["template"]["spec"]


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_pod_is_locked_down_and_only_the_agent_runs_as_root(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    agent = workload["kind"] == "DaemonSet" and workload["metadata"]["name"] == "topoalloc-agent"
    if not agent:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
    for container in _containers(workload):
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, container["name"]
        assert sc["readOnlyRootFilesystem"] is True, container["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert "privileged" not in sc or sc["privileged"] is False
        root = sc.get("runAsUser", pod["securityContext"].get("runAsUser")) == 0
        assert root == agent, (workload["metadata"]["name"], container["name"])
