from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.agent.dra.rig import DraRig
from tests.support.fakeapi import FakeApiServer


@pytest.fixture
def make_rig(fake_api_thread: FakeApiServer, fake_api_sync_client) -> Iterator[Callable[..., DraRig]]:
    rigs: list[DraRig] = []

    def make(fixture_name: str = "dgx-h100") -> DraRig:
        rig = DraRig(fake_api_thread, fake_api_sync_client, fixture_name)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


@pytest.fixture
def rig(make_rig: Callable[..., DraRig]) -> DraRig:
    """A DGX H100 in dra mode with the stand-in kubelet, the agent registered with it."""
    rig = make_rig("dgx-h100")
    rig.start_kubelet()
    rig.start_agent()
    return rig
