"""Pods' parsed requests, kept by what determines them.

A Job's or a ReplicaSet's pods come from one template: their requests differ in nothing the parser
reads but the pod's name and uid. The memo keys a parsed request by the rest of what the parser
reads (namespace, labels, annotations, spec) and gives the second pod of the same shape a copy with
its own name and uid, so it parses nothing (the parse is the largest cost of one decision at
admission). A pod's resourceVersion and uid also key it: kube-scheduler sends the same pod to
filter, prioritize and (through the cache) bind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest, renamed

# Beyond this many entries a memo starts afresh (a cluster has a few hundred shapes at most).
LIMIT = 1024
K = TypeVar("K")


class RequestMemo:
    def __init__(self, parse: Callable[[Any], PodRequest] = pod_request) -> None:
        self._parse = parse
        self._versions: dict[tuple[Any, Any], PodRequest] = {}
        self._shapes: dict[bytes, PodRequest] = {}

    def request(self, pod: Mapping[str, Any]) -> PodRequest:
        if not isinstance(pod, dict):
            return self._parse(pod)
        meta = pod.get("metadata") or {}
        version = (meta.get("uid"), meta.get("resourceVersion"))
        if version[0] and version[1]:
            req = self._versions.get(version)
            if req is None:
                req = _put(self._versions, version, self._by_shape(pod, meta))
            return req
        return self._by_shape(pod, meta)

    def _by_shape(self, pod: Mapping[str, Any], meta: Any) -> PodRequest:
        shape = _shape(pod, meta)
        if shape is None:
            return self._parse(pod)
        req = self._shapes.get(shape)
        if req is None:
            return _put(self._shapes, shape, self._parse(pod))
        name, uid = meta.get("name"), meta.get("uid")
        name = name if isinstance(name, str) else ""
        uid = uid if isinstance(uid, str) else ""
        if name == req.name and uid == req.uid:
            return req
        # the key is spelled as the parser spells it: the namespace as written, then the name
        prefix = req.key[: len(req.key) - len(req.name)]
        return renamed(req, key=prefix + name, namespace=req.namespace, name=name, uid=uid)


def _shape(pod: Mapping[str, Any], meta: Any) -> bytes | None:
    """What the parser reads of the pod but its name and uid, as bytes; None for a pod whose
    parts are not what a decoded pod's are (the parser then says what is wrong)."""
    if not isinstance(pod, dict) or not isinstance(meta, dict):
        return None
    try:
        return orjson.dumps(
            [meta.get("namespace"), meta.get("labels"), meta.get("annotations"), pod.get("spec")],
            option=orjson.OPT_SORT_KEYS,
        )
    except TypeError:  # orjson.JSONEncodeError: something no decoded JSON holds
        return None


def _put(memo: dict[K, PodRequest], key: K, req: PodRequest) -> PodRequest:
    if len(memo) >= LIMIT:
        memo.clear()
    memo[key] = req
    return req
