"""Label and field selectors with the apiserver's syntax and matching rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .resources import FieldGetter

JsonObj = dict[str, Any]


class SelectorError(ValueError):
    """A selector that does not parse, or names a field the resource cannot select on."""


_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>{_VALUE})\s*$")
_NOT_EXISTS_RE = re.compile(rf"^\s*!\s*(?P<key>{_KEY})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # = != in notin exists !exists > <
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        # > and < compare integers; a label that is absent or not an integer never matches.
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return present and (number > bound if self.op == ">" else number < bound)


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def parse_label_selector(text: str) -> LabelSelector:
    requirements = [_parse_requirement(term) for term in _split_top_level(text) if term.strip()]
    return LabelSelector(tuple(requirements))


def _split_top_level(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unable to parse requirement: unbalanced ')' in {text!r}")
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    if depth:
        raise SelectorError(f"unable to parse requirement: unbalanced '(' in {text!r}")
    terms.append(text[start:])
    return terms


def _parse_requirement(term: str) -> LabelRequirement:
    if m := _SET_RE.match(term):
        values = tuple(v.strip() for v in m["values"].split(","))
        if not all(_VALUE_RE.match(v) for v in values):
            raise SelectorError(f"unable to parse requirement: invalid label value in {term.strip()!r}")
        return LabelRequirement(m["key"], m["op"], values)
    if m := _CMP_RE.match(term):
        op = "=" if m["op"] == "==" else m["op"]
        if op in (">", "<") and not re.fullmatch(r"-?\d+", m["value"]):
            raise SelectorError(
                "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: "
                + repr(term.strip())
            )
        return LabelRequirement(m["key"], op, (m["value"],))
    if m := _NOT_EXISTS_RE.match(term):
        return LabelRequirement(m["key"], "!exists")
    if m := _EXISTS_RE.match(term):
        return LabelRequirement(m["key"], "exists")
    raise SelectorError(f"unable to parse requirement: found {term.strip()!r}, expected a label requirement")


@dataclass(frozen=True)
class FieldTerm:
    field: str
    op: str  # = or !=
    value: str


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, obj: JsonObj, getters: Mapping[str, FieldGetter]) -> bool:
        for term in self.terms:
            actual = getters[term.field](obj)
            if (actual == term.value) != (term.op == "="):
                return False
        return True

    def check_supported(self, getters: Mapping[str, FieldGetter]) -> None:
        for term in self.terms:
            if term.field not in getters:
                raise SelectorError(f"field label not supported: {term.field}")

    def value_of(self, field_name: str) -> str | None:
        """The value an equality term requires of `field_name`, if any (for `metadata.name` watches)."""
        for term in self.terms:
            if term.field == field_name and term.op == "=":
                return term.value
        return None


def parse_field_selector(text: str) -> FieldSelector:
    terms = []
    for raw in _split_unescaped(text, ","):
        if not raw:
            continue
        terms.append(_parse_field_term(raw))
    return FieldSelector(tuple(terms))


def _parse_field_term(raw: str) -> FieldTerm:
    i = 0
    while i < len(raw):
        if raw[i] == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if raw.startswith(op, i):
                name, value = raw[:i], raw[i + len(op) :]
                if not name:
                    raise SelectorError(f"invalid selector: '{raw}'; can't understand '{raw}'")
                return FieldTerm(_unescape(name), "!=" if op == "!=" else "=", _unescape(value))
        i += 1
    raise SelectorError(f"invalid selector: '{raw}'; can't understand '{raw}'")


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, i = [], [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if text[i] == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)
