"""The soak's invariants as pure checks: plain snapshots of the cluster in, violations out.

The soak (tests/cluster/soak.py) takes a `Snapshot` every few seconds (what the API server holds,
what the stand-in kubelets served and prepared, the processes' RSS and the allocator's decision
latency, new log lines) and hands it to `Checker.check`. A condition that may hold for a moment in
a healthy cluster (a pod not yet bound, a gang half bound while kube-scheduler binds its members, a
gate not yet lifted, an expired Reservation not yet marked) is a violation only once it has lasted
`grace` seconds, counted from when it was first seen or from the last fault, whichever is later,
or `max_grace` seconds however many faults came meanwhile; the `Checker` remembers when each was
first seen. No clock and no I/O here: `Snapshot.now` is the
soak's clock, so the unit tests (tests/soak/test_invariants.py) feed violating snapshots directly.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

WHOLE = 100  # a whole GPU's share (gpu-core percent)


@dataclass
class PodView:
    """One pod as the API server has it, reduced to what the invariants need."""

    key: str  # namespace/name
    created: float  # soak clock
    node: str = ""
    gates: tuple[str, ...] = ()
    finished: bool = False  # Succeeded or Failed: holds nothing any more
    deleting: bool = False
    gang: str = ""  # namespace/name of its gang, "" for a pod on its own
    # GPU UUID -> share (percent of the GPU) and RDMA VF addresses, as its device-allocated annotation
    # names them (through the node's Device); empty for a pod without one
    gpus: dict[str, int] = field(default_factory=dict)
    vfs: tuple[str, ...] = ()
    explained: bool = False  # a PodScheduled=False condition with a message, or an Event about it
    claims: tuple[str, ...] = ()  # namespace/name of its ResourceClaims
    claims_allocated: bool = False  # each of them allocated


@dataclass
class Served:
    """What a stand-in kubelet's Allocate handed one pod's containers (device plugin nodes)."""

    pod: str
    node: str
    gpus: dict[str, int]  # UUID -> share (NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_SM_LIMIT)
    vfs: tuple[str, ...]  # PCIDEVICE_KOORDINATOR_SH_RDMA


@dataclass
class ClaimView:
    """A ResourceClaim: the devices its allocation names, and those the DRA plugin prepared."""

    key: str
    node: str = ""
    allocated: tuple[str, ...] = ()  # pool/device of each result
    prepared: tuple[str, ...] | None = None  # pool/device prepared on its node; None: not prepared
    live: bool = True  # reserved for (or owned by) a pod that exists and is not finished


@dataclass
class GangView:
    key: str
    min_member: int
    members: tuple[str, ...]  # pod keys


@dataclass
class ReservationView:
    name: str
    phase: str
    expires_at: float | None  # soak clock; None: not by time


@dataclass
class Snapshot:
    now: float
    last_fault: float = float("-inf")
    pods: dict[str, PodView] = field(default_factory=dict)
    served: dict[str, Served] = field(default_factory=dict)
    admission_errors: dict[str, str] = field(default_factory=dict)  # pod -> kubelet's refusal
    claims: dict[str, ClaimView] = field(default_factory=dict)
    gangs: dict[str, GangView] = field(default_factory=dict)
    reservations: dict[str, ReservationView] = field(default_factory=dict)
    # process name -> (time, RSS bytes), one series per process (a restarted process is a new one)
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # (time, p99 of the decisions taken in the window ending then), seconds
    p99: list[tuple[float, float]] = field(default_factory=list)
    log_lines: list[tuple[str, str]] = field(default_factory=list)  # (process, line) new since the last


@dataclass(frozen=True)
class Violation:
    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject}: {self.detail}"


# Lines a component logs that mean its code met something it did not expect.
UNEXPECTED = re.compile(r"Traceback \(most recent call last\)|\bCRITICAL\b|Unhandled exception")


@dataclass
class Limits:
    grace: float = 30.0  # seconds a transient condition may last (after its start or the last fault)
    max_grace: float = 90.0  # seconds it may last however many faults keep coming
    rss_slope_mib_per_min: float = 4.0  # over the last half of the run
    rss_min_span: float = 300.0  # seconds of one process's samples before its slope is judged
    rss_warmup: float = 60.0  # a process's first seconds (caches filling) are not judged
    p99_factor: float = 4.0  # the last window's p99 against the first windows' (with a floor)
    p99_floor: float = 1.0  # seconds: below this a p99 is never a violation
    expected_log: tuple[str, ...] = ()  # regular expressions of unexpected-looking lines allowed


class Checker:
    """Every invariant over successive snapshots; remembers when each transient condition began."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.since: dict[tuple[str, str], float] = {}
        self._allowed = [re.compile(p) for p in self.limits.expected_log]

    def check(self, snap: Snapshot) -> list[Violation]:
        now_bad: list[Violation] = []
        now_bad += doubled_devices(snap)
        now_bad += served_differs(snap)
        now_bad += unexpected_logs(snap.log_lines, self._allowed)
        now_bad += rss_growth(snap, self.limits)
        now_bad += p99_drift(snap, self.limits)
        transient = list(lost_pods(snap)) + list(partial_gangs(snap)) + list(gates_left(snap))
        transient += list(unreleased_reservations(snap)) + list(unadmitted(snap))
        return now_bad + self._persisting(snap, transient)

    def _persisting(self, snap: Snapshot, found: list[Violation]) -> list[Violation]:
        keys = {(v.invariant, v.subject) for v in found}
        for key in list(self.since):
            if key not in keys:
                del self.since[key]
        out = []
        for v in found:
            first = self.since.setdefault((v.invariant, v.subject), snap.now)
            lasted = snap.now - first
            if snap.now - max(first, snap.last_fault) >= self.limits.grace or lasted >= self.limits.max_grace:
                out.append(v)
        return out


def _live(pod: PodView | None) -> bool:
    return pod is not None and not pod.finished


def doubled_devices(snap: Snapshot) -> list[Violation]:
    """No GPU served past its whole (shares summed) and no VF served twice, among live pods; no
    device allocated to, or prepared for, two live claims."""
    out = []
    gpus: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    vfs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in snap.served.values():
        if not _live(snap.pods.get(s.pod)):
            continue
        for uuid, share in s.gpus.items():
            gpus[(s.node, uuid)].append((s.pod, share))
        for vf in s.vfs:
            vfs[(s.node, vf)].append(s.pod)
    for (node, uuid), users in sorted(gpus.items()):
        if len(users) > 1 and sum(share for _, share in users) > WHOLE:
            out.append(Violation("device-served-twice", f"{node}/{uuid}", f"served to {sorted(users)}"))
    for (node, vf), users in sorted(vfs.items()):
        if len(users) > 1:
            out.append(Violation("device-served-twice", f"{node}/{vf}", f"VF served to {sorted(users)}"))
    for what, pick in (("allocated", lambda c: c.allocated), ("prepared", lambda c: c.prepared or ())):
        holders: dict[tuple[str, str], list[str]] = defaultdict(list)
        for claim in snap.claims.values():
            if claim.live:
                for device in pick(claim):
                    holders[(claim.node, device)].append(claim.key)
        for (node, device), keys in sorted(holders.items()):
            if len(keys) > 1:
                out.append(Violation(f"claim-device-{what}-twice", f"{node}/{device}", f"in {sorted(keys)}"))
    return out


def served_differs(snap: Snapshot) -> list[Violation]:
    """Each live pod's devices as Allocate served them are its annotation's; each prepared claim's
    devices are its allocation's."""
    out = []
    for s in snap.served.values():
        pod = snap.pods.get(s.pod)
        if not _live(pod) or pod is None or (not pod.gpus and not pod.vfs):
            continue
        if set(s.gpus) != set(pod.gpus) or sorted(s.vfs) != sorted(pod.vfs):
            detail = f"served {s.gpus} {list(s.vfs)}, annotated {pod.gpus} {list(pod.vfs)}"
            out.append(Violation("served-not-annotated", s.pod, detail))
    for claim in snap.claims.values():
        if claim.live and claim.prepared is not None and sorted(claim.prepared) != sorted(claim.allocated):
            detail = f"prepared {list(claim.prepared)}, allocated {list(claim.allocated)}"
            out.append(Violation("prepared-not-allocated", claim.key, detail))
    return out


def lost_pods(snap: Snapshot) -> Iterable[Violation]:
    """A live pod neither bound nor explained (no PodScheduled=False message, no Event)."""
    for pod in snap.pods.values():
        if _live(pod) and not pod.deleting and not pod.node and not pod.explained:
            yield Violation("pod-lost", pod.key, f"pending, gates {list(pod.gates)}, nothing says why")


def partial_gangs(snap: Snapshot) -> Iterable[Violation]:
    """A gang with some members bound and fewer than its minimum bound, members still pending."""
    for gang in snap.gangs.values():
        members = [snap.pods[k] for k in gang.members if _live(snap.pods.get(k))]
        bound = [p for p in members if p.node]
        pending = [p for p in members if not p.node and not p.deleting]
        if bound and pending and len(bound) < gang.min_member:
            detail = f"{len(bound)} of {gang.min_member} bound, pending {sorted(p.key for p in pending)}"
            yield Violation("gang-bound-in-part", gang.key, detail)


