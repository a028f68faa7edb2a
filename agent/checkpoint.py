"""The agent's state that must outlive a restart, in msgpack files written atomically.

`FILE_NAME` (the device plugins' service): which pods were served which devices (so a restarted
agent never hands them out again and can cross-check them), the mid-tier usage windows and the Xid
history. The DRA plugin keeps its prepared claims in a file of its own (agent/dra/prepared.py),
written before each answer to kubelet. Each file carries a format version; a file that is
unreadable, corrupt or of another version is set aside with a warning and the agent starts empty,
never crashes.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from agent import host_paths

log = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = "agent-checkpoint.msgpack"
DEFAULT_STATE_DIR = host_paths.STATE  # where the agent keeps its checkpoints


def save(
    path: str | Path, state: dict[str, Any], *, now: float | None = None, version: int = VERSION
) -> None:
    """Write `state` (msgpack-able) so that a reader sees the old file or the new one, never half,
    and the new one survives a power cut once this returns (file and directory fsynced)."""
    data = msgpack.packb({"version": version, "savedAt": time.time() if now is None else now, "state": state})
    write_atomically(path, data)


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never half, and the new
    one is on disk (file and directory fsynced) once this returns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: str | Path, *, version: int = VERSION) -> tuple[dict[str, Any], float] | None:
    """(state, savedAt), or None when there is no usable checkpoint (the reason is logged)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("checkpoint %s unreadable, starting empty: %s", path, exc)
        return None
    try:
        doc = msgpack.unpackb(raw, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        log.warning("checkpoint %s is corrupt, discarded: %s", path, exc)
        return None
    if not isinstance(doc, dict) or doc.get("version") != version:
        found = doc.get("version") if isinstance(doc, dict) else None
        log.warning("checkpoint %s has version %r, this agent reads %d: discarded", path, found, version)
        return None
    state, saved = doc.get("state"), doc.get("savedAt")
    if not isinstance(state, dict) or not isinstance(saved, int | float):
        log.warning("checkpoint %s is corrupt (no state), discarded", path)
        return None
    return state, float(saved)
