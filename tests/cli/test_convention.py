"""One convention for every subcommand (issue 18, "CLI consistency"): help for every option,
whole help summaries, the exit-status table in `topoalloc --help`, `error:` lines on stderr, the
same exit status for the same kind of failure, and tracebacks only with --debug."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.cli.conftest import DGX_DEVICE, Ran
from topoalloc.cli import SUBCOMMANDS, main

Run = Callable[..., Ran]


def _commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(main)

    def walk(cmd: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                yield from walk(sub, f"{path} {name}")

    return walk(main, "topoalloc")


def test_every_option_has_help_and_every_command_a_summary() -> None:
    missing = [
        f"{path} {'/'.join(p.opts)}"
        for path, cmd in _commands()
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not p.help
    ]
    assert missing == []
    assert all(cmd.help for _path, cmd in _commands())


def test_top_level_help_has_whole_summaries_and_the_exit_table(topoalloc: Run) -> None:
    ran = topoalloc("--help")
    assert ran.code == 0
    commands = ran.stdout.split("Commands:")[1]
    assert "..." not in commands
    for name in SUBCOMMANDS:
        assert f"\n  {name} " in commands
    for row in ("0  success", "1  runtime failure", "2  usage error or bad input", "--debug"):
        assert row in ran.stdout


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_unknown_option_is_a_usage_error_everywhere(topoalloc: Run, name: str) -> None:
    ran = topoalloc(name, "--zz-unknown")  # far from every real option: no did-you-mean
    assert ran.code == 2 and ran.clean_error, ran
    assert ran.stderr.startswith("error: no such option '--zz-unknown' (see '")


def test_a_missing_file_is_exit_2_everywhere(topoalloc: Run, tmp_path: Path) -> None:
    nope = tmp_path / "nope.yaml"
    cases = [
        ("allocate", "--device", nope, "--pod", nope),
        ("allocate", "--device", DGX_DEVICE, "--pod", nope),
        ("inspect", nope),
        ("agent", "--config", nope, "--once", "--print"),
        ("simulate", "--workload", nope, "--no-plots"),
        ("allocator", "--config", nope),
        ("certs", "--ca-cert", nope, "--ca-key", nope),
    ]
    for args in cases:
        ran = topoalloc(*args)
        assert ran.code == 2 and ran.clean_error, (args, ran)
        assert str(nope) in ran.stderr or "nope.yaml" in ran.stderr, (args, ran.stderr)


def test_internal_errors_are_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import apis.documents

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(apis.documents.yaml, "safe_load_all", boom)
    pod = tmp_path / "pod.yaml"
    pod.write_text("kind: Pod\n")
    args = ["allocate", "--device", str(DGX_DEVICE), "--pod", str(pod)]
    quiet = CliRunner().invoke(main, args)
    assert quiet.exit_code == 1 and isinstance(quiet.exception, SystemExit)
    assert quiet.stderr == "error: internal error (RuntimeError): a bug; run with --debug for the traceback\n"
    loud = CliRunner().invoke(main, ["--debug", *args])
    assert isinstance(loud.exception, RuntimeError)  # the traceback is shown, not swallowed
    again = CliRunner().invoke(main, args)  # --debug lasts one invocation
    assert again.exit_code == 1 and isinstance(again.exception, SystemExit)


def test_results_on_stdout_messages_on_stderr(topoalloc: Run) -> None:
    ran = topoalloc(
        "allocate", "--device", DGX_DEVICE, "--pod", Path(__file__).parents[2] / "examples" / "pod.yaml"
    )
    assert ran.code == 0 and ran.stdout.startswith('{"gpu":') and ran.stderr == ""