def gates_left(snap: Snapshot) -> Iterable[Violation]:
    """A gate still on a pod whose gang has a member ungated already (the gang was released), or
    whose claims are all allocated."""
    released = {
        g.key
        for g in snap.gangs.values()
        if any(_live(p := snap.pods.get(k)) and p and not p.gates for k in g.members)
    }
    for pod in snap.pods.values():
        if not _live(pod) or not pod.gates or pod.deleting:
            continue
        if pod.gang and pod.gang in released:
            yield Violation(
                "gate-left", pod.key, f"gates {list(pod.gates)} while its gang {pod.gang} is released"
            )
        elif not pod.gang and pod.claims and pod.claims_allocated:
            yield Violation("gate-left", pod.key, f"gates {list(pod.gates)} while its claims are allocated")


def unreleased_reservations(snap: Snapshot) -> Iterable[Violation]:
    """A Reservation past its expiry still holding its room (Available)."""
    for r in snap.reservations.values():
        if r.expires_at is not None and snap.now > r.expires_at and r.phase == "Available":
            yield Violation("reservation-not-released", r.name, f"expired {snap.now - r.expires_at:.0f}s ago")


def unadmitted(snap: Snapshot) -> Iterable[Violation]:
    """A bound pod the node's kubelet keeps refusing."""
    for key, error in snap.admission_errors.items():
        if _live(snap.pods.get(key)):
            yield Violation("kubelet-refused", key, error)


def unexpected_logs(lines: list[tuple[str, str]], allowed: list[re.Pattern[str]]) -> list[Violation]:
    """Each unexpected line with what explains it (the reproduction record must show the error, not
    only that there was one): the process's line before it (the log record a traceback belongs to)
    and, for a traceback, its frames down to the exception's own line."""
    out = []
    for i, (process, line) in enumerate(lines):
        if UNEXPECTED.search(line) and not any(p.search(line) for p in allowed):
            own = [text for name, text in lines if name == process]
            at = sum(1 for name, _ in lines[:i] if name == process)
            out.append(Violation("unexpected-log", process, "\n".join(_context(own, at))[:4000]))
    return out


def _context(lines: list[str], at: int) -> list[str]:
    """The line before `at`, `at` itself and, when it opens a traceback, the frames after it (indented
    lines and chained-exception headers) and the exception line that ends it."""
    out = lines[max(0, at - 1) : at + 1]
    if "Traceback" not in lines[at]:
        return out
    for text in lines[at + 1 : at + 200]:
        out.append(text)
        if (
            text
            and not text[0].isspace()
            and not text.startswith(("Traceback", "During handling", "The above"))
        ):
            break
    return out


def slope(series: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y), per second."""
    n = len(series)
    mt = sum(t for t, _ in series) / n
    my = sum(y for _, y in series) / n
    var = sum((t - mt) ** 2 for t, _ in series)
    return sum((t - mt) * (y - my) for t, y in series) / var if var else 0.0


def rss_growth(snap: Snapshot, limits: Limits) -> list[Violation]:
    """A process whose RSS grew faster than the limit over the last half of its samples."""
    out = []
    for name, series in snap.rss.items():
        warm = [(t, y) for t, y in series if t - series[0][0] >= limits.rss_warmup]
        if len(warm) < 6 or warm[-1][0] - warm[0][0] < limits.rss_min_span:
            continue
        half = warm[len(warm) // 2 :]
        per_min = slope(half) * 60 / 2**20
        if per_min > limits.rss_slope_mib_per_min:
            detail = f"RSS +{per_min:.1f} MiB/min over its last {half[-1][0] - half[0][0]:.0f}s"
            out.append(Violation("rss-growing", name, detail))
    return out


def p99_drift(snap: Snapshot, limits: Limits) -> list[Violation]:
    """The last window's decision p99 against the first third's worst (or the floor)."""
    if len(snap.p99) < 6:
        return []
    base = max(p for _, p in snap.p99[: len(snap.p99) // 3])
    last = min(p for _, p in snap.p99[-3:])  # three windows in a row: one fault's spike is no drift
    if last > max(limits.p99_floor, limits.p99_factor * base):
        return [
            Violation(
                "p99-drift",
                "allocator",
                f"p99 {last:.3f}s (three windows) against {base:.3f}s early in the run",
            )
        ]
    return []
