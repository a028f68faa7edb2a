"""The soak's invariants (tests/soak/invariants.py) on hand-made snapshots: each violating snapshot is
caught, its healthy neighbour is not, and transient conditions only once they outlast the grace."""

from __future__ import annotations

from tests.soak.invariants import (
    Checker,
    ClaimView,
    GangView,
    Limits,
    PodView,
    ReservationView,
    Served,
    Snapshot,
    Violation,
)

U0, U1 = "GPU-0", "GPU-1"


def kinds(violations: list[Violation]) -> list[str]:
    return sorted(v.invariant for v in violations)


def bound(key: str, gpus: dict[str, int] | None = None, **kw: object) -> PodView:
    return PodView(key, created=0.0, node="n1", gpus=gpus if gpus is not None else {U0: 100}, **kw)  # type: ignore[arg-type]


def test_a_whole_gpu_served_to_two_live_pods_is_caught_and_shares_within_the_whole_are_not() -> None:
    snap = Snapshot(now=1.0, pods={"a": bound("a"), "b": bound("b")})
    snap.served = {k: Served(k, "n1", {U0: 100}, ()) for k in ("a", "b")}
    assert kinds(Checker().check(snap)) == ["device-served-twice"]
    snap.pods = {"a": bound("a", {U0: 50}), "b": bound("b", {U0: 50})}
    snap.served = {k: Served(k, "n1", {U0: 50}, ()) for k in ("a", "b")}
    assert Checker().check(snap) == []
    # a finished pod holds nothing
    snap.pods = {"a": bound("a"), "b": bound("b", finished=True)}
    snap.served = {k: Served(k, "n1", {U0: 100}, ()) for k in ("a", "b")}
    assert Checker().check(snap) == []


def test_a_vf_served_twice_and_a_device_in_two_live_claims() -> None:
    snap = Snapshot(now=1.0, pods={"a": bound("a", {}, vfs=("vf1",)), "b": bound("b", {}, vfs=("vf1",))})
    snap.served = {k: Served(k, "n1", {}, ("vf1",)) for k in ("a", "b")}
    assert kinds(Checker().check(snap)) == ["device-served-twice"]
    claims = {k: ClaimView(k, "n2", ("pool/gpu-0",), ("pool/gpu-0",)) for k in ("c1", "c2")}
    got = kinds(Checker().check(Snapshot(now=1.0, claims=claims)))
    assert got == ["claim-device-allocated-twice", "claim-device-prepared-twice"]
    claims["c2"].live = False
    assert Checker().check(Snapshot(now=1.0, claims=claims)) == []


def test_served_devices_must_be_the_annotated_ones_and_prepared_the_allocated() -> None:
    snap = Snapshot(
        now=1.0, pods={"a": bound("a", {U0: 100})}, served={"a": Served("a", "n1", {U1: 100}, ())}
    )
    (v,) = Checker().check(snap)
    assert v.invariant == "served-not-annotated" and v.subject == "a"
    claim = ClaimView("c", "n2", ("p/gpu-0",), ("p/gpu-1",))
    assert kinds(Checker().check(Snapshot(now=1.0, claims={"c": claim}))) == ["prepared-not-allocated"]


def test_an_unexplained_pending_pod_is_lost_only_after_the_grace_counted_from_the_last_fault() -> None:
    checker = Checker(Limits(grace=10))
    pending = {"p": PodView("p", created=0.0)}
    assert checker.check(Snapshot(now=0.0, pods=pending)) == []
    assert checker.check(Snapshot(now=9.0, pods=pending)) == []
    assert checker.check(Snapshot(now=12.0, pods=pending, last_fault=5.0)) == []  # a fault restarts it
    assert kinds(checker.check(Snapshot(now=16.0, pods=pending, last_fault=5.0))) == ["pod-lost"]
    explained = {"p": PodView("p", created=0.0, explained=True)}
    assert checker.check(Snapshot(now=30.0, pods=explained)) == []
    # the condition went away, so it starts afresh when it comes back
    assert checker.check(Snapshot(now=31.0, pods=pending)) == []
    # faults coming one after the other put it off, but not past max_grace
    checker = Checker(Limits(grace=10, max_grace=30))
    for now in range(0, 30, 5):
        assert checker.check(Snapshot(now=float(now), pods=pending, last_fault=float(now))) == []
    assert kinds(checker.check(Snapshot(now=30.0, pods=pending, last_fault=30.0))) == ["pod-lost"]


