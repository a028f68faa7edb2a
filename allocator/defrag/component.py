"""Defragmentation as a component of the allocator process (allocator/runtime/component.py): the
migration controller, on the leader. No route and no steering: its moves reach pods through
Reservations, which the Reservations component steers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from allocator.defrag.controller import MigrationController
from allocator.runtime.admission import Reviewer
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn

JSON = dict[str, Any]


class Defragmentation:
    """A `Component`."""

    name = "defrag"

    def __init__(self, controller: MigrationController) -> None:
        self.controller = controller

    def routes(self) -> Mapping[str, Reviewer]:
        return {}

    def steering(self) -> Sequence[Steering]:
        return ()

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        pass

    def start(self, spawn: Spawn) -> None:
        spawn("defrag controller", self.controller.run())

    def stop(self) -> None:
        pass
