"""CEL selectors of DeviceClasses and claim requests, evaluated against a published device.

Standard CEL (cel-python) plus the Kubernetes quantity functions selectors use on capacities
(`quantity("40Gi")`, `compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`, `isInteger`,
`sign`), compared in milli-units. Anything else Kubernetes adds to CEL (semver, ...) is an
unsupported selector: the claim is refused with that reason rather than guessed at.

An expression is compiled once (`program`), and a program answers once per distinct value of what
it can read: a selector on `productName` is evaluated once per product, not once per GPU of the
cluster. A device whose evaluation fails (an attribute it lacks, a type mismatch) fails the claim,
as in kube-scheduler, where an evaluation error aborts the allocation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes

from apis import dra
from apis.dra_capacity import DeviceCapacity
from apis.dra_taints import DeviceTaint
from apis.quantity import Quantity

# Value of an attribute: str, int, bool, or a semver string (kept as str).
AttrValue = str | int | bool


@dataclass(frozen=True)
class PublishedDevice:
    """A device of a ResourceSlice: its name, attributes and capacities by fully-qualified name."""

    name: str
    driver: str = dra.DRIVER
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)  # milli-units
    taints: tuple[DeviceTaint, ...] = ()
    shared: bool = False  # allowMultipleAllocations
    capacities: Mapping[str, DeviceCapacity] = field(default_factory=dict)  # by name as published

    def attribute(self, qualified: str) -> AttrValue | None:
        return self.attributes.get(qualified)


class SelectorError(Exception):
    """A selector that cannot be used: it does not compile, calls what is not supported, or
    fails on a device. The message is said to the user."""


_MACROS = re.compile(r"\b(exists|exists_one|all|map|filter|size)\s*\(")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\"[^\"]*\"|'[^']*'")
_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")


def _cel_quantity(text: Any) -> celtypes.IntType:
    try:
        return celtypes.IntType(Quantity.parse(str(text)).milli_value())
    except ValueError as exc:
        raise ValueError(f"quantity({text!r}): {exc}") from None


def _compare(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


_FUNCTIONS = {
    "quantity": _cel_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a > b),
    "isLessThan": lambda a, b: celtypes.BoolType(a < b),
    "asInteger": lambda a: celtypes.IntType(int(a) // 1000),
    "isInteger": lambda a: celtypes.BoolType(int(a) % 1000 == 0),
    "sign": lambda a: celtypes.IntType((a > 0) - (a < 0)),
    "add": lambda a, b: celtypes.IntType(int(a) + int(b)),
    "sub": lambda a, b: celtypes.IntType(int(a) - int(b)),
}
_ENV = celpy.Environment()


class Program:
    """One compiled selector, with its answers per distinct value of what it reads."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._runner = _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)
        except Exception as exc:  # cel-python raises its own parse errors
            raise SelectorError(f"CEL selector does not compile: {_first_line(exc)}") from None
        tokens = {w.strip("\"'") for w in _WORD.findall(expression)}
        self._reads_all = bool(_MACROS.search(expression))
        self._tokens = frozenset(tokens)
        self._answers: dict[tuple[Any, ...], bool | str] = {}

    def _reads(self, qualified: str) -> bool:
        domain, _, name = qualified.rpartition("/")
        return name in self._tokens and (not domain or domain in self._tokens)

    def _key(self, dev: PublishedDevice) -> tuple[Any, ...]:
        if self._reads_all:
            return (dev.driver, tuple(sorted(dev.attributes.items())), tuple(sorted(dev.capacity.items())))
        return (
            dev.driver,
            tuple(sorted((k, v) for k, v in dev.attributes.items() if self._reads(k))),
            tuple(sorted((k, v) for k, v in dev.capacity.items() if self._reads(k))),
        )

    def matches(self, dev: PublishedDevice) -> bool:
        """Whether the device passes; SelectorError when the expression fails on it."""
        key = self._key(dev)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._evaluate(dev)
            if len(self._answers) >= 4096:
                self._answers.clear()
            self._answers[key] = answer
        if isinstance(answer, str):
            raise SelectorError(answer)
        return answer

    def _evaluate(self, dev: PublishedDevice) -> bool | str:
        try:
            result = self._runner.evaluate({"device": _activation(dev)})
        except Exception as exc:  # evaluation errors of any kind end in a refusal, never a crash
            return self._problem(str(exc), dev)
        if isinstance(result, Exception):  # cel-python returns some errors as values
            return self._problem(str(result), dev)
        if not isinstance(result, celtypes.BoolType | bool):
            return f"CEL selector {self.expression!r} gives {type(result).__name__}, not a boolean"
        return bool(result)

    def _problem(self, text: str, dev: PublishedDevice) -> str:
        undeclared = _UNDECLARED.search(text)
        if undeclared:
            return (
                f"unsupported selector {self.expression!r}: {undeclared.group(1)}() is not available "
                "(topoalloc evaluates standard CEL and the quantity functions)"
            )
        return f"CEL selector {self.expression!r} fails on device {dev.name}: {_first_line(text)}"


def _first_line(exc: object) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _activation(dev: PublishedDevice) -> celtypes.MapType:
    attributes: dict[str, dict[str, Any]] = {}
    for qualified, value in dev.attributes.items():
        domain, _, name = qualified.rpartition("/")
        attributes.setdefault(domain or dev.driver, {})[name] = value
    capacity: dict[Any, Any] = {}
    for qualified, milli in dev.capacity.items():
        domain, _, name = qualified.rpartition("/")
        capacity.setdefault(celtypes.StringType(domain or dev.driver), {})[celtypes.StringType(name)] = (
            celtypes.IntType(milli)
        )
    device = celpy.json_to_cel({"driver": dev.driver, "attributes": attributes})
    device[celtypes.StringType("capacity")] = celtypes.MapType(
        {k: celtypes.MapType(v) for k, v in capacity.items()}
    )
    return device  # type: ignore[no-any-return]


_PROGRAMS: dict[str, Program] = {}


def program(expression: str) -> Program:
    """The compiled program of an expression (compiled once per process); SelectorError when it
    does not compile."""
    found = _PROGRAMS.get(expression)
    if found is None:
        if len(_PROGRAMS) >= 1024:
            _PROGRAMS.clear()
        found = _PROGRAMS[expression] = Program(expression)
    return found
