"""Quantities parse and print exactly as apimachinery's resource.Quantity."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.errors import CodecError
from apis.quantity import Format, Quantity, canonical


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100", "100"),
        ("81559Mi", "81559Mi"),
        ("1k", "1k"),
        ("1000", "1k"),  # decimal values take the largest SI suffix with an integer mantissa
        ("1500", "1500"),
        ("500m", "500m"),
        ("0.5", "500m"),
        ("1.5", "1500m"),
        ("1.5Gi", "1536Mi"),  # binary: largest power of 1024 keeping an integer mantissa
        ("1536", "1536"),
        ("1024", "1024"),  # decimal format stays decimal
        ("1Ki", "1Ki"),
        ("16Gi", "16Gi"),
        ("83201216Ki", "83201216Ki"),
        ("0.5Ki", "512"),  # binary below 1024 prints as decimal
        ("1e3", "1e3"),  # exponent format is kept
        ("1E3", "1e3"),
        ("0", "0"),
        ("0Gi", "0"),
        ("-1500m", "-1500m"),
        ("0.1m", "100u"),
        ("1n", "1n"),
        ("0.0000000001", "1n"),  # rounds up to the nearest nano, never to zero
        (".5", "500m"),
        ("5.", "5"),
        ("+7", "7"),
        ("12345678901", "12345678901"),
        ("1M", "1M"),
        ("2000k", "2M"),
    ],
)
def test_canonical_form(text: str, expected: str) -> None:
    assert canonical(text) == expected


def test_numbers_from_yaml_are_quantities() -> None:
    assert str(Quantity.parse(100)) == "100"
    assert str(Quantity.parse(0.5)) == "500m"


def test_compares_numerically_across_formats() -> None:
    assert Quantity.parse("1k") == Quantity.parse("1000") == Quantity.parse("1e3")
    assert Quantity.parse("1Gi") > Quantity.parse("1G")
    assert Quantity.parse("1024") == Quantity.parse("1Ki")
    assert hash(Quantity.parse("1Ki")) == hash(Quantity.parse("1024"))
    assert sorted([Quantity.parse("2"), Quantity.parse("1500m"), Quantity.parse("1")]) == [
        Quantity.parse("1"),
        Quantity.parse("1500m"),
        Quantity.parse("2"),
    ]


def test_values_round_up_like_value_and_milli_value() -> None:
    assert Quantity.parse("1500m").value() == 2
    assert Quantity.parse("1.0001m").milli_value() == 2
    assert Quantity.parse("81559Mi").value() == 85_520_809_984


def test_constructors_print_canonically() -> None:
    assert str(Quantity.of(85_520_809_984, Format.BINARY_SI)) == "81559Mi"
    assert str(Quantity.of(1000)) == "1k"
    assert str(Quantity.of(100)) == "100"
    assert str(Quantity.milli(250)) == "250m"


def test_magnitude_is_capped_like_apimachinery() -> None:
    assert Quantity.parse("1024Ei").value() == 2**63 - 1


@pytest.mark.parametrize(
    "bad", ["1K", "abc", "", "1.2.3", "1Mb", " 1", "1 ", "--1", "e3", "1e", "0x10", "1kk", "Ki"]
)
def test_malformed_strings_name_the_field_and_value(bad: str) -> None:
    with pytest.raises(CodecError) as exc:
        Quantity.parse(bad, "spec.devices[0].resources.koordinator.sh/gpu-memory")
    assert exc.value.field == "spec.devices[0].resources.koordinator.sh/gpu-memory"
    assert repr(bad) in str(exc.value)


@pytest.mark.parametrize("bad", [None, True, [1], {"a": 1}])
def test_wrong_types_are_rejected(bad: object) -> None:
    with pytest.raises(CodecError, match="expected a quantity"):
        Quantity.parse(bad)


_formats = st.sampled_from(list(Format))


@given(st.integers(min_value=-(10**18), max_value=10**18), _formats)
def test_round_trip_through_canonical_string(nanos: int, fmt: Format) -> None:
    q = Quantity(nanos, fmt)
    text = str(q)
    again = Quantity.parse(text)
    assert again == q
    # A binary value that is no multiple of 1024 prints without suffix and re-parses as decimal
    # (as in apimachinery); from there the canonical form is a fixed point.
    assert canonical(str(again)) == str(again)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e2", "e-3"]),
)
def test_parse_then_print_is_idempotent(number: int, suffix: str) -> None:
    once = canonical(f"{number}{suffix}")
    assert canonical(once) == once
