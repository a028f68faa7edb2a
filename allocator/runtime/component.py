"""What every optional part of the allocator process is to the process: a `Component`.

Gang scheduling, Reservations, DRA claims, defragmentation, scarce-resource avoidance (and any
part to come) each implement it structurally; allocator/assembly.py builds the list of those the
configuration turns on and hands the runtime what each brings: admission routes (served on the
runtime's one admission server), a watch handler (told every change the watch cache takes in),
steering (allocator/runtime/steering.py), and background work started and stopped with the
process. A part that is off is simply not in the list: nothing anywhere asks whether it is there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from allocator.runtime.admission import Reviewer
from allocator.runtime.steering import Steering, SteeringChain
from allocator.runtime.tasks import Spawn

JSON = dict[str, Any]


class Component(Protocol):
    name: str

    def routes(self) -> Mapping[str, Reviewer]:
        """Admission routes (path -> reviewer); {} for none."""
        ...

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        """A change the watch cache took in (kind name, object key, the object or None)."""
        ...

    def steering(self) -> Sequence[Steering]:
        """What it steers of the core's node decisions (none: ())."""
        ...

    def start(self, spawn: Spawn) -> None:
        """Spawn its background work (controllers, loops)."""
        ...

    def stop(self) -> None:
        """The process stops: hold nothing."""
        ...


class Components:
    """The components that are on, in the order they were built."""

    def __init__(self, parts: Sequence[Component]) -> None:
        self.parts = tuple(parts)
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"components named twice: {names}")

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.parts)

    def routes(self) -> dict[str, Reviewer]:
        out: dict[str, Reviewer] = {}
        for part in self.parts:
            for path, reviewer in part.routes().items():
                if path in out:
                    raise ValueError(f"admission route {path} served twice")
                out[path] = reviewer
        return out

    def steering(self) -> SteeringChain:
        return SteeringChain([s for part in self.parts for s in part.steering()])

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        for part in self.parts:
            part.observe(kind, key, obj)

    def start(self, spawn: Spawn) -> None:
        for part in self.parts:
            part.start(spawn)

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()
