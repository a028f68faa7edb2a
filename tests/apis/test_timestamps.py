"""Kubernetes timestamps: Time and MicroTime as kube-apiserver writes them; a parser that never raises."""

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.timestamps import format_time, micro_time, parse_time

# 2027-01-15T08:00:00Z
MOMENT = 1_800_000_000


def test_time_is_utc_to_the_second() -> None:
    assert format_time(MOMENT) == "2027-01-15T08:00:00Z"
    assert format_time(0) == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.7, 0.9999996])
def test_time_cuts_the_fraction_never_rounds_up(fraction: float) -> None:
    # .9999996 is where rounding to microseconds first (datetime.fromtimestamp) would give 08:00:01.
    assert format_time(MOMENT + fraction) == "2027-01-15T08:00:00Z"


def test_time_before_the_epoch_cuts_towards_the_past() -> None:
    assert format_time(-0.5) == "1969-12-31T23:59:59Z"


def test_micro_time_has_exactly_six_fractional_digits() -> None:
    # The API server's RFC3339Micro parser refuses a MicroTime whose zero fraction is left out.
    assert micro_time(MOMENT) == "2027-01-15T08:00:00.000000Z"
    assert micro_time(MOMENT + 0.25) == "2027-01-15T08:00:00.250000Z"
    assert micro_time(MOMENT + 0.000001) == "2027-01-15T08:00:00.000001Z"


def test_now_is_the_default() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0).timestamp()
    stamped_time, stamped_micro = format_time(), micro_time()
    after = dt.datetime.now(dt.UTC).timestamp()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamped_time)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamped_micro)
    assert before <= parse_time(stamped_time) <= after
    assert before <= parse_time(stamped_micro) <= after


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2027-01-15T08:00:00Z", MOMENT),
        ("2027-01-15T08:00:00.250000Z", MOMENT + 0.25),
        ("2027-01-15T08:00:00.5Z", MOMENT + 0.5),
        ("2027-01-15T08:00:00.123456789Z", MOMENT + 0.123456),  # RFC3339Nano: cut to microseconds
        ("2027-01-15T10:00:00+02:00", MOMENT),
        ("2027-01-15T03:30:00-04:30", MOMENT),
        ("2027-01-15T08:00:00", MOMENT),  # no offset: UTC, not the machine's zone
    ],
)
def test_parses_what_the_api_server_and_go_clients_write(text: str, seconds: float) -> None:
    assert parse_time(text) == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "yesterday",
        "2027-13-15T08:00:00Z",  # month 13
        "2027-02-30T08:00:00Z",  # no such day
        "2027-01-15T25:00:00Z",
        "2027-01-15T08:00:00ZZ",
        "2027-01-15T08:00:00+25:00",
        " 2027-01-15T08:00:00Z",
        "1800000000",
        None,
        1_800_000_000,
        ["2027-01-15T08:00:00Z"],
    ],
)
def test_malformed_input_is_none_never_an_exception(value: object) -> None:
    assert parse_time(value) is None


@given(st.integers(min_value=0, max_value=253_402_300_799))  # up to 9999-12-31T23:59:59Z
def test_time_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_time(format_time(seconds)) == seconds


# Until 2100: a float holds every microsecond up to 2**53 of them (the year 2255).
@given(st.integers(min_value=0, max_value=4_102_444_800_000_000))
def test_micro_time_round_trips_microseconds(micros: int) -> None:
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    assert parse_time(micro_time(moment.timestamp())) == pytest.approx(moment.timestamp(), abs=1e-6)


@given(st.text(max_size=40))
def test_any_text_parses_or_is_none(text: str) -> None:
    assert parse_time(text) is None or isinstance(parse_time(text), float)
