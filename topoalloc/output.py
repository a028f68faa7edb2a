"""`-o/--output` for the subcommands people script against: the human form by default, or the
same facts as JSON or YAML on stdout."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
import yaml

F = TypeVar("F", bound=Callable[..., Any])


def output_option(human: str, what: str) -> Callable[[F], F]:
    """The -o option: `human` (the default text form, named for what it is) or json or yaml."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice([human, "json", "yaml"]),
        default=human,
        show_default=True,
        help=f"Print {what} as {human}, or as JSON or YAML for scripts.",
    )


def dump(data: Any, fmt: str) -> str:
    """`data` as JSON (one line per document, a trailing newline) or YAML."""
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def ago(seconds: float) -> str:
    """A duration as people say it: 45s, 12m, 3h10m, 2d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"
