"""No GPU goes to two pods: a whole GPU (`nvidia.com/gpu`) and shares of it (`gpu-core`) are two
kubelet resources that kubelet counts apart, so the agent refuses the second; what was served is on
disk before Allocate answers (a failed write refuses the pod), and an agent that lost its state
takes kubelet's PodResources in before its first answer."""

from __future__ import annotations

import shutil

import pytest

from agent import checkpoint
from agent.deviceplugin.service import JOURNAL_NAME
from agent.journal import Journal
from tests.agent.deviceplugin.rig import allocated, gpu_entry
from tests.agent.deviceplugin.test_kubelet_flow import H100
from tests.support.kubelet import AdmissionError

SHARE = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
WHOLE = {"nvidia.com/gpu": "1"}


def _finish(rig, name: str) -> None:
    pod = rig.server.get("pods", name, "default")
    pod["status"]["phase"] = "Succeeded"
    rig.server.put(pod)
    rig.kubelet.release("default", name)


@pytest.mark.parametrize(("first", "second"), [(WHOLE, SHARE), (SHARE, WHOLE)])
def test_a_gpu_never_goes_whole_and_shared_to_two_pods(make_rig, first, second) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()

    def annotation(limits):
        return allocated([gpu_entry(2, H100[2], core=50 if limits is SHARE else 100)])

    a = rig.put_pod("a", {"main": first}, annotation(first))
    kubelet.admit(a)
    b = rig.put_pod("b", {"main": second}, annotation(second))
    held = "koordinator.sh/gpu-core" if first is SHARE else "nvidia.com/gpu"
    with pytest.raises(
        AdmissionError, match=rf"already serve another pod \(default/a holds {held} of the same GPU\)"
    ):
        kubelet.admit(b)
    (event,) = [e for e in rig.events("DeviceAllocationRefused") if e["involvedObject"]["name"] == "b"]
    assert "default/a holds" in event["message"]

    # once the first pod finished, the GPU is free for the other kind of request
    _finish(rig, "a")
    c = rig.put_pod("c", {"main": second}, annotation(second))
    assert kubelet.admit(c)


def test_two_shares_of_one_gpu_go_to_two_pods(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    for name in ("s1", "s2"):
        pod = rig.put_pod(name, {"main": SHARE}, allocated([gpu_entry(4, H100[4], core=50)]))
        assert len(kubelet.admit(pod)["main"]["koordinator.sh/gpu-core"].ids) == 50


def test_a_served_container_that_cannot_be_recorded_is_refused(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()

    def broken(_entry):
        raise OSError(28, "No space left on device")

    rig.plugins.admission.record = broken
    pod = rig.put_pod("unrecorded", {"main": WHOLE}, allocated([gpu_entry(1, H100[1])]))
    with pytest.raises(AdmissionError, match=r"cannot record the served devices: .*No space left on device"):
        kubelet.admit(pod)
    assert rig.plugins.admission.served == {}  # never counted as served either


def test_served_containers_are_journaled_before_the_answer(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    rig.plugins.writer.stop()  # no checkpoint folds the journal in meanwhile (the next pass is 30 s off)
    pod = rig.put_pod("j", {"main": WHOLE}, allocated([gpu_entry(6, H100[6])]))
    kubelet.admit(pod)
    # read back at once, as a restarted process would: the record is there, no checkpoint has it
    saved = checkpoint.load(rig.state / checkpoint.FILE_NAME)
    assert saved is not None and saved[0]["served"] == {}
    assert Journal(rig.state, JOURNAL_NAME).replay() == [
        {
            "uid": pod["metadata"]["uid"],
            "namespace": "default",
            "name": "j",
            "resource": "nvidia.com/gpu",
            "container": 0,
            "ids": [H100[6]],
        }
    ]


def test_a_restarted_agent_without_its_state_adopts_kubelets_assignments(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    kubelet.admit(rig.put_pod("running", {"main": WHOLE}, allocated([gpu_entry(5, H100[5])])))
    rig.stop_agent()
    shutil.rmtree(rig.state)  # the node's state directory is gone (reinstalled, wiped hostPath)

    agent = rig.start_agent(wait=False)
    kubelet.wait_registered(["nvidia.com/gpu", "koordinator.sh/gpu-core"], count=2)
    served = agent.device_plugins.admission.served
    assert [(s.name, s.resources) for s in served.values()] == [("running", {"nvidia.com/gpu": [[H100[5]]]})]
    share = rig.put_pod("share", {"main": SHARE}, allocated([gpu_entry(5, H100[5], core=50)]))
    with pytest.raises(AdmissionError, match=r"default/running holds nvidia\.com/gpu of the same GPU"):
        kubelet.admit(share)
