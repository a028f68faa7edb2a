"""Kubernetes resource quantities: parse and print exactly as apimachinery's resource.Quantity.

A quantity is kept as an exact integer number of nano-units plus the format its suffix implied.
Printing follows the canonical form: decimal values use the largest SI suffix that keeps an
integer mantissa ("1k", "500m", "100"), binary values at or above 1024 that are whole numbers
use the largest power-of-1024 suffix that keeps an integer mantissa ("81559Mi"), anything else
falls back to decimal. Like apimachinery, parsing rounds a non-zero value up to the nearest nano
and caps the magnitude at 2^63-1.
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from fractions import Fraction
from typing import Any

from apis.errors import CodecError

NANO = 10**9
_MAX = 2**63 - 1

_PATTERN = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_DECIMAL_SUFFIX_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXP_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL_SUFFIX_EXP.items()}
_BINARY_SUFFIX_POW = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_POW_BINARY_SUFFIX = {v: k for k, v in _BINARY_SUFFIX_POW.items()} | {0: ""}


class Format(StrEnum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


@functools.total_ordering
class Quantity:
    """An exact quantity; equality, ordering and hashing are numeric (format is ignored)."""

    __slots__ = ("format", "nanos")

    def __init__(self, nanos: int, format: Format | str = Format.DECIMAL_SI) -> None:
        self.nanos = nanos
        self.format = Format(format)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def parse(cls, value: Any, field: str = "quantity", *, clamp: bool = True) -> Quantity:
        """Parse like apimachinery. With `clamp=False` a magnitude beyond 2^63-1 units is an error
        instead of being capped (what every request and Device field wants: a capped value is a
        different number than the one written)."""
        if isinstance(value, Quantity):
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise CodecError(field, "expected a quantity string such as '100', '500m' or '16Gi'", value)
        if isinstance(value, str):
            parsed = _parse_text(value) if value == value.strip() else None
        else:
            parsed = _parse_number(str(value) if not isinstance(value, float) else repr(value))
        if parsed is None:
            raise CodecError(field, "not a valid quantity (expected e.g. '100', '500m', '1k', '16Gi')", value)
        nanos, fmt, capped = parsed
        if capped and not clamp:
            raise CodecError(field, "is too large (the largest quantity is 9223372036854775807)", value)
        return cls(nanos, fmt)

    @classmethod
    def of(cls, value: int, format: Format | str = Format.DECIMAL_SI) -> Quantity:
        """A whole number of units, e.g. Quantity.of(100) or Quantity.of(bytes, Format.BINARY_SI)."""
        return cls(int(value) * NANO, format)

    @classmethod
    def milli(cls, value: int) -> Quantity:
        return cls(int(value) * (NANO // 1000), Format.DECIMAL_SI)

    # -- values ---------------------------------------------------------------------------
    def value(self) -> int:
        """Whole units, rounded up like Quantity.Value()."""
        return -(-self.nanos // NANO)

    def milli_value(self) -> int:
        return -(-self.nanos // (NANO // 1000))

    # -- arithmetic and comparison ----------------------------------------------------------
    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos + other.nanos, self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos - other.nanos, self.format)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.nanos == other.nanos
        if isinstance(other, int) and not isinstance(other, bool):
            return self.nanos == other * NANO
        return NotImplemented

    def __lt__(self, other: Quantity) -> bool:
        return self.nanos < other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    # -- canonical form ---------------------------------------------------------------------
    def __str__(self) -> str:
        if self.nanos == 0:
            return "0"
        sign = "-" if self.nanos < 0 else ""
        mag = abs(self.nanos)
        if self.format is Format.BINARY_SI and mag >= 1024 * NANO and mag % NANO == 0:
            units, power = mag // NANO, 0
            while units % 1024 == 0 and power < 6:
                units //= 1024
                power += 1
            return f"{sign}{units}{_POW_BINARY_SUFFIX[power]}"
        mantissa, exponent = mag, -9
        while mantissa % 10 == 0:
            mantissa //= 10
            exponent += 1
        shift = exponent % 3
        mantissa *= 10**shift
        exponent -= shift
        if self.format is Format.DECIMAL_EXPONENT:
            return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
        if exponent > 18:  # beyond 'E': keep the largest suffix and a longer mantissa
            mantissa *= 10 ** (exponent - 18)
            exponent = 18
        return f"{sign}{mantissa}{_EXP_DECIMAL_SUFFIX[exponent]}"


def canonical(value: Any, field: str = "quantity") -> str:
    """Parse and re-print: the canonical spelling of a quantity string."""
    return str(Quantity.parse(value, field))


def _parse_number(text: str) -> tuple[int, Format, bool] | None:
    """(nano-units, format, whether the magnitude was capped at 2^63-1 units) of a quantity's
    text, None if it is not one."""
    match = _PATTERN.match(text)
    if match is None:
        return None
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(number)
    if suffix in _BINARY_SUFFIX_POW:
        fmt = Format.BINARY_SI
        amount *= 1024 ** _BINARY_SUFFIX_POW[suffix]
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:  # a lone "E" is exa, not an exponent
        fmt = Format.DECIMAL_EXPONENT
        amount *= Fraction(10) ** int(suffix[1:])
    else:
        fmt = Format.DECIMAL_SI
        amount *= Fraction(10) ** _DECIMAL_SUFFIX_EXP[suffix]
    nanos = amount * NANO
    # apimachinery rounds non-zero values up (away from zero) to the nearest nano.
    magnitude = -(-nanos.numerator // nanos.denominator)
    capped = magnitude > _MAX * NANO
    magnitude = min(magnitude, _MAX * NANO)
    return (-magnitude if sign == "-" else magnitude), fmt, capped


# Requests and capacities are spelled with a few dozen distinct strings across a cluster, and
# exact arithmetic on Fractions is the slow part of reading a pod: parse each spelling once.
_parse_text = functools.lru_cache(maxsize=4096)(_parse_number)
