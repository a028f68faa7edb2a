"""Generated bad input for the fuzz campaign (bench/fuzz.py) and the property tests: pods with odd
amounts and annotations, mutated Device CRs, extender request bodies and raw bytes. Everything is
drawn from a `random.Random`, so a case is reproduced from its seed, and hypothesis can drive the
same generators through `st.randoms()`."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from typing import Any

from apis import keys

RESOURCE_NAMES = [
    "nvidia.com/gpu", "koordinator.sh/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu.shared", "koordinator.sh/rdma",
    "koordinator.sh/fpga", "huawei.com/npu-core", "huawei.com/npu-cpu", "amd.com/gpu", "cpu", "memory",
    "ephemeral-storage", "hugepages-2Mi", "kubernetes.io/mid-cpu", "example.com/foo", "", "x" * 300,
]  # fmt: skip
AMOUNTS: list[Any] = [
    "0", "1", "2", "4", "8", "16", "1.5", "0.5", "-1", "-0", "1e21", "1e30", "1e-9", "100", "150", "50",
    "200", "1000", "abc", "", " 1", "1Ki", "80Gi", "500m", "0.001", "9223372036854775807",
    "9223372036854775808", "1E3", "1E", "2P", "1Ei", "+2", ".5", "1..2", "1e", "١", 1, 2, 1.5, -3, 10**30, 1e308, True,
    None, [], {},
]  # fmt: skip
HINTS = [
    '{"rdma":{"vfSelector":{}}}', '{"gpu":{"selector":{"matchLabels":{"a":"b"}}}}',
    '{"gpu":{"requiredTopologyScope":"PCIe"}}', '{"gpu":{"allocateStrategy":"ApplyForAll"}}',
    '{"rdma":{"selector":{"matchExpressions":[{"key":"k","operator":"In","values":["v"]}]}}}',
]  # fmt: skip
JOINTS = ['{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}', '{"deviceTypes":["gpu","rdma"]}']
PARTITIONS = ['{"allocatePolicy":"Restricted","ringBusBandwidth":"200Gi"}', '{"allocatePolicy":"BestEffort"}']
NUMAS = ['{"numaTopologyPolicy":"SingleNUMANode"}', '{"numaTopologyPolicy":"Restricted"}']
ALLOCATED = [
    '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}',
    '{"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"1"},"extension":{"vfs":[{"minor":-1}]}}]}',
]  # fmt: skip
ANNOTATIONS: dict[str, list[str]] = {
    keys.DEVICE_ALLOCATE_HINT: HINTS,
    keys.DEVICE_JOINT_ALLOCATE: JOINTS,
    keys.GPU_PARTITION_SPEC: PARTITIONS,
    keys.NUMA_TOPOLOGY_SPEC: NUMAS,
    keys.DEVICE_ALLOCATED: ALLOCATED,
}
ODD_STRINGS = [
    "",
    "{",
    "}",
    "[]",
    "null",
    "true",
    "0",
    '"x"',
    "{}",
    "\x00",
    "\ud800",
    "é" * 5,
    "{" * 200,
    "[" * 5000,
]


def as_go_reads(names: list[Any]) -> set[Any]:
    """Names as Go's decoder (and so the extender) reads them: a lone surrogate becomes U+FFFD."""
    return {re.sub("[\ud800-\udfff]", "\ufffd", n) if isinstance(n, str) else n for n in names}


