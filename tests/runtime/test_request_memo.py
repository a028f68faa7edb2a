"""The request memo: pods of one shape parse once, and each gets exactly what its own parse gives."""

from __future__ import annotations

import copy
from typing import Any

from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.runtime.request_memo import RequestMemo
from apis import keys

JSON = dict[str, Any]


def job_pod(name: str, *, uid: str = "", rv: str = "", gpus: str = "1", namespace: str = "team") -> JSON:
    meta: JSON = {"name": name, "namespace": namespace, "labels": {"job-name": "train"}}
    if uid:
        meta["uid"] = uid
    if rv:
        meta["resourceVersion"] = rv
    limits = {"nvidia.com/gpu": gpus, "cpu": "2", "memory": "4Gi"}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pod: Any) -> PodRequest:
        self.calls += 1
        return pod_request(pod)


def test_pods_of_one_shape_parse_once_and_each_gets_its_own_parse() -> None:
    parse = Counting()
    memo = RequestMemo(parse)
    pods = [job_pod("train-a"), job_pod("train-b", uid="u-b"), job_pod("train-c", uid="u-c", rv="7")]
    got = [memo.request(p) for p in pods]
    assert parse.calls == 1
    for pod, req in zip(pods, got, strict=True):
        assert req == pod_request(pod)
    assert [r.key for r in got] == ["team/train-a", "team/train-b", "team/train-c"]
    assert [r.uid for r in got] == ["", "u-b", "u-c"]
    # the copy is a request of its own: the first is unchanged
    assert got[0].name == "train-a"


def test_what_the_parser_reads_tells_shapes_apart() -> None:
    parse = Counting()
    memo = RequestMemo(parse)
    base = job_pod("p")
    more = job_pod("p", gpus="2")
    labelled = copy.deepcopy(base)
    labelled["metadata"]["labels"][keys.RL_JOB_GROUP] = "g"
    annotated = copy.deepcopy(base)
    annotated["metadata"]["annotations"] = {keys.NUMA_TOPOLOGY_SPEC: "not json"}
    elsewhere = job_pod("p", namespace="other")
    pods = [base, more, labelled, annotated, elsewhere]
    got = [memo.request(p) for p in pods]
    assert parse.calls == len(pods)
    for pod, req in zip(pods, got, strict=True):
        assert req == pod_request(pod)
    assert got[1].scalars != got[0].scalars
    assert got[2].rl_job_group == "g"
    assert got[3].invalid is not None
    assert got[4].key == "other/p"


def test_a_pod_version_is_not_parsed_again_and_odd_pods_still_parse() -> None:
    parse = Counting()
    memo = RequestMemo(parse)
    pod = job_pod("p", uid="u", rv="1")
    first = memo.request(pod)
    assert memo.request(pod) is first
    assert parse.calls == 1
    odd: JSON = {"metadata": {"name": "x", "labels": {1: "a"}}, "spec": {}}  # no JSON has an int key
    assert memo.request(odd) == pod_request(odd)
    assert memo.request("not a pod") == pod_request("not a pod")  # type: ignore[arg-type]
    assert parse.calls == 3
