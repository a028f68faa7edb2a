"""`topoalloc explain pod` against the fake API server over real HTTP: the story of a placed pod as
text and JSON (its devices decoded from its node's Device, its Events), read-only; a pod that is not
there, a malformed name and a missing kubeconfig are bad input (exit 2), one line, no traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import Ran
from tests.doctor.healthy import device, iso
from tests.doctor.test_explain import placed_pod, scheduled_event
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig

Run = Callable[..., Ran]


def test_the_cli_reads_the_cluster_and_tells_the_story(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    fake_api_thread.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}})
    fake_api_thread.put(device("gpu-a", "dgx-h100"))
    pod = fake_api_thread.put(placed_pod())
    fake_api_thread.put(scheduled_event(pod, iso(60)))
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    ran = topoalloc("explain", "pod", "default/gpu-pod", "--kubeconfig", config, "-o", "json")
    assert ran.code == 0, ran.stderr
    data = json.loads(ran.stdout)
    assert data["allocation"]["links"] == ["gpu0-gpu1 NV18"] and data["events"][0]["reason"] == "Scheduled"
    text = topoalloc("explain", "pod", "gpu-pod", "-n", "default", "--kubeconfig", config)
    assert text.code == 0 and "links: gpu0-gpu1 NV18" in text.stdout
    assert (
        "Scheduled" in text.stdout
        and "default-scheduler: Successfully assigned default/gpu-pod to gpu-a" in text.stdout
    )
    assert {r.method for r in fake_api_thread.requests()} == {"GET"}  # read-only


def test_the_cli_refuses_what_is_not_a_pod(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    missing = topoalloc("explain", "pod", "default/nope", "--kubeconfig", config)
    assert missing.code == 2 and missing.clean_error
    assert missing.stderr.startswith("error: pod (default/nope): not found")
    for bad in ("a/b/c", "/x", "ns/"):
        ran = topoalloc("explain", "pod", bad, "--kubeconfig", config)
        assert ran.code == 2 and ran.clean_error and "expected NAMESPACE/NAME" in ran.stderr, (
            bad,
            ran.stderr,
        )
    nowhere = topoalloc("explain", "pod", "default/x", "--kubeconfig", tmp_path / "none")
    assert nowhere.code == 2 and nowhere.clean_error and "kubeconfig" in nowhere.stderr
