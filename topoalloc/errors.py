"""One error convention for every `topoalloc` subcommand, applied once at the top of the CLI.

A failure is one line on stderr, `error: <what> (<where>): <why>`, and the exit status says its
kind: 2 for a usage error or bad input (a flag, a file, a document the user gave), 1 for a runtime
failure (the cluster, the network, the machine), 0 only for success. Nothing a user can type ends
in a Python traceback: an unexpected exception is reported in one line as an internal error,
and `topoalloc --debug ...` (or TOPOALLOC_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from apis.errors import CodecError, InputError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

#: The table shown at the end of `topoalloc --help` and in docs/cli.md.
EXIT_TABLE = """\b
Errors: one line on stderr, "error: <what> (<where>): <why>".
Exit status:
  0  success (allocate: the pod fits)
  1  runtime failure: the cluster, the network or the machine failed
     (allocate: the pod does not fit; the reason is on stdout)
  2  usage error or bad input: an unknown flag, a bad value, a file
     that cannot be read or decoded, a Pod Kubernetes would refuse
  130 interrupted (Ctrl-C)
--debug (or TOPOALLOC_DEBUG=1) shows the traceback of an internal error."""


class _ConventionError(click.ClickException):
    """A failure said as `<what> (<where>): <why>`; the subclass sets the exit status."""

    def __init__(self, what: str, where: str = "", why: str = "") -> None:
        text = f"{what} ({where}): {why}" if where else f"{what}: {why}" if why else what
        super().__init__(text)


class BadInput(_ConventionError):
    """Input the user gave is unusable: exit 2."""

    exit_code = EXIT_USAGE


class Failure(_ConventionError):
    """The work itself failed (cluster, network, machine): exit 1."""

    exit_code = EXIT_FAILURE


def debug_enabled() -> bool:
    return os.environ.get("TOPOALLOC_DEBUG", "") not in ("", "0")


def _say(message: str) -> None:
    click.echo(f"error: {message}", err=True)


def _usage_message(exc: click.UsageError) -> str:
    text = exc.format_message()
    if isinstance(exc, click.BadParameter) and text.startswith("Invalid value for "):
        text = "invalid value for " + text[len("Invalid value for ") :]
    elif text[:1].isupper() and not text[1:2].isupper():
        text = text[0].lower() + text[1:]
    text = text.rstrip(".")
    ctx = exc.ctx
    if ctx is not None:
        text += f" (see '{ctx.command_path} --help')"
    return text


def _no_args_message(exc: click.UsageError) -> str:
    ctx = exc.ctx
    if ctx is None:
        return "no command given"
    usage = " ".join(ctx.command.collect_usage_pieces(ctx))
    return f"no command given: usage: {ctx.command_path} {usage} (see '{ctx.command_path} --help')"


def run(command: click.Command, args: Sequence[str] | None = None, **extra: Any) -> int:
    """Invoke `command` the way its console script does, applying the convention. Returns the
    exit status (the console script passes it to sys.exit)."""
    saved = os.environ.get("TOPOALLOC_DEBUG")
    try:
        return _run(command, args, **extra)
    finally:  # --debug lasts one invocation (tests run many in one process)
        if saved is None:
            os.environ.pop("TOPOALLOC_DEBUG", None)
        else:
            os.environ["TOPOALLOC_DEBUG"] = saved


def _run(command: click.Command, args: Sequence[str] | None, **extra: Any) -> int:
    try:
        result = command.main(args=args, standalone_mode=False, **extra)
    except click.exceptions.NoArgsIsHelpError as exc:
        # A bare `topoalloc` is a usage error like any other: one line, not the whole help.
        _say(_no_args_message(exc))
        return EXIT_USAGE
    except click.UsageError as exc:
        _say(_usage_message(exc))
        return EXIT_USAGE
    except click.ClickException as exc:
        _say(exc.format_message())
        return exc.exit_code if exc.exit_code in (EXIT_FAILURE, EXIT_USAGE) else EXIT_FAILURE
    except click.Abort:
        _say("interrupted")
        return 130
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (`topoalloc ... | head`): nothing to tell it; no noise at exit.
        with contextlib.suppress(OSError, ValueError):  # stdout may be no real file (tests)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except (InputError, CodecError) as exc:
        if debug_enabled():
            raise
        _say(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        if debug_enabled():
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        _say(f"{type(exc).__name__}{where}: {exc.strerror or exc}")
        return EXIT_FAILURE
    except SystemExit:
        raise
    except Exception as exc:
        if debug_enabled():
            raise
        _say(f"internal error ({type(exc).__name__}): {exc}; run with --debug for the traceback")
        return EXIT_FAILURE
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    return EXIT_OK


def enable_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """The --debug flag's callback: later errors show their traceback."""
    if value:
        os.environ["TOPOALLOC_DEBUG"] = "1"
    return value


class ConventionGroup(click.Group):
    """A group whose console-script run applies the convention (`run`) to every subcommand."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        sys.exit(run(self, args, prog_name=prog_name, complete_var=complete_var, **extra))
