"""Generated pods and bodies (tests/support/fuzzing.py, the generators of bench/fuzz.py) against
the running extender over mutual TLS: never a 5xx, and every offered node passed or explained."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import fuzzing as fz
from tests.support.allocator_harness import running_allocator, seed_nodes
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki

NODES = ["gpu-1", "gpu-2"]


@pytest.fixture
async def run(fake_api: FakeApiServer, pki: Pki):  # type: ignore[no-untyped-def]
    seed_nodes(fake_api, NODES)
    async with running_allocator(fake_api, pki) as running:
        yield running


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
async def test_generated_calls_are_answered_and_explained(run, rng: random.Random) -> None:  # type: ignore[no-untyped-def]
    verb, body = fz.extender_body(rng, fz.pod(rng), NODES)
    status, reply = await run.client.post(verb, body)
    assert status in (200, 400), (status, reply, body[:300])
    if status == 200 and verb == "filter":
        offered = json.loads(body).get("NodeNames")
        if isinstance(offered, list):
            passed = set(reply["NodeNames"] or [])
            explained = passed | set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"])
            if run.service.round_trips == 1 and len(passed) == 1:
                # One round trip: the best node alone passes; the others that fit are left out of
                # the reply by design (allocator/extender/handlers/filter.py), never wrongly failed.
                assert not passed & (set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"]))
            else:
                assert fz.as_go_reads(offered) <= explained, reply
