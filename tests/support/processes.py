"""Daemons for the real-cluster tier and the benchmarks: started in their own session, logged to a
file, ended by PID; plus the deadline-bound wait every test uses instead of a bare sleep."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3

HOST = "127.0.0.1"


class ControlPlaneError(RuntimeError):
    """A component did not start, died or missed its deadline; the message carries its log tail."""


def free_port() -> int:
    """A port free on HOST now, for a daemon that binds it later (see `free_ports`)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on HOST now, for daemons that bind them later: one process's ports
    are picked together, since a port picked and closed may be handed out again at once. Under
    pytest-xdist each worker takes ports from its own blocks of 64 (block number modulo the worker
    count; not parity: Linux hands bind() odd ports only), so that a port one worker picked and has
    not bound yet is never handed to another worker's daemon."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) % count if worker.startswith("gw") and worker[2:].isdigit() else 0
    held: list[socket.socket] = []  # kept open so the kernel offers another port each try
    found: list[int] = []
    try:
        for _ in range(64 * count * n):
            s = socket.socket()
            held.append(s)
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
            if (port >> 6) % count == index:
                found.append(port)
                if len(found) == n:
                    return found
        # a crowded range: any free ports, as without workers
        return (found + [int(s.getsockname()[1]) for s in held if int(s.getsockname()[1]) not in found])[:n]
    finally:
        for s in held:
            s.close()


def wait_until(
    check: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    process: Process | None = None,
) -> Any:
    """Call `check` until it returns something truthy (returned) or `timeout` seconds pass.

    Exceptions from `check` count as "not yet". A `process` that exits ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
        except Exception as exc:
            last, result = exc, None
        if result:
            return result
        if process is not None and not process.alive():
            raise ControlPlaneError(
                f"{process.name} exited ({process.returncode()}) while waiting for {what}"
            )
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else ""
            tail = f"\n{process.tail()}" if process else ""
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{tail}")
        time.sleep(interval)


class Process:
    """One daemon: started in its own session, output to a log file, ended by its PID."""

    def __init__(self, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = dict(env) if env is not None else None
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; always reaps the process."""
        if self.popen is None:
            return
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def kill(self) -> None:
        """SIGKILL now (a crash), and reap."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(10)

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        body = "\n".join(self.text().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.popen.pid if self.popen else '-'}, log {self.log}) ---\n{body}"


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """Silence urllib3's unverified-HTTPS warning for health probes of self-signed endpoints."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield
