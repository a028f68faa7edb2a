"""What the device plugins served one pod: kubelet's IDs per resource and container, and, for a pod
whose devices the agent chose itself (node_choice.py), the annotation entries it chose and why.
Kept in the served journal and the checkpoint (to_wire / from_wire)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.deviceplugin.node_request import GPU, RDMA
from apis import resources as rn
from apis.annotations import DeviceAllocation, DeviceAllocations
from apis.errors import CodecError


@dataclass
class ServedPod:
    namespace: str
    name: str
    # resource -> kubelet IDs per container requesting it, in container order ([] not served yet)
    resources: dict[str, list[list[str]]] = field(default_factory=dict)
    # chosen on the node: resource -> annotation entries (wire form) per container, as `resources`
    chosen: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)
    why: str = ""  # why the node chose: the pod had no allocation for this node

    def served(self, resource: str, container: int) -> bool:
        got = self.resources.get(resource, [])
        return container < len(got) and bool(got[container])

    def record(self, resource: str, container: int, ids: list[str]) -> None:
        _put(self.resources.setdefault(resource, []), container, list(ids))

    def chose(self, resource: str, container: int, entries: list[dict[str, Any]], why: str) -> None:
        _put(self.chosen.setdefault(resource, []), container, list(entries))
        self.why = why

    def fixed(self) -> dict[tuple[str, int], list[DeviceAllocation]]:
        """The entries the node chose for containers already served, by (resource, container)."""
        out: dict[tuple[str, int], list[DeviceAllocation]] = {}
        for resource, per_container in self.chosen.items():
            dtype = RDMA if resource == rn.RDMA else GPU
            for i, entries in enumerate(per_container):
                if entries:
                    out[(resource, i)] = DeviceAllocations.from_dict({dtype: entries})[dtype]
        return out

    def allocations(self) -> DeviceAllocations | None:
        """The annotation the node's choices make so far (containers in order); None when the
        node chose nothing for this pod."""
        if not self.chosen:
            return None
        by_type: dict[str, list[Any]] = {}
        for resource in sorted(self.chosen, key=lambda r: r == rn.RDMA):
            dtype = RDMA if resource == rn.RDMA else GPU
            by_type.setdefault(dtype, []).extend(e for entries in self.chosen[resource] for e in entries)
        try:
            return DeviceAllocations.from_dict(by_type)
        except CodecError:
            return None

    def copy(self) -> ServedPod:
        return ServedPod(
            self.namespace,
            self.name,
            {r: [list(ids) for ids in v] for r, v in self.resources.items()},
            {r: [list(e) for e in v] for r, v in self.chosen.items()},
            self.why,
        )

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"namespace": self.namespace, "name": self.name, "resources": self.resources}
        if self.chosen:
            out["chosen"], out["why"] = self.chosen, self.why
        return out

    @classmethod
    def from_wire(cls, data: Any) -> ServedPod:
        if not isinstance(data, dict):
            raise ValueError("served pod entry is not a map")
        res = data.get("resources") or {}
        if not isinstance(res, dict) or not all(
            isinstance(v, list) and all(isinstance(ids, list) for ids in v) for v in res.values()
        ):
            raise ValueError("served pod resources are not lists of ID lists")
        chosen = data.get("chosen") or {}
        if not isinstance(chosen, dict) or not all(
            isinstance(v, list) and all(isinstance(e, list) for e in v) for v in chosen.values()
        ):
            raise ValueError("served pod choices are not lists of entry lists")
        return cls(
            str(data.get("namespace", "")),
            str(data.get("name", "")),
            {str(k): v for k, v in res.items()},
            {str(k): v for k, v in chosen.items()},
            str(data.get("why", "")),
        )

    def held(self, resource: str) -> set[str]:
        return {i for ids in self.resources.get(resource, []) for i in ids}


def _put(lists: list[Any], index: int, value: Any) -> None:
    lists.extend([] for _ in range(index + 1 - len(lists)))
    lists[index] = value
