"""What a pod says that topoalloc would ignore without a word (apis/pod_checks.py): unknown keys of
Koordinator's and topoalloc's prefixes with the closest known one, resource names close to a device
resource but not one; nothing for what topoalloc or Koordinator know."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apis import keys
from apis.pod_checks import KNOWN_KEYS, annotation_warnings, near_miss, pod_warnings, resource_warnings

REPO = Path(__file__).resolve().parents[2]


def test_a_misspelt_key_is_named_with_the_key_it_was_meant_to_be() -> None:
    got = annotation_warnings(
        {
            "scheduling.koordinator.sh/device-joint-alocate": '{"deviceTypes":["gpu","rdma"]}',
            "topoalloc.io/requred-topology": "topology.kubernetes.io/zone",
            "topoalloc.io/whatever": "x",
            "example.com/device-joint-alocate": "not ours to judge",
        }
    )
    assert got == [
        "unknown annotation scheduling.koordinator.sh/device-joint-alocate (did you mean "
        "scheduling.koordinator.sh/device-joint-allocate?): topoalloc ignores it",
        "unknown annotation topoalloc.io/requred-topology (did you mean topoalloc.io/required-topology?): "
        "topoalloc ignores it",
        "unknown annotation topoalloc.io/whatever: topoalloc ignores it",
    ]


def test_known_keys_and_koordinators_own_pass_without_a_word() -> None:
    pod = {
        "metadata": {
            "annotations": {
                keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"]}',
                keys.DEVICE_ALLOCATE_HINT: "{}",
                keys.REQUIRED_TOPOLOGY: "x",
                "scheduling.koordinator.sh/resource-spec": "{}",
                "gang.scheduling.koordinator.sh/name": "g",
            }
        },
        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}]},
    }
    assert pod_warnings(pod) == []


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("nvida.com/gpu", "nvidia.com/gpu"),
        ("nvidia.com/GPU", "nvidia.com/gpu"),
        ("nvidia.com/gpus", "nvidia.com/gpu"),
        ("koordinator.sh/gpu_core", "koordinator.sh/gpu-core"),
        ("koordinator.sh/gpu-memory-ration", "koordinator.sh/gpu-memory-ratio"),
        ("nvidia.com/gpu", None),
        ("nvidia.com/gpu.shared", None),  # the GPU Operator's time-slicing resource
        ("nvidia.com/mig-1g.10gb", None),
        ("example.com/foo", None),
        ("ephemeral-storage", None),
    ],
)
def test_a_resource_name_close_to_a_managed_one_is_a_near_miss(name: str, meant: str | None) -> None:
    assert near_miss(name) == meant
    assert bool(resource_warnings([name])) == (meant is not None)


def test_every_key_the_product_names_under_the_checked_prefixes_is_known() -> None:
    """A key topoalloc itself writes or reads is never warned about: found in the source, so a new
    key cannot be forgotten here."""
    literal = re.compile(r'"((?:topoalloc\.io|scheduling\.koordinator\.sh)/[A-Za-z0-9._-]+)"')
    joined = re.compile(r'(TOPOALLOC|SCHED) \+ "([a-z0-9-]+)"')
    prefix = {"TOPOALLOC": keys.TOPOALLOC, "SCHED": keys.SCHED}
    found = set()
    for package in ("agent", "apis", "allocator", "topoalloc"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            found.update(m.group(1) for m in literal.finditer(text))
            found.update(prefix[m.group(1)] + m.group(2) for m in joined.finditer(text))
    found.discard(keys.SCHED + "v1alpha1")  # the Device API group, not a key
    assert len(found) > 30
    assert sorted(found - KNOWN_KEYS) == []
