from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.agent.deviceplugin.rig import Rig
from tests.support.fakeapi import FakeApiServer


@pytest.fixture
def make_rig(fake_api_thread: FakeApiServer, fake_api_sync_client) -> Iterator[Callable[[str], Rig]]:
    rigs: list[Rig] = []

    def make(fixture_name: str) -> Rig:
        rig = Rig(fake_api_thread, fake_api_sync_client, fixture_name)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()
