"""kube-scheduler extender wire types (k8s.io/kube-scheduler/extender/v1).

The Go structs have no json tags, so kube-scheduler writes PascalCase field names and `null` for
unset pointers; it reads replies case-insensitively. Pods and Nodes stay raw dicts: the service
never pays for model conversion on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import gojson
from apis.errors import CodecError

MAX_PRIORITY = 10


@dataclass
class ExtenderArgs:
    pod: dict[str, Any]
    nodes: dict[str, Any] | None = None  # a NodeList without TypeMeta (nodeCacheCapable false)
    node_names: list[str] | None = None  # nodeCacheCapable true

    def names(self) -> list[str]:
        """The candidate node names in either mode."""
        if self.node_names is not None:
            return list(self.node_names)
        if self.nodes is not None:
            return [item["metadata"]["name"] for item in self.nodes.get("items") or []]
        return []

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderArgs") -> ExtenderArgs:
        data = d.struct(value, path, ("Pod", "Nodes", "NodeNames"))
        pod = data.get("Pod")
        if pod is None:
            raise CodecError(d.join(path, "Pod"), "is required", None, show_value=False)
        pod = d.obj(pod, d.join(path, "Pod"))
        meta = d.obj(pod.get("metadata") or {}, d.join(path, "Pod.metadata"))
        d.string(meta, "name", d.join(path, "Pod.metadata"), required=True)
        nodes = data.get("Nodes")
        if nodes is not None:
            npath = d.join(path, "Nodes")
            nodes = d.obj(nodes, npath)
            for i, item in enumerate(d.array(nodes, "items", npath)):
                ipath = d.join(d.join(npath, "items"), i)
                imeta = d.obj(d.obj(item, ipath).get("metadata") or {}, d.join(ipath, "metadata"))
                d.string(imeta, "name", d.join(ipath, "metadata"), required=True)
        names = data.get("NodeNames")
        if names is not None and not _string_list(names):
            raise CodecError(d.join(path, "NodeNames"), "expected a list of node names", names)
        return cls(pod, nodes, names)

    def to_dict(self) -> dict[str, Any]:
        return {"Pod": self.pod, "Nodes": self.nodes, "NodeNames": self.node_names}

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())


def _string_list(value: Any) -> bool:
    """A list of strings. `str.join` refuses anything else in one C-level pass (a generator of
    isinstance checks over 5,000 names costs a fifth of a millisecond per request)."""
    if not isinstance(value, list):
        return False
    try:
        "".join(value)
    except TypeError:
        return False
    return True


@dataclass
class ExtenderFilterResult:
    nodes: dict[str, Any] | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = field(default_factory=dict)
    failed_and_unresolvable_nodes: dict[str, str] = field(default_factory=dict)
    error: str = ""

    FIELDS = ("Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error")

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderFilterResult") -> ExtenderFilterResult:
        data = d.struct(value, path, cls.FIELDS)
        nodes = data.get("Nodes")
        names = data.get("NodeNames")
        if names is not None and not _string_list(names):
            raise CodecError(d.join(path, "NodeNames"), "expected a list of node names", names)
        return cls(
            nodes=None if nodes is None else d.obj(nodes, d.join(path, "Nodes")),
            node_names=names,
            failed_nodes=d.str_map(data, "FailedNodes", path),
            failed_and_unresolvable_nodes=d.str_map(data, "FailedAndUnresolvableNodes", path),
            error=d.string(data, "Error", path),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "Nodes": self.nodes,
            "NodeNames": self.node_names,
            "FailedNodes": gojson.sorted_map(self.failed_nodes),
            "FailedAndUnresolvableNodes": gojson.sorted_map(self.failed_and_unresolvable_nodes),
            "Error": self.error,
        }

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())


@dataclass(frozen=True)
class HostPriority:
    host: str
    score: int

    def to_dict(self) -> dict[str, Any]:
        return {"Host": self.host, "Score": self.score}


def parse_host_priority_list(value: Any, path: str = "HostPriorityList") -> list[HostPriority]:
    if not isinstance(value, list):
        raise CodecError(path, "expected a list", value)
    out = []
    for i, item in enumerate(value):
        ipath = d.join(path, i)
        data = d.struct(item, ipath, ("Host", "Score"))
        out.append(
            HostPriority(
                d.string(data, "Host", ipath, required=True),
                d.integer(data, "Score", ipath, minimum=-(2**63), maximum=2**63 - 1),
            )
        )
    return out


def host_priority_list_json(items: list[HostPriority]) -> str:
    return gojson.dumps([h.to_dict() for h in items])


@dataclass(frozen=True)
class ExtenderBindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderBindingArgs") -> ExtenderBindingArgs:
        data = d.struct(value, path, ("PodName", "PodNamespace", "PodUID", "Node"))
        out = cls(
            d.string(data, "PodName", path, required=True),
            d.string(data, "PodNamespace", path, required=True),
            d.string(data, "PodUID", path),
            d.string(data, "Node", path, required=True),
        )
        for key, got in (("PodName", out.pod_name), ("PodNamespace", out.pod_namespace), ("Node", out.node)):
            if not got:  # kube-scheduler always names them: an empty one names no object
                raise CodecError(d.join(path, key), "must not be empty", got)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "PodName": self.pod_name,
            "PodNamespace": self.pod_namespace,
            "PodUID": self.pod_uid,
            "Node": self.node,
        }

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())


@dataclass(frozen=True)
class ExtenderBindingResult:
    error: str = ""

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderBindingResult") -> ExtenderBindingResult:
        return cls(d.string(d.struct(value, path, ("Error",)), "Error", path))

    def to_json(self) -> str:
        return gojson.dumps({"Error": self.error})


@dataclass
class MetaVictims:
    """Victims on one node by pod UID (`MetaVictims`; `Victims` carries whole Pods instead)."""

    uids: list[str] = field(default_factory=list)
    pdb_violations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"Pods": [{"UID": uid} for uid in self.uids], "NumPDBViolations": self.pdb_violations}


def _victims(value: Any, path: str, *, meta: bool) -> MetaVictims:
    data = d.struct(value, path, ("Pods", "NumPDBViolations"))
    uids = []
    for i, item in enumerate(d.array(data, "Pods", path)):
        ipath = d.join(d.join(path, "Pods"), i)
        if meta:
            uids.append(d.string(d.struct(item, ipath, ("UID",)), "UID", ipath, required=True))
        else:
            imeta = d.obj(d.obj(item, ipath).get("metadata") or {}, d.join(ipath, "metadata"))
            uids.append(d.string(imeta, "uid", d.join(ipath, "metadata"), required=True))
    count = d.integer(data, "NumPDBViolations", path, minimum=0, maximum=2**63 - 1)
    return MetaVictims(uids, count or 0)


def _victims_map(data: dict[str, Any], name: str, path: str, *, meta: bool) -> dict[str, MetaVictims]:
    """The node -> victims map in field `name` (a null map or a null node entry: none)."""
    mpath = d.join(path, name)
    return {
        node: _victims(item, d.join(mpath, node), meta=meta)
        for node, item in d.obj(data.get(name) or {}, mpath).items()
        if item is not None
    }


def _meta_map(victims: dict[str, MetaVictims]) -> dict[str, Any]:
    return {node: v.to_dict() for node, v in gojson.sorted_map(victims).items()}


@dataclass
class ExtenderPreemptionArgs:
    """POST <prefix>/<preemptVerb>: the pod and, per candidate node, the victims kube-scheduler's
    own dry run chose. nodeCacheCapable true sends `NodeNameToMetaVictims` (UIDs), false sends
    `NodeNameToVictims` (whole Pods); both arrive here as UIDs."""

    pod: dict[str, Any]
    victims: dict[str, MetaVictims]
    meta: bool = True  # which of the two maps carried them

    FIELDS = ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims")

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderPreemptionArgs") -> ExtenderPreemptionArgs:
        data = d.struct(value, path, cls.FIELDS)
        pod = data.get("Pod")
        if pod is None:
            raise CodecError(d.join(path, "Pod"), "is required", None, show_value=False)
        pod = d.obj(pod, d.join(path, "Pod"))
        meta = data.get("NodeNameToMetaVictims") is not None or data.get("NodeNameToVictims") is None
        name = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
        return cls(pod, _victims_map(data, name, path, meta=meta), meta)

    def to_dict(self) -> dict[str, Any]:
        if self.meta:
            meta = _meta_map(self.victims)
            return {"Pod": self.pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}
        full = {
            node: {"Pods": [{"metadata": {"uid": u}} for u in v.uids], "NumPDBViolations": v.pdb_violations}
            for node, v in gojson.sorted_map(self.victims).items()
        }
        return {"Pod": self.pod, "NodeNameToVictims": full, "NodeNameToMetaVictims": None}

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())


@dataclass
class ExtenderPreemptionResult:
    """The nodes kept and the victims the extender wants on each (a node left out is dropped)."""

    victims: dict[str, MetaVictims] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, path: str = "ExtenderPreemptionResult") -> ExtenderPreemptionResult:
        data = d.struct(value, path, ("NodeNameToMetaVictims",))
        return cls(_victims_map(data, "NodeNameToMetaVictims", path, meta=True))

    def to_dict(self) -> dict[str, Any]:
        return {"NodeNameToMetaVictims": _meta_map(self.victims)}

    def to_json(self) -> str:
        return gojson.dumps(self.to_dict())
