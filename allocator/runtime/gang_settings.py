"""Settings of gang scheduling (the `gang:` block of the allocator's config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from apis.topology_profile import AUTO, PROFILE_NAMES

# Node labels naming a topology domain, widest last: the planner keeps a gang inside one domain of
# the first key that can hold it, and sibling affinity scores nodes sharing them.
DEFAULT_TOPOLOGY_KEYS = ("nvidia.com/gpu.clique", "topoalloc.io/rack", "topology.kubernetes.io/zone")
DEFAULT_SCHEDULER = "default-scheduler"


@dataclass
class GangSettings:
    enabled: bool = True
    topology_keys: list[str] = field(default_factory=lambda: list(DEFAULT_TOPOLOGY_KEYS))
    # Which labels name the topology levels (docs/topology.md): a preset (topograph,
    # topograph-legacy, aws, gke, generic), `custom` (topology_keys), or `auto`: detected from the
    # nodes' labels, unless topology_keys was set to something else (then those keys).
    topology_profile: str = AUTO
    # Gangs that set no timeout (PodGroup scheduleTimeoutSeconds, Koordinator waiting-time) wait
    # this long for a placement before they fail; 0 waits for ever.
    default_timeout: float = 0.0
    # Members released by a plan but not bound within this many seconds: the plan is released
    # and redone (kube-scheduler is not calling the extender for them, or refuses the node).
    bind_timeout: float = 120.0
    # Weight of sibling affinity against the rest of the node score (0 turns it off).
    sibling_weight: float = 3.0
    # Seconds between full passes when nothing wakes the controller, and the pause that batches a
    # burst of watch events into one pass.
    resync_period: float = 5.0
    batch_delay: float = 0.05
    # A waiting gang that fits nowhere evicts the cheapest lower-priority pods that make room for
    # all its members (Eviction API, so PodDisruptionBudgets hold), holding the room meanwhile; the
    # hold is given up when the victims are not gone within `preemption_timeout` seconds.
    preemption: bool = True
    preemption_timeout: float = 300.0
    # No starvation: once the first waiting gang in priority order has waited this many seconds
    # without room, the devices of the nodes it needs fewest pods to leave are held for it as they
    # free up (other pods backfill only elsewhere), until it runs or its timeout; 0 turns it off.
    starvation_bound: float = 600.0
    # Only pods for these schedulers are gated and planned; empty means every pod.
    scheduler_names: list[str] = field(default_factory=list)
    # Kubernetes' own gangs (scheduling.k8s.io PodGroup, Workload; watched where the server serves
    # them) of pods for these schedulers are kept whole by kube-scheduler's GangScheduling plugin:
    # topoalloc does not gate them and steers every member to the plan it made for the whole gang.
    # The cluster's own scheduler runs the plugin in its default profile wherever the gates that
    # serve the API are on; a scheduler left out (the secondary topoalloc-scheduler, which runs no
    # alpha gates, or a profile disabling the plugin) gets its native gangs gated, as scheduler-
    # plugins' are. docs/gang.md, "Kubernetes' own gangs".
    gang_plugin_schedulers: list[str] = field(default_factory=lambda: [DEFAULT_SCHEDULER])

    def gates(self, native: bool, scheduler: str = DEFAULT_SCHEDULER) -> bool:
        """Whether the webhook gates a member of a gang (native: scheduling.k8s.io) for `scheduler`."""
        return not (native and scheduler in self.gang_plugin_schedulers)

    def __post_init__(self) -> None:
        if self.topology_profile not in PROFILE_NAMES:
            known = ", ".join(PROFILE_NAMES)
            raise ValueError(
                f"gang.topologyProfile: unknown profile {self.topology_profile!r} (known: {known})"
            )
