"""The actuator reports what a write did, not what it asked for: a write that found its object already as wanted is
``unchanged``, one whose object is not there any more (a pod gone or replaced by a successor of its name, a deleted
workload or Deployment) is ``gone``; only ``applied`` -- a change written -- gets an Event, counts in the training
metrics and stays a scale event for the rate policies. Over the in-memory ``FakeCluster`` (and the simulator's
cluster, which implements the same ports)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from autoscaler.actuator import DONE, RESULTS, ActionResult, Actuator, GuardContext, forget_unapplied
from autoscaler.core.cluster import PodInfo, WorkloadInfo
from autoscaler.core.model import (
    Action,
    ControllerState,
    EvictPod,
    ResumeWorkload,
    ScaleDeployment,
    ScaleNodePool,
    ServiceState,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import WriteOutcome
from autoscaler.reporting import TickReport, TickReporter
from autoscaler.telemetry import Telemetry

NOW = 1_800_000_000.0
NS = "train"
GANG = f"kubeflow/{NS}/g1"
PREEMPT = Reason.PREEMPT_FOR_INFERENCE


def pod(name: str, gang: str | None = GANG, uid: str | None = None) -> PodInfo:
    return PodInfo(NS, name, "gpu-0", 1, 0, "Running", True, gang=gang, uid=uid or f"uid-{name}")


def evict(name: str, gang: str | None = GANG) -> EvictPod:
    return EvictPod(NS, name, PREEMPT, "for ml/chat", gang=gang, service="ml/chat", lost_work_gpu_s=3600.0,
                    uid=f"uid-{name}")  # fmt: skip


def job(name: str, *, suspended: bool = False, ours: bool = False) -> WorkloadInfo:
    return WorkloadInfo("Job", NS, name, f"job/{NS}/{name}", suspended, suspended_by_us_at=NOW - 60 if ours else None)


def context() -> GuardContext:
    return GuardContext(NOW, {})


def pod_events(c: FakeCluster) -> list[tuple[str, str | None]]:
    return [(e.name, e.uid) for e in c.events if e.kind == "Pod"]


# ---- every write kind x {wrote, already at target, gone} ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    setup: Callable[[FakeCluster], None]
    action: Action
    result: str
    events: tuple[tuple[str, str], ...]  # (kind, name) of every Event written
    message: str = ""  # in the result's message


SCALE = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
SUSPEND = SuspendWorkload("Job", NS, "llama", PREEMPT, "for ml/chat", service="ml/chat", lost_work_gpu_s=7200.0)
RESUME = ResumeWorkload("Job", NS, "llama", Reason.RESUME_TRAINING, "GPUs free again")
GROW = ScaleNodePool("burst", 3, 2, Reason.BURST_SCALE_UP, "short of GPUs")

CASES = {
    # scale
    "scale/wrote": Case(lambda c: c.add_deployment("ml", "chat", 2), SCALE, "applied", (("Deployment", "chat"),)),
    # somebody else scaled it to our target between the tick's read and the write
    "scale/already": Case(lambda c: c.add_deployment("ml", "chat", 3), SCALE, "unchanged", (),
                          "nothing written: the Deployment already has 3 replicas"),
    "scale/gone": Case(lambda c: None, SCALE, "gone", (), "nothing written: the Deployment does not exist"),
    # evict: a pod already evicted answers 404, a successor of its name fails the uid precondition
    "evict/wrote": Case(lambda c: c.add_pod(pod("solo", gang=None)), evict("solo", gang=None), "applied",
                        (("Pod", "solo"),)),
    "evict/gone": Case(lambda c: None, evict("solo", gang=None), "gone", (), "the pod is gone already"),
    "evict/replaced": Case(lambda c: c.add_pod(pod("solo", gang=None, uid="uid-successor")), evict("solo", gang=None),
                           "gone", (), "a new pod holds its name"),
    # suspend
    "suspend/wrote": Case(lambda c: c.add_workload(job("llama")), SUSPEND, "applied",
                          (("Job", "llama"), ("Deployment", "chat"))),
    "suspend/already": Case(lambda c: c.add_workload(job("llama", suspended=True)), SUSPEND, "unchanged", (),
                            "the Job is already suspended"),
    "suspend/gone": Case(lambda c: c.delete_workload("Job", NS, "llama"), SUSPEND, "gone", (),
                         "the Job does not exist"),
    # resume
    "resume/wrote": Case(lambda c: c.add_workload(job("llama", suspended=True, ours=True)), RESUME, "applied",
                         (("Job", "llama"),)),
    "resume/already": Case(lambda c: c.add_workload(job("llama")), RESUME, "unchanged", (),
                           "the Job is already running"),
    "resume/gone": Case(lambda c: c.delete_workload("Job", NS, "llama"), RESUME, "gone", (), "the Job does not exist"),
    # suspended since by somebody else: the plan's premise is gone, not a resume of ours
    "resume/not-ours": Case(lambda c: c.add_workload(job("llama", suspended=True)), RESUME, "skipped", (),
                            "not by this controller"),
    # node pool
    "pool/wrote": Case(lambda c: c.add_pool("burst", 2), GROW, "applied", ()),
    "pool/already": Case(lambda c: c.add_pool("burst", 3), GROW, "unchanged", (), "the pool is already at 3 nodes"),
    "pool/at-max": Case(lambda c: c.add_pool("burst", 2, max_size=2), GROW, "unchanged", (), "min/max bound"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_each_write_reports_what_it_did_and_only_a_change_gets_an_event(name: str) -> None:
    case = CASES[name]
    c = FakeCluster()
    case.setup(c)
    (got,) = Actuator(c, c).apply([case.action], context())
    assert got.result == case.result, got
    assert case.message in got.message
    assert [(e.kind, e.name) for e in c.events] == list(case.events)
    written = [w for w in c.writes if w.outcome == "applied" or w.outcome == "evicted"]
    assert bool(written) == (case.result == "applied")


def test_an_applied_eviction_event_carries_the_evicted_pods_uid() -> None:
    c = FakeCluster(pods=[pod("solo", gang=None)])
    Actuator(c, c).apply([evict("solo", gang=None)], context())
    assert pod_events(c) == [("solo", "uid-solo")]  # never an Event a successor of the name could be shown with


def test_a_dry_run_reports_dry_run_whatever_the_object_is() -> None:
    """Dry-run writes nothing, so it cannot tell applied from unchanged: it says what it would do."""
    c = FakeCluster()
    c.add_deployment("ml", "chat", 3)
    results = Actuator(c, c, dry_run=True).apply([SCALE, evict("gone-pod", gang=None)], context())
    assert [r.result for r in results] == ["dry_run", "dry_run"]
    assert not c.writes


def test_the_documented_results_are_the_ones_reported() -> None:
    assert set(RESULTS) >= {c.result for c in CASES.values()} | {"failed", "blocked", "held", "not_leader", "dry_run"}
    assert {"applied", "unchanged", "gone"} == DONE


# ---- metrics: actions_total by result, lost training work only for stops made ---------------------------------


def test_metrics_count_unchanged_and_gone_apart_from_applied_and_no_lost_work_for_them() -> None:
    c = FakeCluster(pods=[pod("solo", gang=None)], workloads=[job("llama", suspended=True)])
    c.add_deployment("ml", "chat", 3)
    telemetry = Telemetry()
    actuator = Actuator(c, c)
    plan: list[Action] = [SCALE, SUSPEND, evict("solo", gang=None), evict("ghost", gang=None)]
    results = actuator.apply(plan, context())
    TickReporter(telemetry, actuator, None).actions(results, TickReport(NOW, None))  # type: ignore[arg-type]
    assert [r.result for r in results] == ["unchanged", "unchanged", "applied", "gone"]
    text = telemetry.render().decode()
    labels = 'gpu_autoscaler_actions_total{dry_run="false",kind="%s",reason="%s",result="%s"} 1.0'
    assert labels % ("ScaleDeployment", "metric_above_target", "unchanged") in text
    assert labels % ("SuspendWorkload", "preempt_for_inference", "unchanged") in text
    assert labels % ("EvictPod", "preempt_for_inference", "applied") in text
    assert labels % ("EvictPod", "preempt_for_inference", "gone") in text
    assert "gpu_autoscaler_training_gpu_hours_lost_total 1.0" in text  # the one pod evicted, not 2 h + the ghost
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="suspend"} 0.0' in text  # suspended by someone else


# ---- the rate policies count only scale events that happened -----------------------------------------------------


def test_forget_unapplied_drops_the_scale_event_of_an_unchanged_scale() -> None:
    """An ``unchanged`` scale wrote nothing: like ``skipped``, it is not this controller's scale event (somebody else
    put the Deployment at those replicas; the next tick reads them as current)."""
    key = "ml/chat"
    previous = ControllerState({key: ServiceState(scale_events=((NOW - 30, 1),))})
    decided = ControllerState({key: ServiceState(scale_events=((NOW - 30, 1), (NOW, 1)))})
    for result, kept in (("applied", ((NOW - 30, 1), (NOW, 1))), ("unchanged", ((NOW - 30, 1),)),
                         ("gone", ((NOW - 30, 1),)), ("skipped", ((NOW - 30, 1),))):  # fmt: skip
        state = forget_unapplied(decided, previous, [ActionResult(SCALE, result)], NOW)
        assert state.services[key].scale_events == kept, result


# ---- gangs with pods already gone -------------------------------------------------------------------------------


def test_a_gang_with_one_pod_already_gone_is_still_stopped_whole() -> None:
    """A gone pod of a gang is done, not a failure that leaves the rest running: the others are evicted, the gang
    counts as stopped (one Event on the service), and no Event names the gone pod."""
    c = FakeCluster(pods=[pod("w-0"), pod("w-2")])  # w-1 went since the tick read it
    c.add_deployment("ml", "chat", 2)
    telemetry = Telemetry()
    actuator = Actuator(c, c)
    results = actuator.apply([evict("w-0"), evict("w-1"), evict("w-2")], context())
    TickReporter(telemetry, actuator, None).actions(results, TickReport(NOW, None))  # type: ignore[arg-type]
    assert [r.result for r in results] == ["applied", "gone", "applied"]
    assert not any("partly stopped" in r.message or "left running" in r.message for r in results)
    assert not c.pods
    assert pod_events(c) == [("w-0", "uid-w-0"), ("w-2", "uid-w-2")]
    assert [e.name for e in c.events if e.kind == "Deployment"] == ["chat"]  # once per gang
    text = telemetry.render().decode()
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="evict"} 1.0' in text
    assert "gpu_autoscaler_training_gpu_hours_lost_total 2.0" in text  # the two pods evicted


def test_a_gang_whose_first_pod_is_gone_goes_on_with_the_others() -> None:
    """The first pod gone is no failure: nothing is stopped by it, and the rest of the gang is evicted (before, the
    first result not ``applied`` left the rest running)."""
    c = FakeCluster(pods=[pod("w-1"), pod("w-2", uid="uid-w-2")])
    c.add_pod(pod("w-0", uid="uid-successor"))  # a successor of the first worker's name
    results = Actuator(c, c).apply([evict("w-0"), evict("w-1"), evict("w-2")], context())
    assert [r.result for r in results] == ["gone", "applied", "applied"]
    assert list(c.pods) == [f"{NS}/w-0"] and c.pods[f"{NS}/w-0"].uid == "uid-successor"  # spared
    assert [name for name, _ in pod_events(c)] == ["w-1", "w-2"]


def test_a_gang_whose_first_pod_is_gone_and_whose_next_is_refused_stays_running() -> None:
    """Nothing stopped by us yet: the refusal of the first eviction actually sent leaves the gang as it was."""
    c = FakeCluster(pods=[pod("w-1"), pod("w-2")])
    real = c.evict_pod

    def budget_spent_since_the_dry_run(namespace: str, name: str, **kw: object) -> object:
        if name == "w-1" and not kw.get("dry_run"):
            c.block_evictions(NS, "w-1")
        return real(namespace, name, **kw)  # type: ignore[arg-type]

    c.evict_pod = budget_spent_since_the_dry_run  # type: ignore[method-assign,assignment]
    results = Actuator(c, c).apply([evict("w-0"), evict("w-1"), evict("w-2")], context())
    assert [r.result for r in results] == ["gone", "blocked", "blocked"]
    assert all("left running" in r.message for r in results[1:])
    assert set(c.pods) == {f"{NS}/w-1", f"{NS}/w-2"} and not c.events


def test_a_gang_entirely_gone_is_reported_gone_without_any_event() -> None:
    c = FakeCluster()
    telemetry = Telemetry()
    actuator = Actuator(c, c)
    results = actuator.apply([evict("w-0"), evict("w-1")], context())
    TickReporter(telemetry, actuator, None).actions(results, TickReport(NOW, None))  # type: ignore[arg-type]
    assert [r.result for r in results] == ["gone", "gone"] and not c.events
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="evict"} 0.0' in telemetry.render().decode()


def test_a_partly_stopped_gang_does_not_count_its_gone_pods_as_left() -> None:
    c = FakeCluster(pods=[pod("w-0"), pod("w-2")])
    real = c.evict_pod

    def refuse_w2_for_real(namespace: str, name: str, **kw: object) -> object:
        if name == "w-2" and not kw.get("dry_run"):
            c.block_evictions(NS, "w-2")
        return real(namespace, name, **kw)  # type: ignore[arg-type]

    c.evict_pod = refuse_w2_for_real  # type: ignore[method-assign,assignment]
    results = Actuator(c, c).apply([evict("w-0"), evict("w-1"), evict("w-2")], context())
    assert [r.result for r in results] == ["applied", "gone", "blocked"]
    assert "partly stopped (1 of 3 pods)" in results[2].message
    assert "partly stopped" not in results[1].message


# ---- a consolidation's give-back after stops found done already ------------------------------------------------


def test_a_node_is_given_back_when_the_stop_it_needs_was_done_already() -> None:
    """The workload on the node was suspended by somebody else meanwhile (``unchanged``): its GPUs are free all the
    same, so the node the plan emptied is given back."""
    c = FakeCluster(workloads=[job("llama", suspended=True)])
    c.add_pool("burst", 2)
    suspend = SuspendWorkload("Job", NS, "llama", PREEMPT, "move", service="ml/chat")
    give_back = ScaleNodePool("burst", 1, 2, Reason.BURST_SCALE_DOWN, "move", remove_node="burst-1", needs=(suspend,))
    results = Actuator(c, c).apply([suspend, give_back], context())
    assert [r.result for r in results] == ["unchanged", "applied"]
    assert c.pools["burst"].size == 1


# ---- the simulator's cluster says what it did too ------------------------------------------------------------------


def test_the_fake_cluster_writes_say_what_they_did() -> None:
    c = FakeCluster(workloads=[job("llama")])
    c.add_deployment("ml", "chat", 2)
    c.add_pool("burst", 1)
    assert c.scale_deployment("ml", "chat", 3) is WriteOutcome.WROTE
    assert c.scale_deployment("ml", "chat", 3) is WriteOutcome.ALREADY
    assert c.suspend_workload("Job", NS, "llama") is WriteOutcome.WROTE
    assert c.suspend_workload("Job", NS, "llama") is WriteOutcome.ALREADY
    assert c.resume_workload("Job", NS, "llama") is WriteOutcome.WROTE
    assert c.resume_workload("Job", NS, "llama") is WriteOutcome.ALREADY
    c.delete_workload("Job", NS, "llama")
    assert c.suspend_workload("Job", NS, "llama") is WriteOutcome.GONE
    assert c.resume_workload("Job", NS, "llama") is WriteOutcome.GONE
    assert c.scale("burst", 2) is WriteOutcome.WROTE
    assert c.scale("burst", 2) is WriteOutcome.ALREADY


def test_the_simulated_cluster_writes_say_what_they_did() -> None:
    from autoscaler.sim.cluster import SimCluster, SimDeployment, SimPool

    sim = SimCluster()
    sim.add_pool(SimPool("burst", 8, None, 0.0, max_nodes=1))
    sim.add_node("n0", 8)
    sim.add_deployment(SimDeployment("ml", "chat", 1, gpus_per_replica=1))
    sim.add_training_pod(NS, "w0", 4, 10, gang=f"jobset/{NS}/big", node="n0")
    assert sim.scale_deployment("ml", "chat", 2) is WriteOutcome.WROTE
    assert sim.scale_deployment("ml", "chat", 2) is WriteOutcome.ALREADY
    assert sim.suspend_workload("JobSet", NS, "big") is WriteOutcome.WROTE
    assert sim.suspend_workload("JobSet", NS, "big") is WriteOutcome.ALREADY  # its pods are gone already
    assert sim.scale("burst", 1) is WriteOutcome.WROTE
    assert sim.scale("burst", 2) is WriteOutcome.ALREADY  # clamped to its max: nothing to write
    (replica, *_) = [p for p in sim.snapshot(0.0).pods if p.owner_name == "chat"]
    actuator = Actuator(sim, sim)
    results = actuator.apply([EvictPod("ml", replica.name, Reason.REBALANCE, "move"),
                              EvictPod("ml", "no-such-pod", Reason.REBALANCE, "move")], context())  # fmt: skip
    assert [r.result for r in results] == ["applied", "gone"]
    assert [e[3] for e in sim.events if e[1] == "Pod"] == [replica.name]


def test_a_gang_whose_evictions_span_two_ticks_counts_as_one_gang_stopped() -> None:
    """A budget refuses the gang's last pod at one tick, after its first pod went (a budget spent between the dry
    runs and the evictions), and the next tick evicts it: one gang stopped in ``training_gangs_stopped_total``
    (GPUAutoscalerTrainingThrash counts it), not two; its lost work is counted once per pod. The same gang stopped
    again past the window counts again."""
    from autoscaler.actuator import ActionResult
    from autoscaler.reporting import GANG_COUNTED_FOR_S

    c = FakeCluster(pods=[])
    telemetry = Telemetry()
    reporter = TickReporter(telemetry, Actuator(c, c), None)
    first = [ActionResult(evict("w-0"), "applied", ""), ActionResult(evict("w-1"), "blocked", "")]
    reporter.actions(first, TickReport(NOW, None))  # type: ignore[arg-type]
    reporter.actions([ActionResult(evict("w-1"), "applied", "")], TickReport(NOW + 15, None))  # type: ignore[arg-type]
    text = telemetry.render().decode()
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="evict"} 1.0' in text
    assert "gpu_autoscaler_training_gpu_hours_lost_total 2.0" in text  # both pods' work
    later = [ActionResult(evict("w-0"), "applied", "")]
    reporter.actions(later, TickReport(NOW + 15 + GANG_COUNTED_FOR_S, None))  # type: ignore[arg-type]
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="evict"} 2.0' in telemetry.render().decode()
