"""The allocator's checks on constructed objects: replicas (scaled to 0 fails with the scale
command, none ready fails, one of two warns), the leader's Lease (none, released, expired fail; one
renewed in the future says the clocks disagree), the leader label the extender's Service needs, and
this machine's clock against the API server's."""

from __future__ import annotations

from tests.doctor.healthy import NOW, facts, micro
from topoalloc.commands.doctor import allocator
from topoalloc.commands.doctor.findings import FAIL, OK, WARN

SKEW = 5.0


def statuses(found: list) -> list[tuple[str, str]]:
    return [(f.check, f.status) for f in found]


def test_a_healthy_allocator_passes() -> None:
    found = allocator.check(facts(), SKEW)
    assert statuses(found) == [("allocator", OK), ("allocator", OK), ("clock", OK)]
    assert found[1].what.startswith("leader topoalloc-allocator-0: Lease renewed 2s ago")


def test_scaled_to_zero_fails_with_the_command_that_scales_it_back() -> None:
    f = facts()
    f.deployments["topoalloc-allocator"]["spec"]["replicas"] = 0
    f.deployments["topoalloc-allocator"]["status"] = {}
    replicas = allocator.check_replicas(f)
    assert replicas.status == FAIL and "scaled to 0 replicas" in replicas.what
    assert replicas.fix == "kubectl -n topoalloc-system scale deployment topoalloc-allocator --replicas=2"


def test_no_replica_ready_fails_and_one_of_two_warns() -> None:
    f = facts()
    f.deployments["topoalloc-allocator"]["status"]["readyReplicas"] = 0
    f.pods[0]["status"] = {
        "phase": "Pending",
        "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}],
    }
    none = allocator.check_replicas(f)
    assert none.status == FAIL and "none of the allocator's 2 replicas is ready" in none.what
    assert "topoalloc-system/topoalloc-allocator-0 on gpu-a, ImagePullBackOff, not ready" in none.details
    f.deployments["topoalloc-allocator"]["status"]["readyReplicas"] = 1
    one = allocator.check_replicas(f)
    assert one.status == WARN and "no hot standby" in one.what


def test_no_deployment_fails() -> None:
    f = facts()
    f.deployments.clear()
    assert statuses(allocator.check(f, SKEW)) == [("allocator", FAIL), ("clock", OK)]


def test_an_expired_lease_is_no_leader() -> None:
    f = facts()
    f.leases["topoalloc-allocator"]["spec"]["renewTime"] = micro(60)
    [finding] = allocator.check_leader(f, SKEW)
    assert finding.status == FAIL and finding.what.startswith("no leader: topoalloc-allocator-0 last renewed")
    assert "60s ago (15 s lease)" in finding.what


def test_no_lease_or_a_released_one_is_no_leader() -> None:
    f = facts()
    f.leases["topoalloc-allocator"]["spec"]["holderIdentity"] = ""
    assert [x.status for x in allocator.check_leader(f, SKEW)] == [FAIL]
    f.leases.clear()
    [finding] = allocator.check_leader(f, SKEW)
    assert finding.status == FAIL and "no Lease topoalloc-system/topoalloc-allocator" in finding.what


def test_the_lease_name_comes_from_the_installed_config() -> None:
    f = facts()
    cm = f.configmaps["topoalloc-allocator"]
    cm["data"]["allocator.yaml"] = cm["data"]["allocator.yaml"].replace(
        "leaseName: topoalloc-allocator", "leaseName: other-lease"
    )
    assert allocator.lease_name(f) == "other-lease"
    assert "no Lease topoalloc-system/other-lease" in allocator.check_leader(f, SKEW)[0].what


def test_a_lease_renewed_in_the_future_says_the_leaders_clock_runs_ahead() -> None:
    f = facts()
    f.leases["topoalloc-allocator"]["spec"]["renewTime"] = micro(-30)
    found = allocator.check_leader(f, SKEW)
    assert statuses(found) == [("clock", WARN), ("allocator", OK)]
    assert "clock of topoalloc-allocator-0's node runs ahead" in found[0].what


def test_the_leader_label_matters_for_the_extender_modes() -> None:
    f = facts()
    del f.pods[0]["metadata"]["labels"]["topoalloc.io/leader"]
    found = allocator.check_leader(f, SKEW)
    assert statuses(found) == [
        ("allocator", WARN),
        ("allocator", OK),
    ]  # placement: no extender Service in use
    assert "no pod is" in found[0].what and "reaches no leader" in found[0].what
    f.record = {"mode": "kubeadm"}
    assert statuses(allocator.check_leader(f, SKEW))[0] == ("allocator", FAIL)


def test_a_leader_that_is_no_pod_of_the_deployment_warns() -> None:
    f = facts()
    f.leases["topoalloc-allocator"]["spec"]["holderIdentity"] = "my-laptop"
    found = allocator.check_leader(f, SKEW)
    assert found[0].status == WARN and "my-laptop is not a live pod" in found[0].what


def test_clocks_apart_or_unknown_warn() -> None:
    f = facts()
    f.local_now = NOW - 42
    clock = allocator.check_clock(f, SKEW)
    assert clock.status == WARN and "42s behind the API server's" in clock.what
    f.server_now = None
    assert "did not say its time" in allocator.check_clock(f, SKEW).what
