"""The append-only journal (agent/journal.py): records replay in order after a crash, a torn or
corrupt tail is cut off, and rotation drops only records a durable checkpoint already holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.journal import Journal, read_segment


def _reopened(tmp_path: Path) -> list:
    """What a restarted process replays (a new Journal on the same files)."""
    return Journal(tmp_path, "j").replay()


def test_records_replay_in_order_after_a_crash(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j")
    assert j.replay() == []
    j.open()
    for n in range(5):
        j.append({"n": n, "ids": [f"GPU-{n}"]})
    # no close(): a crash; the segments are pre-sized, so only their content tells the records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.0", "j.1"]
    assert (tmp_path / "j.0").stat().st_size == (tmp_path / "j.1").stat().st_size
    assert _reopened(tmp_path) == [{"n": n, "ids": [f"GPU-{n}"]} for n in range(5)]


def test_open_starts_empty(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j")
    j.open()
    j.append({"n": 1})
    j2 = Journal(tmp_path, "j")
    assert j2.replay() == [{"n": 1}]
    j2.open()  # the owner saved what replay gave it; the journal starts over
    assert _reopened(tmp_path) == []
    j2.append({"n": 2})
    assert _reopened(tmp_path) == [{"n": 2}]


@pytest.mark.parametrize("damage", ["torn", "bit flip"])
def test_a_damaged_last_record_ends_the_segment(tmp_path: Path, damage: str) -> None:
    j = Journal(tmp_path, "j")
    j.open()
    j.append({"n": 1})
    j.append({"n": 2, "pad": "x" * 40})
    data = bytearray((tmp_path / "j.0").read_bytes())
    assert len(read_segment(bytes(data))) == 2
    first = 8 + int.from_bytes(data[0:4], "little")  # frame: length, CRC-32, msgpack body
    last = 8 + int.from_bytes(data[first : first + 4], "little")
    if damage == "torn":  # the second write reached the disk only in part
        data[first + last // 2 : first + last] = bytes(last - last // 2)
    else:
        data[first + last - 1] ^= 0x01
    (tmp_path / "j.0").write_bytes(bytes(data))
    assert _reopened(tmp_path) == [{"n": 1}]


def test_rotation_keeps_every_record_until_released(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j")
    j.open()
    j.append({"n": 1})
    release = j.rotate()
    j.append({"n": 2})
    # crash before the checkpoint taken with the rotation was durable: both segments replay
    assert _reopened(tmp_path) == [{"n": 1}, {"n": 2}]
    release()  # the checkpoint holds n=1 now
    assert _reopened(tmp_path) == [{"n": 2}]
    release2 = j.rotate()
    j.append({"n": 3})
    release2()
    assert _reopened(tmp_path) == [{"n": 3}]


def test_a_failed_checkpoint_never_lets_new_records_overwrite_old_ones(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j")
    j.open()
    j.append({"n": 1})
    j.rotate()  # its checkpoint failed: no release
    j.append({"n": 2})
    release = j.rotate()  # the other segment still holds n=1: appends stay where they are
    j.append({"n": 3})
    assert _reopened(tmp_path) == [{"n": 1}, {"n": 2}, {"n": 3}]
    release()  # this checkpoint holds n=1 and n=2 (and n=3 too; replaying it again is harmless)
    assert _reopened(tmp_path) == [{"n": 2}, {"n": 3}]


def test_append_before_open_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not open"):
        Journal(tmp_path, "j").append({"n": 1})


def test_a_full_segment_grows(tmp_path: Path) -> None:
    j = Journal(tmp_path, "j", segment_bytes=256)
    j.open()
    for n in range(20):
        j.append({"n": n, "pad": "y" * 30})
    assert _reopened(tmp_path) == [{"n": n, "pad": "y" * 30} for n in range(20)]


def test_a_burst_is_synced_soon_in_few_rounds(tmp_path: Path, monkeypatch) -> None:
    """Appends return before any fdatasync; the flusher then syncs a burst together (group commit).
    The flusher's wait for the burst's next records ends when the test says so, not on a clock, so
    a loaded machine cannot sync part of the burst early."""
    import os
    import threading
    import time
    import types

    from agent import journal

    # What each sync was of: os.fdatasync is patched for the whole process, and a journal another
    # test left open may sync its own files meanwhile.
    synced: list[str] = []
    real = os.fdatasync
    monkeypatch.setattr(
        os, "fdatasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1]
    )
    burst_done, waited = threading.Event(), threading.Event()

    def burst_window(_seconds: float) -> None:
        waited.set()
        burst_done.wait(10)

    monkeypatch.setattr(journal, "time", types.SimpleNamespace(sleep=burst_window))
    j = Journal(tmp_path, "j", sync_delay=0.2)
    j.open()
    synced.clear()
    for n in range(50):
        j.append({"n": n})
    assert waited.wait(10)  # the first append woke the flusher, which waits for the burst
    assert not [p for p in synced if p.startswith(str(tmp_path))]  # none of this journal's yet
    burst_done.set()
    deadline = time.monotonic() + 10
    while j.syncs == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert j.syncs == 1, j.syncs  # 50 records, one round
    j.close()
