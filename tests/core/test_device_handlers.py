"""Every device type the request parser knows has a handler behind the one interface."""

from __future__ import annotations

from allocator.core.devices.handler import DeviceHandler
from allocator.core.devices.registry import HANDLERS
from allocator.core.request.pod_request import TYPE_ORDER


def test_every_device_type_has_a_handler() -> None:
    assert set(HANDLERS) == set(TYPE_ORDER)
    for dtype, handler in HANDLERS.items():
        assert isinstance(handler, DeviceHandler), dtype
