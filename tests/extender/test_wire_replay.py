"""Every kube-scheduler request recorded in ../shared/wire/kube-scheduler-extender/ is replayed,
byte for byte and with its headers, against the allocator over mTLS, and answered in the shape
kube-scheduler reads (wire README: reply shape follows nodeCacheCapable, every offered node
accounted for once, scores 0..10, ExtenderBindingResult).

The recorded cluster is rebuilt in the fake API server: node-1 with 4 GPUs and one RDMA NIC,
node-2 with 2 GPUs, node-3 with 8 GPUs, node-4 with none (wire README table). The recorded
replies came from a capture extender that failed nodes by script, so their content is not ours
to match; their shape is."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from apis.extender import ExtenderBindingResult, ExtenderFilterResult, parse_host_priority_list
from tests.apis.paths import EXTENDER_WIRE, require_shared
from tests.support.allocator_harness import allocated, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.machines import dgx_h100_device
from tests.support.pki import Pki

require_shared()
FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def recorded_calls() -> list[tuple[str, Path]]:
    if not EXTENDER_WIRE.is_dir():
        raise FileNotFoundError(
            f"recorded extender traffic not found at {EXTENDER_WIRE} (../shared must exist)"
        )
    calls = []
    for path in sorted(EXTENDER_WIRE.glob("*.request.json")):
        verb = path.name.split("-", 1)[0]
        if verb in ("filter", "prioritize", "bind"):
            calls.append((verb, path))
    return calls


def recorded_device(name: str, gpus: int, nics: int) -> dict[str, Any]:
    dev = dgx_h100_device(name)
    keep = []
    for d in dev["spec"]["devices"]:
        if (d["type"] == "gpu" and d["minor"] < gpus) or (d["type"] == "rdma" and d["minor"] < nics):
            if d.get("nvlink"):
                d["nvlink"]["peers"] = [p for p in d["nvlink"]["peers"] if p["minor"] < gpus]
            keep.append(d)
    dev["spec"]["devices"] = keep
    return dev


def seed_recorded_cluster(fake: FakeApiServer) -> None:
    body = json.loads((EXTENDER_WIRE / "filter-nomanaged-01.request.json").read_bytes())
    nodes = {n["metadata"]["name"]: n for n in body["Nodes"]["items"]}
    assert sorted(nodes) == ["node-1", "node-2", "node-3", "node-4"]
    for node in nodes.values():
        fake.put({"apiVersion": "v1", "kind": "Node", **copy.deepcopy(node)})
    for name, gpus, nics in (("node-1", 4, 1), ("node-2", 2, 0), ("node-3", 8, 0)):
        fake.put(recorded_device(name, gpus, nics))


def recorded_pods() -> dict[str, dict[str, Any]]:
    """The last Pod object kube-scheduler sent for each pod name."""
    pods = {}
    for verb, path in recorded_calls():
        if verb != "bind":
            pod = json.loads(path.read_bytes())["Pod"]
            pods[pod["metadata"]["name"]] = pod
    return pods


def fresh_pod(fake: FakeApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    fake.remove("pods", meta["name"], meta["namespace"])
    obj = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(pod)}
    obj.pop("status", None)
    return fake.put(obj)


def headers_of(path: Path) -> dict[str, str]:
    meta = json.loads(path.with_name(path.name.replace(".request.json", ".headers.json")).read_text())
    return {k: v for k, v in meta["request"]["headers"] if k not in ("Host", "Content-Length")}


@pytest.mark.parametrize("round_trips", [1, 2])
async def test_every_recorded_request_is_answered_in_kube_schedulers_shape(
    fake_api: FakeApiServer, pki: Pki, round_trips: int
) -> None:
    seed_recorded_cluster(fake_api)
    pods = recorded_pods()
    seen: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    async with running_allocator(fake_api, pki, round_trips=round_trips) as run:
        session = run.client.session
        url = run.client.url
        for verb, path in recorded_calls():
            raw = path.read_bytes()
            meta = json.loads(path.with_name(path.name.replace(".request.json", ".headers.json")).read_text())
            body = json.loads(raw)
            if verb == "bind":
                stored = fresh_pod(fake_api, pods[body["PodName"]])
                body["PodUID"] = stored["metadata"]["uid"]  # the fake issues its own uids
                raw = json.dumps(body, separators=(",", ":")).encode()
                await _until_cached(run, body["PodName"], body["PodUID"])
                # What our own filter says of that node decides what bind must do.
                fits = await _fits(run, stored, body["Node"])
            async with session.post(
                url + meta["request"]["path"], data=raw, headers=headers_of(path)
            ) as resp:
                assert resp.status == 200, (path.name, await resp.text())
                assert resp.content_type == "application/json"
                reply = json.loads(await resp.read())
            seen[verb] += 1
            if verb == "filter":
                outcomes[_check_filter(path.name, body, reply, run)] += 1
            elif verb == "prioritize":
                _check_prioritize(path.name, body, reply)
            else:
                outcomes[_check_bind(run, fake_api, fits, path.name, body, reply)] += 1
    assert (
        seen == Counter(verb for verb, _ in recorded_calls()) == {"filter": 54, "prioritize": 27, "bind": 27}
    )
    # Our own answers, not the capture extender's: most recorded pods fit the recorded cluster.
    assert outcomes["bound"] >= 20 and outcomes["passed"] >= 40, outcomes


async def _until_cached(run, name: str, uid: str) -> None:  # type: ignore[no-untyped-def]
    from tests.support.polling import until

    await until(lambda: (e := run.service.cache.pod("default", name)) is not None and e.uid == uid)


def _check_filter(name: str, args: dict[str, Any], reply: dict[str, Any], run: Any) -> str:
    assert list(reply) == FILTER_KEYS, name
    ExtenderFilterResult.from_dict(reply)  # decodes as kube-scheduler's type
    assert reply["Error"] == "", name
    if args["NodeNames"] is not None:  # nodeCacheCapable: answer with names (fact 6)
        offered = args["NodeNames"]
        assert reply["Nodes"] is None and isinstance(reply["NodeNames"], list), name
        passed = reply["NodeNames"]
    else:  # the full NodeList: answer with the passing items, unchanged
        items = args["Nodes"]["items"]
        offered = [n["metadata"]["name"] for n in items]
        assert reply["NodeNames"] is None and reply["Nodes"]["metadata"] == {}, name
        passed = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
        by_name = {n["metadata"]["name"]: n for n in items}
        assert all(n == by_name[n["metadata"]["name"]] for n in reply["Nodes"]["items"]), name
    failed, unresolvable = reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]
    accounted = passed + list(failed) + list(unresolvable)
    pod = args["Pod"]
    if run.service.round_trips == 2 or not passed or not run.service.core.request(pod).wants_devices:
        assert sorted(accounted) == sorted(offered), name  # each offered node exactly once
    else:  # one round trip: the best node alone; the others that fit are left out
        assert len(passed) == 1 and len(set(accounted)) == len(accounted), name
        assert set(accounted) <= set(offered), name
    assert passed == [n for n in offered if n in passed], name  # in the order offered
    assert all(isinstance(v, str) and v for v in [*failed.values(), *unresolvable.values()]), name
    return "passed" if passed else "none-passed"


def _check_prioritize(name: str, args: dict[str, Any], reply: list[dict[str, Any]]) -> None:
    offered = (
        args["NodeNames"]
        if args["NodeNames"] is not None
        else [n["metadata"]["name"] for n in args["Nodes"]["items"]]
    )
    assert all(list(h) == ["Host", "Score"] for h in reply), name
    scores = parse_host_priority_list(reply)
    assert [h.host for h in scores] == offered, name
    assert all(0 <= h.score <= 10 for h in scores), name


async def _fits(run, pod: dict[str, Any], node: str) -> bool:  # type: ignore[no-untyped-def]
    verdict = await run.client.filter(pod, [node])
    return bool(verdict["NodeNames"] == [node])


def _check_bind(run, fake, fits: bool, name: str, args: dict[str, Any], reply: dict[str, Any]) -> str:  # type: ignore[no-untyped-def]
    assert list(reply) == ["Error"], name
    error = ExtenderBindingResult.from_dict(reply).error
    stored = fake.get("pods", args["PodName"], args["PodNamespace"])
    if error:
        assert not fits and stored["spec"].get("nodeName") is None and allocated(stored) is None, (
            name,
            error,
        )
        return "refused"
    assert fits, name
    assert stored["spec"]["nodeName"] == args["Node"], name
    assert (allocated(stored) is not None) == run.service.core.request(stored).wants_devices, name
    return "bound"