def json_value(rng: random.Random, depth: int = 0) -> Any:
    """An arbitrary JSON value, shallow."""
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice([None, True, False, 0, -1, 2**63, 1.5, 1e308, "", "x", "gpu", "100", "é", [], {}])
    if roll < 0.75:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    names = ["gpu", "rdma", "minor", "resources", "selector", "vfSelector", "deviceTypes", "x", ""]
    return {rng.choice(names): json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def mutate_string(rng: random.Random, text: str) -> str:
    roll = rng.random()
    if roll < 0.2 or not text:
        return rng.choice(ODD_STRINGS)
    if roll < 0.4:
        return text[: rng.randint(0, len(text))]
    if roll < 0.6:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice('{}[]":,0a-\\é') + text[i + 1 :]
    if roll < 0.8:
        return json.dumps(json_value(rng))
    return text.replace(rng.choice(['"', "1", "gpu", ":", "{"]), rng.choice(['"', "-1", "GPU", "", "{{"]), 1)


def pod(rng: random.Random, name: str = "fuzz", namespace: str = "fuzz") -> dict[str, Any]:
    """A Pod whose requests and annotations are drawn from good and bad values."""
    resources: dict[str, Any] = {}
    for _ in range(rng.randint(0, 4)):
        resources[rng.choice(RESOURCE_NAMES)] = rng.choice(AMOUNTS)
    annotations: dict[str, Any] = {}
    for key, good in ANNOTATIONS.items():
        if rng.random() < 0.3:
            value: Any = rng.choice(good)
            if rng.random() < 0.5:
                value = mutate_string(rng, value)
            if rng.random() < 0.03:
                value = json_value(rng)  # not even a string
            annotations[key] = value
    container: dict[str, Any] = {"name": "c", "image": "x", "resources": {}}
    where = rng.random()
    if where < 0.45:
        container["resources"]["limits"] = resources
    elif where < 0.9:
        container["resources"]["requests"] = resources
    else:
        container["resources"] = rng.choice([resources, json_value(rng), None])
    spec: dict[str, Any] = {"containers": [container]}
    if rng.random() < 0.1:
        spec["initContainers"] = [copy.deepcopy(container) | {"restartPolicy": rng.choice(["Always", None])}]
    if rng.random() < 0.05:
        spec["overhead"] = {rng.choice(RESOURCE_NAMES): rng.choice(AMOUNTS)}
    if rng.random() < 0.05:
        spec["affinity"] = json_value(rng)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    if rng.random() < 0.05:
        meta["labels"] = json_value(rng)
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if rng.random() < 0.03:
        out = mutate_tree(rng, out)
    return out


def mutate_tree(rng: random.Random, value: Any, rounds: int = 3) -> Any:
    """`value` (a JSON tree) with a few nodes replaced, dropped or retyped."""
    tree = copy.deepcopy(value)
    for _ in range(rounds):
        tree = _mutate_once(rng, tree)
    return tree


def _mutate_once(rng: random.Random, tree: Any) -> Any:
    path: list[Any] = []
    node = tree
    while isinstance(node, dict | list) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
    replacement: Any
    roll = rng.random()
    if roll < 0.3:
        replacement = json_value(rng)
    elif roll < 0.5:
        replacement = rng.choice(AMOUNTS)
    elif roll < 0.7 and isinstance(node, str):
        replacement = mutate_string(rng, node)
    elif roll < 0.85 and path:
        parent = tree
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return tree
    else:
        replacement = rng.choice(["gpu", "rdma", "tpu", "GPU", -1, 10**20, "-100", "1e30", "400"])
    if not path:
        return replacement
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = replacement
    return tree


def device(rng: random.Random, base: dict[str, Any]) -> dict[str, Any]:
    """A Device CR from `base` with fields changed: amounts, types, minors, whole subtrees."""
    out = copy.deepcopy(base)
    devices = (out.get("spec") or {}).get("devices") or []
    if devices and rng.random() < 0.7:
        dev = rng.choice(devices)
        field = rng.choice(["type", "minor", "resources", "health", "topology", "vfGroups", "nvlink"])
        if field == "resources":
            dev["resources"] = {
                rng.choice(RESOURCE_NAMES): rng.choice(AMOUNTS) for _ in range(rng.randint(0, 3))
            }
        elif field == "type":
            dev["type"] = rng.choice(["gpu", "rdma", "fpga", "tpu", "GPU", "", None, 1])
        elif field == "minor":
            dev["minor"] = rng.choice([0, -1, 2**31, "0", None, 1.5])
        else:
            dev[field] = json_value(rng)
        return out
    return mutate_tree(rng, out, rounds=rng.randint(1, 4))


def extender_body(rng: random.Random, pod_obj: Any, names: list[str]) -> tuple[str, bytes]:
    """(verb, body) of one call kube-scheduler could make, or a broken variant of one."""
    verb = rng.choice(["filter", "filter", "prioritize", "bind"])
    offered = rng.sample(names, rng.randint(0, len(names))) + (["no-such-node"] if rng.random() < 0.1 else [])
    body: Any
    if verb == "bind":
        meta = (pod_obj.get("metadata") if isinstance(pod_obj, dict) else None) or {}
        meta = meta if isinstance(meta, dict) else {}
        body = {"PodName": meta.get("name", "fuzz"), "PodNamespace": meta.get("namespace", "fuzz"),
                "PodUID": meta.get("uid", ""), "Node": rng.choice(offered or ["no-such-node"])}  # fmt: skip
    elif rng.random() < 0.1:
        body = {
            "Pod": pod_obj,
            "Nodes": {"metadata": {}, "items": [{"metadata": {"name": n}} for n in offered]},
        }
    else:
        body = {"Pod": pod_obj, "Nodes": None, "NodeNames": offered}
    roll = rng.random()
    if roll < 0.05:
        body = mutate_tree(rng, body)
    raw = json.dumps(body).encode()
    if roll > 0.95:
        raw = mutate_bytes(rng, raw)
    return verb, raw


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.25:
        return data[: rng.randint(0, len(data))]
    if roll < 0.5:
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if roll < 0.75:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    return rng.choice([b"", b"null", b"[]", b"{}", b"\xff\xfe", b"{" * 100_000, b'"' + b"a" * 1000])


def document_bytes(rng: random.Random, good: Callable[[], Any]) -> bytes:
    """The bytes of a file a user might hand to the CLI: good YAML, broken YAML, other encodings."""
    import yaml

    roll = rng.random()
    if roll < 0.4:
        return yaml.safe_dump(mutate_tree(rng, good(), rounds=rng.randint(0, 3))).encode(errors="replace")
    if roll < 0.55:
        return yaml.safe_dump_all([good() for _ in range(rng.randint(0, 3))]).encode(errors="replace")
    if roll < 0.7:
        return yaml.safe_dump(good()).encode(rng.choice(["utf-16", "utf-8-sig", "latin-1"]), errors="replace")
    return mutate_bytes(rng, yaml.safe_dump(good()).encode(errors="replace"))
