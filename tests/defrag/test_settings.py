"""The `defrag:` block refuses settings that make no sense, naming the key as the file spells it."""

from __future__ import annotations

import pytest

from allocator.runtime.config import ServiceConfig


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"interval": 0}, "defrag.interval: expected a positive number of seconds"),
        ({"window": 0}, "defrag.window: expected a positive number of seconds"),
        ({"reserveTimeout": 0}, "defrag.reserveTimeout: expected a positive number of seconds"),
        ({"maxMigrating": -1}, "defrag.maxMigrating: expected 0 or more"),
        ({"maxMigratingPerNamespace": -1}, "defrag.maxMigratingPerNamespace: expected 0 or more"),
        ({"maxMigratingPerWorkload": -1}, "defrag.maxMigratingPerWorkload: expected 0 or more"),
        ({"maxPerWindow": -2}, "defrag.maxPerWindow: expected 0 or more"),
        ({"maxMovesPerPlan": -1}, "defrag.maxMovesPerPlan: expected 0 or more"),
    ],
)
def test_a_nonsense_setting_is_refused(block: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServiceConfig.from_mapping({"defrag": block})


def test_zero_caps_are_allowed_they_hold_every_move() -> None:
    config = ServiceConfig.from_mapping({"defrag": {"enabled": True, "maxMigrating": 0}})
    assert config.defrag.enabled and config.defrag.max_migrating == 0
