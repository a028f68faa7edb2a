"""The allocator's JSON codec: orjson's speed, `json`'s reach (what orjson refuses still decodes,
what it cannot write is still written)."""

from __future__ import annotations

import json
import math

from allocator.runtime.json_codec import dumps, loads


def test_what_orjson_refuses_decodes_as_json_does() -> None:
    for raw in (b'{"a": NaN}', b'{"a": "\\ud800"}'):
        got, want = loads(raw), json.loads(raw)
        assert got.keys() == want.keys()
        assert repr(got["a"]) == repr(want["a"]) or (math.isnan(got["a"]) and math.isnan(want["a"]))
    assert loads(b'{"pod": {"spec": {}}}') == {"pod": {"spec": {}}}


def test_dumps_is_compact_sorted_on_request_and_reaches_what_orjson_cannot_write() -> None:
    assert dumps({"b": 1, "a": [1, 2]}) == b'{"b":1,"a":[1,2]}'
    assert dumps({"b": 1, "a": 2}, sort_keys=True) == b'{"a":2,"b":1}'
    big = {"n": 2**70}
    assert json.loads(dumps(big)) == big
    assert dumps({1: "x"}) == b'{"1":"x"}'  # a key that is not a string, as json writes it
