"""What the watch cache keeps of a bound pod for defragmentation (allocator/runtime/cache/records.py):
its controller, start time and readiness always, and, where the cache keeps outlines, the pod as
its replacement would ask: the request parsed from the outline is the one parsed from the pod, and
what a running pod carries besides (volumes, environment, status, managedFields) is left out."""

from __future__ import annotations

from typing import Any

import orjson

from allocator.core.request.parse import pod_request
from allocator.runtime.cache.records import outline_pod
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import PODS
from apis import keys
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.machines import machine_device

GPU = {
    "koordinator.sh/gpu-core": 100,
    "koordinator.sh/gpu-memory-ratio": 100,
    "koordinator.sh/gpu-memory": 2**30,
}


def running_pod(ready: bool = True) -> dict[str, Any]:
    limits = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-1",
            "namespace": "a",
            "uid": "uid-web-1",
            "resourceVersion": "7",
            "labels": {"app": "web", keys.RL_JOB_GROUP: "rollout"},
            "annotations": {
                keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": [entry(0, GPU), entry(1, GPU)]}).to_json(),
                keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"]}',
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 4000,
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d",
                    "uid": "rs",
                    "controller": True,
                }
            ],
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {
            "nodeName": "n1",
            "priority": 10,
            "priorityClassName": "low",
            "schedulerName": "default-scheduler",
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                        ]
                    }
                }
            },
            "initContainers": [
                {
                    "name": "side",
                    "image": "x",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:12",
                    "env": [{"name": f"E{i}", "value": "v" * 100} for i in range(50)],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"requests": dict(limits), "limits": dict(limits)},
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
        "status": {
            "phase": "Running",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def cache_with(pod: dict[str, Any], *, outlines: bool) -> ClusterCache:
    cache = ClusterCache(CoreAdapter(), outlines=outlines)
    cache.core.set_device(machine_device("dgx-h100", "n1"))
    cache.replace(PODS, [pod])
    return cache


def test_the_outline_asks_what_the_pod_asks_and_keeps_nothing_else() -> None:
    pod = running_pod()
    e = cache_with(pod, outlines=True).pods["a/web-1"]
    assert (e.owner, e.started, e.ready) == ("ReplicaSet/web-7d", "2026-01-01T00:00:00Z", True)
    assert e.outline is not None and len(e.outline) < len(orjson.dumps(pod)) / 4
    outline = outline_pod(e)
    assert outline is not None
    assert pod_request(outline) == pod_request(pod)
    assert "volumes" not in outline["spec"] and "status" not in outline
    assert outline["spec"]["containers"] == [
        {"name": "main", "resources": pod["spec"]["containers"][0]["resources"]}
    ]
    assert "managedFields" not in outline["metadata"]
    assert outline["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]


def test_outlines_only_where_asked_for_and_only_while_the_pod_holds_devices() -> None:
    assert cache_with(running_pod(), outlines=False).pods["a/web-1"].outline is None
    pending = running_pod(ready=False)
    del pending["spec"]["nodeName"]
    e = cache_with(pending, outlines=True).pods["a/web-1"]
    assert e.outline is None and not e.ready and e.raw is not None  # the whole pod while it waits
