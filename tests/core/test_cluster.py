"""ClusterState: watch events, cached filter and score, and the kube-scheduler checks."""

from __future__ import annotations

from allocator.core import reasons as rs
from allocator.core.cluster.state import UNKNOWN_NODE, ClusterState, affinity_matches, resources_fit
from allocator.core.devices.allocate import Allocation
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.parse import pod_request
from allocator.core.scoring.scorer import NodeScorer
from apis import keys
from tests.core.nodes import plain_example_device
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device


def node(name: str, labels: dict[str, str] | None = None, cpu: str = "64", pods: str = "110") -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": cpu, "memory": "256Gi", "pods": pods}},
    }


def cluster() -> ClusterState:
    c = ClusterState()
    c.upsert_node(node("h1"))
    c.set_device(dgx_h100_device("h1"))
    c.upsert_node(node("l1"))
    c.set_device(l40s_device("l1"))
    c.upsert_node(node("cpu1"))
    return c


def test_filter_and_its_cache_follow_node_changes() -> None:
    c = cluster()
    req = pod_request(pod(gpus(8)))
    passed, failed = c.feasible(req, ["h1", "l1", "cpu1", "ghost"])
    assert passed == ["h1", "l1"]
    assert failed["cpu1"].code == rs.NO_DEVICE_CR and failed["ghost"] is UNKNOWN_NODE
    got = c.allocate(req, "h1")
    assert isinstance(got, Allocation)
    c.assign("ns/a", "h1", got.devices, 1000, 2**30)
    passed, failed = c.feasible(req, ["h1", "l1"])
    assert passed == ["l1"] and failed["h1"].explained == "need 8 free GPUs; 0 are free"
    assert c.unassign("ns/a")
    assert c.feasible(req, ["h1"])[0] == ["h1"]


def test_scores_are_cached_per_version() -> None:
    c = cluster()
    req = pod_request(pod(gpus(2, cpu="2")))
    scorer = NodeScorer()
    first = c.score(req, ["h1", "l1", "ghost"], scorer)
    assert first["ghost"] == 0 and all(0 <= v <= 10 for v in first.values())
    assert c.score(req, ["h1", "l1"], scorer) == {"h1": first["h1"], "l1": first["l1"]}
    got = c.allocate(req, "h1")
    assert isinstance(got, Allocation)
    before = c.nodes["h1"].version
    c.assign("ns/b", "h1", got.devices, 2000, 0)
    assert c.nodes["h1"].version > before


def test_moving_a_pod_and_assigning_from_a_pod_object() -> None:
    c = cluster()
    allocated = '{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
    p = pod(
        {"cpu": "1", "nvidia.com/gpu": "1"},
        name="x",
        node="l1",
        annotations={keys.DEVICE_ALLOCATED: allocated},
    )
    usage = c.assign_pod(p)
    assert (
        c.pod_node["default/x"] == "l1"
        and GPUSummary.of(c.nodes["l1"]).used_mask == 1 << 3
        and usage.cpu_milli == 1000
    )
    p["spec"]["nodeName"] = "h1"
    c.assign_pod(p)
    assert GPUSummary.of(c.nodes["l1"]).used_mask == 0 and GPUSummary.of(c.nodes["h1"]).used_mask == 1 << 3
    c.remove_node("h1")
    assert "default/x" not in c.pod_node and "h1" not in c.nodes


def test_device_delete_and_return() -> None:
    c = cluster()
    req = pod_request(pod(gpus(1)))
    c.remove_device("h1")
    assert c.feasible(req, ["h1"])[1]["h1"].explained == "need 1 free GPU; 0 are free"
    c.set_device(dgx_h100_device("h1"))
    assert c.feasible(req, ["h1"])[0] == ["h1"]


def test_node_labels_choose_the_builtin_partition_table() -> None:
    c = ClusterState()
    c.set_device(plain_example_device() | {"metadata": {"name": "p1", "labels": {}}})
    assert c.nodes["p1"].inventory.partitions is None  # type: ignore[union-attr]
    c.upsert_node(node("p1", {keys.GPU_MODEL: "H100", keys.GPU_PARTITION_POLICY: "Honor"}))
    inv = c.nodes["p1"].inventory
    assert inv is not None and inv.partition_source == "builtin" and inv.partition_honor
    got = c.allocate(pod_request(pod(gpus(3))), "p1")
    assert not isinstance(got, Allocation) and got.code == rs.UNSUPPORTED_GPU_COUNT


def test_resources_fit() -> None:
    c = cluster()
    state = c.nodes["cpu1"]
    assert resources_fit(state, pod_request(pod({"cpu": "64"}))) is None
    assert c.resources_fit("cpu1", pod_request(pod({"cpu": "65"}))).message == "Insufficient cpu"  # type: ignore[union-attr]
    assert resources_fit(state, pod_request(pod({"memory": "257Gi"}))).message == "Insufficient memory"  # type: ignore[union-attr]
    c.upsert_node(node("tiny", pods="1"))
    c.assign("ns/z", "tiny", None, 0, 0)
    assert c.resources_fit("tiny", pod_request(pod({"cpu": "1"}))).message == "Too many pods"  # type: ignore[union-attr]
    assert c.resources_fit("ghost", pod_request(pod({}))) is UNKNOWN_NODE


def test_affinity_matches() -> None:
    c = ClusterState()
    state = c.upsert_node(node("n1", {"zone": "a", "gpus": "8"}))
    p = pod({})
    assert affinity_matches(state, pod_request(p))
    p["spec"]["nodeSelector"] = {"zone": "a"}
    assert affinity_matches(state, pod_request(p))
    p["spec"]["nodeSelector"] = {"zone": "b"}
    assert not affinity_matches(state, pod_request(p))
    del p["spec"]["nodeSelector"]

    def with_terms(*terms: dict) -> bool:
        p["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
        return c.affinity_matches("n1", pod_request(p))

    def expr(key: str, op: str, *values: str) -> dict:
        return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}

    assert with_terms(expr("zone", "In", "a", "b"))
    assert not with_terms(expr("zone", "NotIn", "a"))
    assert with_terms(expr("zone", "NotIn", "b"), expr("zone", "In", "z"))
    assert with_terms(expr("gpus", "Gt", "4")) and not with_terms(expr("gpus", "Lt", "4"))
    assert with_terms(expr("zone", "Exists")) and not with_terms(expr("zone", "DoesNotExist"))
    assert with_terms({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
    assert not with_terms({})
    assert not with_terms()
    assert not c.affinity_matches("ghost", pod_request(p))
