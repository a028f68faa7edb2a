from __future__ import annotations

import pytest

from tests.gang.native import GANG_KINDS, GangKind, serve_native_gangs
from tests.support.fakeapi import FakeApiServer


@pytest.fixture(params=GANG_KINDS, ids=lambda k: k.id)
def gang_kind(request: pytest.FixtureRequest, fake_api: FakeApiServer) -> GangKind:
    """A scenario run once with a scheduler-plugins PodGroup and once with Kubernetes' own (served)."""
    kind: GangKind = request.param
    if kind.native:
        serve_native_gangs(fake_api)
    return kind
