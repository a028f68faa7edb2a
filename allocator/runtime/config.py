"""The allocator service's settings: defaults, a YAML/JSON config file, then command-line flags."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.runtime.admission_settings import DEPRECATED_GANG_KEYS, AdmissionSettings
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.reservation_settings import ReservationSettings
from allocator.runtime.scarce_settings import ScarceAvoidanceSettings
from apis.documents import load_mapping

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "topoalloc-system"
DEFAULT_SERVICE = "topoalloc-allocator"
DEFAULT_LEASE = "topoalloc-allocator"
ROUND_TRIPS = (1, 2)  # extender calls per scheduled pod before bind: filter, or filter + prioritize


def _default_identity() -> str:
    # The Deployment passes the pod name; the hostname is the pod name anyway.
    return os.environ.get("POD_NAME") or socket.gethostname()


def _default_namespace() -> str:
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return sa.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


@dataclass
class LeaderElection:
    enabled: bool = True
    lease_name: str = DEFAULT_LEASE
    namespace: str = field(default_factory=_default_namespace)
    identity: str = field(default_factory=_default_identity)
    # client-go's defaults (15 s / 10 s / 2 s).
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # The leader labels its own pod (POD_NAME in `namespace`) topoalloc.io/leader=true, so a
    # Service selecting that label reaches the leader only (deploy/allocator/service.yaml).
    label_pod: bool = False
    pod_name: str = field(default_factory=lambda: os.environ.get("POD_NAME", ""))


@dataclass
class ServiceConfig:
    # Kubernetes API access
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    api_timeout: float = 10.0  # per API call (patch, binding, event), seconds
    # extender (HTTPS) and health/metrics (plain HTTP) listeners
    host: str = "0.0.0.0"
    port: int = 8443
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    tls_cert: str = "/etc/topoalloc/tls/tls.crt"
    tls_key: str = "/etc/topoalloc/tls/tls.key"
    client_ca: str = "/etc/topoalloc/tls/ca.crt"
    tls_reload_interval: float = 10.0
    allowed_clients: list[str] = field(default_factory=list)
    # 1: filter answers with the best node alone, so kube-scheduler skips scoring and never calls
    # prioritize (its extender config has no prioritizeVerb); 2: filter passes every node that fits
    # and prioritize ranks them (docs/service.md, "Round trips")
    round_trips: int = 1
    # binding
    bind_deadline: float = 4.0  # below kube-scheduler's httpTimeout (5 s default, wire fact 9)
    reservation_ttl: float = 120.0
    # watch cache
    watch_timeout: int = 300
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # leader election
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    # events
    events: bool = True
    event_window: float = 60.0  # at most one Event per pod and reason in this window
    # scoring, handed to the allocator core's ScoringConfig
    scoring: dict[str, Any] = field(default_factory=dict)
    # the admission server every webhook route is served on (gang, DRA, scarce avoidance, placement)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    # gang scheduling: the gang gate, gang controller, extender steering (docs/gang.md)
    gang: GangSettings = field(default_factory=GangSettings)
    # Reservations: room held for pods not created yet (docs/reservations.md)
    reservations: ReservationSettings = field(default_factory=ReservationSettings)
    # DRA claims allocated by topology (docs/dra.md): watches, webhook gate, claims controller
    dra: DraSettings = field(default_factory=DraSettings)
    # pods that request no device prefer nodes without GPUs (docs/service.md): the webhook route
    scarce_avoidance: ScarceAvoidanceSettings = field(default_factory=ScarceAvoidanceSettings)
    # defragmentation by safe rescheduling: the migration controller (docs/defragmentation.md)
    defrag: DefragSettings = field(default_factory=DefragSettings)

    def __post_init__(self) -> None:
        if self.round_trips not in ROUND_TRIPS:
            raise ValueError(f"config.roundTrips: expected 1 or 2, got {self.round_trips!r}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> ServiceConfig:
        return _build(cls, _moved_keys(data), "config")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServiceConfig:
        """Raises InputError (a ValueError) for an unreadable file or one that is not one mapping."""
        return cls.from_mapping(load_mapping(path, "allocator config"))

    def updated(self, **overrides: Any) -> ServiceConfig:
        """A copy with the given fields replaced; `None` means "not given" and keeps the value."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        le = {k[len("leader_") :]: changes.pop(k) for k in list(changes) if k.startswith("leader_")}
        gang = {k[len("gang_") :]: changes.pop(k) for k in list(changes) if k.startswith("gang_")}
        admission = {
            k[len("admission_") :]: changes.pop(k) for k in list(changes) if k.startswith("admission_")
        }
        out = dataclasses.replace(self, **changes)
        if le:
            out.leader_election = dataclasses.replace(out.leader_election, **le)
        if gang:
            out.gang = dataclasses.replace(out.gang, **gang)
        if admission:
            out.admission = dataclasses.replace(out.admission, **admission)
        return out


def _moved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The config with the admission server's old keys of the `gang:` block read into `admission:`
    (a key the `admission:` block sets itself wins), each with a warning."""
    gang = data.get("gang")
    if not isinstance(gang, dict) or not any(k in DEPRECATED_GANG_KEYS for k in gang):
        return data
    admission = data.get("admission")
    if admission is not None and not isinstance(admission, dict):
        return data  # _build reports it
    moved = dict(admission or {})
    kept = {}
    for key, value in gang.items():
        new = DEPRECATED_GANG_KEYS.get(key)
        if new is None:
            kept[key] = value
            continue
        log.warning("config.gang.%s is deprecated: set config.admission.%s instead", key, new)
        if new not in moved and _snake(new) not in moved:
            moved[new] = value
    return {**data, "gang": kept, "admission": moved}


def _snake(key: str) -> str:
    out = []
    for ch in key.replace("-", "_"):
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).lstrip("_")


def _build(cls: type, data: dict[str, Any], path: str) -> Any:
    """Build a dataclass from a mapping, accepting camelCase or kebab-case keys and rejecting
    unknown ones, so a typo in the config file is an error rather than an ignored setting."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = _snake(str(raw_key))
        if key not in fields:
            raise ValueError(f"{path}.{raw_key}: unknown setting (known: {', '.join(sorted(fields))})")
        current = getattr(defaults, key)
        where = f"{path}.{raw_key}"
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected a mapping")
            kwargs[key] = _build(type(current), value, where)
        else:
            kwargs[key] = _check(value, current, fields[key].type, where)
    return cls(**kwargs)


def _check(value: Any, current: Any, annotation: Any, where: str) -> Any:
    if value is None and "None" in str(annotation):
        return None
    if isinstance(current, bool) or annotation == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
    elif isinstance(current, int) and not isinstance(current, bool):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
    elif isinstance(current, float):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}: expected a non-negative number, got {value!r}")
        value = float(value)
    elif isinstance(current, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: expected a list of strings")
    elif isinstance(current, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping")
    elif "str" in str(annotation) and not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    return value
