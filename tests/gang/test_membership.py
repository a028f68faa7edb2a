"""Ways of naming a gang: Koordinator's annotations without a PodGroup, a PodGroup that shows up
late, members beyond minMember; and the settings that steer it all."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from allocator.gang.timefmt import parse_duration
from allocator.runtime.config import ServiceConfig
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.gang_settings import DEFAULT_TOPOLOGY_KEYS
from allocator.runtime.scarce_settings import ScarceAvoidanceSettings
from apis import keys
from apis.timestamps import format_time, parse_time
from tests.gang.harness import (
    allocator_front,
    gang_settings,
    gang_world,
    gates_of,
    gpu_node,
    member,
    node_of,
    podgroup,
)
from tests.support.allocator_harness import double_booked, running_allocator
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until
from topoalloc.commands.allocator import allocator


def koordinator(name: str, gang: str, min_available: int, gpus: int) -> dict:
    notes = {keys.GANG_NAME: gang, keys.GANG_MIN_AVAILABLE: str(min_available)}
    return member(name, gpus=gpus, annotations=notes)


async def test_koordinator_gang_waits_for_min_available_then_runs_and_takes_late_members(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        for i in range(2):
            await w.admission.create_pod(koordinator(f"k{i}", "kg", 3, gpus=2))
        await until(lambda: any("needs at least 3" in n for n in w.notes_about("k0")), 5)
        assert all(gates_of(p) == [keys.GANG_SCHEDULING_GATE] for p in w.pods().values())
        # The Event may come from the pass that saw k0 alone: wait for the pass that counts both.
        waiting = "topoalloc_podgroup_waiting_pods"
        await until(lambda: w.service.metrics.registry.get_sample_value(waiting) == 2, 5)
        await w.admission.create_pod(koordinator("k2", "kg", 3, gpus=2))
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        duration = "topoalloc_podgroup_scheduling_duration_seconds_count"
        await until(lambda: w.service.metrics.registry.get_sample_value(duration) == 1, 5)
        assert w.fake.list_objects("podgroups", "default") == []  # nothing to write a status to

        # A fourth member of a gang that already runs is placed on its own, next to the others.
        await w.admission.create_pod(koordinator("k3", "kg", 3, gpus=2))
        await until(lambda: node_of(w.pods()["k3"]) == "n1", 10)
        # A fifth does not fit (8 GPUs are taken): it waits, and says why.
        await w.admission.create_pod(koordinator("k4", "kg", 3, gpus=2))
        await until(lambda: any("no room" in n or "fits on none" in n for n in w.notes_about("k4")), 5)
        assert gates_of(w.pods()["k4"]) == [keys.GANG_SCHEDULING_GATE]
        assert double_booked(w.pods().values()) == []


async def test_a_koordinator_gang_fails_after_its_waiting_time(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        for i in range(2):  # 2 x 8 GPUs on an 8-GPU node
            pod = koordinator(f"k{i}", "too-big", 2, gpus=8)
            pod["metadata"]["annotations"][keys.GANG_WAITING_TIME] = "1s"
            await w.admission.create_pod(pod)
        await until(lambda: all(any("1s timeout" in n for n in w.notes_about(f"k{i}")) for i in range(2)), 6)
        timeouts = "topoalloc_podgroup_scheduling_timeout_total"
        assert w.service.metrics.registry.get_sample_value(timeouts) == 1
        assert w.gang_reservations() == {}
        assert all(gates_of(p) == [keys.GANG_SCHEDULING_GATE] for p in w.pods().values())


async def test_members_of_a_missing_podgroup_wait_until_it_exists(fake_api: FakeApiServer, pki: Pki) -> None:
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        for i in range(2):
            await w.admission.create_pod(member(f"p{i}", group="late", gpus=1))
        await until(lambda: any("PodGroup default/late does not exist" in n for n in w.notes_about("p0")), 5)
        assert not any(node_of(p) for p in w.pods().values())
        await w.admission.create_podgroup(podgroup("late", 2))
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        await until(lambda: w.podgroup_status("late").get("phase") == "Scheduled", 5)
        status = w.podgroup_status("late")
        assert status["scheduled"] == 2 and parse_time(status["scheduleStartTime"]) is not None


async def test_gang_scheduling_can_be_turned_off(fake_api: FakeApiServer, pki: Pki) -> None:

    off = {
        "gang": gang_settings(enabled=False),
        "dra": DraSettings(enabled=False),
        "scarce_avoidance": ScarceAvoidanceSettings(enabled=False),
    }
    async with running_allocator(fake_api, pki, **off) as run:
        # No webhook either (the DRA gate and scarce avoidance, served on the same port, are off too;
        # scarce avoidance alone keeps it: tests/scarce/test_served.py).
        assert [c.name for c in run.service.components] == ["reservations"]
        assert run.service.webhook_port == 0
        # Only the rooms' steering: no gang plan holds a bind back.
        assert [s.name for s in run.service.steering.steerers] == ["reservations"]


async def test_a_gang_is_placed_with_events_turned_off(fake_api: FakeApiServer, pki: Pki) -> None:
    """`events: false` hands gang scheduling the null recorder: it plans and reports as usual,
    and nothing reaches the API server as an Event."""
    gpu_node(fake_api, "n1")
    async with (
        running_allocator(fake_api, pki, events=False, gang=gang_settings()) as run,
        allocator_front(fake_api, pki, run) as w,
    ):
        await w.admission.create_podgroup(podgroup("quiet", 2))
        await w.admission.create_pod(member("q0", group="quiet", gpus=4))
        await until(lambda: w.podgroup_status("quiet").get("phase") == "Pending", 5)  # waits for q1
        assert gates_of(w.pods()["q0"]) == [keys.GANG_SCHEDULING_GATE]
        await w.admission.create_pod(member("q1", group="quiet", gpus=4))
        await until(lambda: all(node_of(p) == "n1" for p in w.pods().values()), 10)
        await until(lambda: w.podgroup_status("quiet").get("phase") == "Scheduled", 5)
        assert fake_api.list_objects("events", "default") == []


def test_the_admission_block_wins_over_the_old_gang_keys_which_warn(caplog: pytest.LogCaptureFixture) -> None:
    cfg = ServiceConfig.from_mapping(
        {"admission": {"port": 9555}, "gang": {"webhookPort": 9444, "webhookConfiguration": ""}}
    )
    assert cfg.admission.port == 9555 and cfg.admission.webhook_configuration == ""
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert warned == [
        "config.gang.webhookPort is deprecated: set config.admission.port instead",
        "config.gang.webhookConfiguration is deprecated: set config.admission.webhookConfiguration instead",
    ]
    with pytest.raises(ValueError, match=r"admission\.portt: unknown setting"):
        ServiceConfig.from_mapping({"admission": {"portt": 1}})


def test_settings_from_the_config_file_and_flags() -> None:
    cfg = ServiceConfig.from_mapping(
        {
            "gang": {
                "webhookPort": 9444,
                "topologyKeys": ["rack"],
                "defaultTimeout": 600,
                "schedulerNames": ["a"],
                "gangPluginSchedulers": [],
            }
        }
    )
    # The old key of the admission server's port is read into its own block.
    assert cfg.admission.port == 9444 and cfg.gang.topology_keys == ["rack"]
    # Without kube-scheduler's gang plugin topoalloc gates Kubernetes' own gangs too; the cluster's
    # own scheduler is taken to run it, a secondary one (no alpha gates) not.
    assert cfg.gang.gates(native=True) and not ServiceConfig().gang.gates(native=True)
    assert ServiceConfig().gang.gates(native=True, scheduler="topoalloc-scheduler")
    assert ServiceConfig().gang.gates(native=False)
    assert cfg.gang.default_timeout == 600.0 and cfg.gang.scheduler_names == ["a"]
    assert ServiceConfig().gang.topology_keys == list(DEFAULT_TOPOLOGY_KEYS)
    with pytest.raises(ValueError, match=r"gang\.webhookPorts: unknown setting"):
        ServiceConfig.from_mapping({"gang": {"webhookPorts": 1}})
    updated = cfg.updated(gang_enabled=False, admission_port=1234)
    assert (
        not updated.gang.enabled and updated.admission.port == 1234 and updated.gang.topology_keys == ["rack"]
    )
    result = CliRunner().invoke(allocator, ["--webhook-port", "70000"])
    assert result.exit_code == 2 and "70000" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("600s", 600),
        ("10m", 600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("250ms", 0.25),
        ("90", 90),
        (" 2m ", 120),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "10x", "5s3", "-5s", "s"])
def test_bad_durations(text: str) -> None:
    assert parse_duration(text) is None


def test_times_round_trip_to_the_second() -> None:
    assert format_time(1_800_000_000.7) == "2027-01-15T08:00:00Z"
    assert parse_time("2027-01-15T08:00:00Z") == 1_800_000_000
    assert parse_time("yesterday") is None