def test_a_gang_bound_in_part_and_a_gate_left_on_a_released_gang() -> None:
    checker = Checker(Limits(grace=5))
    pods = {
        "g-0": bound("g-0", gang="ns/g"),
        "g-1": PodView("g-1", created=0.0, gang="ns/g", explained=True, gates=("topoalloc.io/gang",)),
    }
    gangs = {"ns/g": GangView("ns/g", 2, ("g-0", "g-1"))}
    assert checker.check(Snapshot(now=0.0, pods=pods, gangs=gangs)) == []
    assert kinds(checker.check(Snapshot(now=6.0, pods=pods, gangs=gangs))) == [
        "gang-bound-in-part",
        "gate-left",
    ]
    whole = {k: bound(k, gang="ns/g") for k in pods}
    assert checker.check(Snapshot(now=7.0, pods=whole, gangs=gangs)) == []


def test_a_gate_left_on_a_pod_whose_claims_are_allocated() -> None:
    checker = Checker(Limits(grace=0))
    pod = PodView(
        "p", 0.0, explained=True, gates=("topoalloc.io/dra",), claims=("ns/c",), claims_allocated=True
    )
    assert kinds(checker.check(Snapshot(now=1.0, pods={"p": pod}))) == ["gate-left"]
    pod.claims_allocated = False
    assert checker.check(Snapshot(now=2.0, pods={"p": pod})) == []


def test_an_expired_reservation_still_available_and_a_pod_the_kubelet_keeps_refusing() -> None:
    checker = Checker(Limits(grace=0))
    snap = Snapshot(now=100.0, reservations={"r": ReservationView("r", "Available", 50.0)})
    assert kinds(checker.check(snap)) == ["reservation-not-released"]
    snap.reservations["r"].phase = "Failed"
    assert checker.check(snap) == []
    snap = Snapshot(now=1.0, pods={"a": bound("a")}, admission_errors={"a": "no healthy device"})
    assert kinds(checker.check(snap)) == ["kubelet-refused"]


def test_unexpected_log_lines_unless_allowed() -> None:
    lines = [("allocator-a", "Traceback (most recent call last):"), ("agent-n1", "INFO all good")]
    assert kinds(Checker().check(Snapshot(now=1.0, log_lines=lines))) == ["unexpected-log"]
    allowed = Checker(Limits(expected_log=(r"^Traceback",)))
    assert allowed.check(Snapshot(now=1.0, log_lines=lines)) == []


def test_an_unexpected_traceback_is_reported_with_its_frames_and_exception() -> None:
    lines = [
        ("allocator-a", "ERROR placing default/p failed"),
        ("agent-n1", "INFO all good"),
        ("allocator-a", "Traceback (most recent call last):"),
        ("allocator-a", '  File "allocator/x.py", line 3, in f'),
        ("agent-n1", "INFO still good"),
        ("allocator-a", "    raise KeyError(key)"),
        ("allocator-a", "KeyError: 'gpu-3'"),
        ("allocator-a", "INFO next pass"),
    ]
    (found,) = Checker().check(Snapshot(now=1.0, log_lines=lines))
    assert found.subject == "allocator-a"
    assert found.detail.splitlines() == [
        "ERROR placing default/p failed",
        "Traceback (most recent call last):",
        '  File "allocator/x.py", line 3, in f',
        "    raise KeyError(key)",
        "KeyError: 'gpu-3'",
    ]


def test_rss_growing_over_the_last_half_and_a_flat_one() -> None:
    mib = 2**20
    growing = [(t * 30.0, 100 * mib + t * 10 * mib) for t in range(20)]  # 20 MiB/min
    flat = [(t * 30.0, 100 * mib + (t % 2) * mib) for t in range(20)]
    (v,) = Checker().check(Snapshot(now=600.0, rss={"allocator-a": growing, "agent-n1": flat}))
    assert (v.invariant, v.subject) == ("rss-growing", "allocator-a")
    # a process that ran too short to judge (its warm-up left out), and one growing only while warming up
    assert Checker().check(Snapshot(now=600.0, rss={"allocator-a": growing[:12]})) == []
    warming = [(t * 30.0, 100 * mib + min(t, 2) * 50 * mib) for t in range(20)]
    assert Checker().check(Snapshot(now=600.0, rss={"allocator-a": warming})) == []


def test_decision_p99_drifting_for_three_windows_and_one_spike() -> None:
    early = [(float(t), 0.2) for t in range(6)]
    drifting = [*early, (6.0, 1.5), (7.0, 1.6), (8.0, 1.4)]
    assert kinds(Checker().check(Snapshot(now=9.0, p99=drifting))) == ["p99-drift"]
    spike = [*early, (6.0, 0.2), (7.0, 3.0), (8.0, 0.3)]
    assert Checker().check(Snapshot(now=9.0, p99=spike)) == []
