"""Agent processes started in a fraction of a second, for tests that kill and restart an agent many
times (a cold `topoalloc agent` takes a second or more just to import its stack).

`AgentForkServer` runs this module as a process that imports the agent's modules once and then,
per request, forks a child that runs `topoalloc <argv>` exactly as the console script does: its own
session, stdin from /dev/null, stdout and stderr to a log file, its own exit status. The child is an
ordinary agent process (SIGKILL it like any other); only the imported code is shared with the
server. The server creates no gRPC object and no thread before forking, which is what makes a fork
with grpc loaded safe.

Requests are JSON lines on the server's stdin, answers JSON lines on its stdout:
`{"start": [argv...], "log": path}` -> `{"pid": n}`; `{"reap": pid}` -> `{"status": waitpid status}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

PRELOAD = (
    "topoalloc.cli",
    "topoalloc.commands.agent",
    "agent.main_loop",
    "agent.deviceplugin.service",
    "agent.fixtures.loader",
    "agent.healthz",
    "agent.kube",
)


def _child(argv: list[str], log: str) -> None:
    """Runs in the forked child: become `topoalloc <argv>`; never returns."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's whole life
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        from topoalloc.cli import main

        try:
            main(argv, prog_name="topoalloc")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the child must never fall back into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                _child([str(a) for a in request["start"]], str(request["log"]))
            answer: dict[str, Any] = {"pid": pid}
        elif "reap" in request:
            _, status = os.waitpid(int(request["reap"]), 0)
            answer = {"status": status}
        else:
            answer = {"error": f"unknown request {request}"}
        print(json.dumps(answer), flush=True)


class AgentForkServer:
    """The test side: start agent processes (`start`), kill them, reap them (`reap`)."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.agent_forkserver"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        hello = self._read()
        if "ready" not in hello:
            raise RuntimeError(f"agent fork server did not start: {hello}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent fork server exited ({self.proc.poll()})")
        return dict(json.loads(line))

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            return self._read()

    def start(self, argv: list[str], log: Path) -> int:
        """A new agent process running `topoalloc <argv>`; its PID."""
        return int(self._ask({"start": argv, "log": str(log)})["pid"])

    def reap(self, pid: int) -> int:
        """Wait for an agent process to end (kill it first); its waitpid status."""
        return int(self._ask({"reap": pid})["status"])

    def kill(self, pid: int) -> None:
        """SIGKILL one agent process and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.reap(pid)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve()
