"""metav1.LabelSelector: decode, validate, encode and match (used by device and VF hints)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis.errors import CodecError
from apis.gojson import sorted_map

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present  # DoesNotExist

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True)
class LabelSelector:
    """An empty selector matches everything (Kubernetes semantics)."""

    match_labels: dict[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )

    @classmethod
    def from_dict(cls, value: Any, path: str) -> LabelSelector:
        data = d.struct(value, path, ("matchLabels", "matchExpressions"))
        labels = d.str_map(data, "matchLabels", path)
        for key, val in labels.items():
            check_key(key, d.join(d.join(path, "matchLabels"), key))
            _check_value(val, d.join(d.join(path, "matchLabels"), key))
        reqs = []
        for i, item in enumerate(d.array(data, "matchExpressions", path)):
            rpath = d.join(d.join(path, "matchExpressions"), i)
            rd = d.struct(item, rpath, ("key", "operator", "values"))
            key = d.string(rd, "key", rpath, required=True)
            check_key(key, d.join(rpath, "key"))
            op = d.one_of(
                d.string(rd, "operator", rpath, required=True), OPERATORS, d.join(rpath, "operator")
            )
            values = d.array(rd, "values", rpath)
            for j, v in enumerate(values):
                if not isinstance(v, str):
                    raise CodecError(d.join(d.join(rpath, "values"), j), "expected a string", v)
                _check_value(v, d.join(d.join(rpath, "values"), j))
            if op in ("In", "NotIn") and not values:
                raise CodecError(d.join(rpath, "values"), f"must be non-empty for operator {op}", values)
            if op in ("Exists", "DoesNotExist") and values:
                raise CodecError(d.join(rpath, "values"), f"must be empty for operator {op}", values)
            reqs.append(Requirement(key, op, tuple(values)))
        return cls(labels, tuple(reqs))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = sorted_map(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [r.to_dict() for r in self.match_expressions]
        return out


def check_key(key: str, path: str) -> None:
    """CodecError unless `key` is a valid label key (an optional DNS prefix, a name of 63 at most)."""
    name = key.rsplit("/", 1)[-1]
    if not _KEY_RE.match(key) or len(name) > 63 or len(key) - len(name) > 254:
        raise CodecError(path, "is not a valid label key", key)


def _check_value(value: str, path: str) -> None:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise CodecError(path, "is not a valid label value", value)
