"""The controllers' work queue: de-duplication, delays, per-key backoff, busy keys, resync."""

from __future__ import annotations

import math

from allocator.runtime.workqueue import Backoff, WorkQueue


def test_a_key_added_many_times_is_taken_once() -> None:
    q = WorkQueue()
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert q.take(0).keys == {"a", "b"}
    assert q.take(0).keys == set()


def test_add_after_waits_for_its_time_and_the_earliest_time_wins() -> None:
    q = WorkQueue()
    q.add_after("a", 10, now=0)
    q.add_after("a", 5, now=0)
    q.add_after("a", 20, now=0)
    assert q.take(4.9).keys == set()
    assert q.waiting("a", 4.9)
    assert q.next_due() == 5
    assert q.take(5).keys == {"a"}
    assert q.next_due() == math.inf


def test_add_brings_a_delayed_key_now() -> None:
    q = WorkQueue()
    q.add_after("a", 10, now=0)
    q.add("a")
    assert not q.waiting("a", 1)
    assert q.take(1).keys == {"a"}
    assert q.take(11).keys == set()  # the delayed entry went with it


def test_retry_pauses_double_per_key_up_to_the_cap_and_forget_starts_again() -> None:
    q = WorkQueue(Backoff(initial=1, cap=5))
    assert [q.retry("a", now=0) for _ in range(5)] == [1, 2, 4, 5, 5]
    assert q.retry("b", now=0) == 1  # per key
    q.forget("a")
    assert q.retry("a", now=0) == 1
    assert q.retries("a") == 1


def test_a_retry_replaces_a_ready_entry() -> None:
    q = WorkQueue(Backoff(initial=2, cap=8))
    q.add("a")
    q.retry("a", now=0)
    assert q.take(1).keys == set()
    assert q.take(2).keys == {"a"}


def test_a_busy_key_is_never_handed_out_and_comes_back_once_done() -> None:
    q = WorkQueue()
    q.begin(["a"])
    q.add("a")
    q.add("b")
    assert q.take(0).keys == {"b"}
    assert q.busy("a")
    q.done(["a"])
    assert q.take(0).keys == {"a"}


def test_a_busy_key_not_added_meanwhile_does_not_come_back() -> None:
    q = WorkQueue()
    q.begin(["a"])
    q.done(["a"])
    assert q.take(0).keys == set()


def test_a_delayed_key_due_while_busy_comes_back_once_done() -> None:
    q = WorkQueue()
    q.add_after("a", 1, now=0)
    q.begin(["a"])
    assert q.take(2).keys == set()
    q.done(["a"])
    assert q.take(2).keys == {"a"}


def test_full_is_asked_once() -> None:
    q = WorkQueue()
    q.request_full()
    assert q.pending(0)
    assert q.take(0).full
    assert not q.take(0).full
    assert not q.pending(0)


def test_remove_forgets_everything_of_a_key() -> None:
    q = WorkQueue()
    q.add("a")
    q.add_after("b", 1, now=0)
    q.retry("b", now=0)
    q.remove("a")
    q.remove("b")
    assert q.take(100).keys == set()
    assert q.retries("b") == 0
    assert len(q) == 0
