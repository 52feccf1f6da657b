"""Defect review of the actuator (review 32): a gang is stopped whole or not at all, also when its evictions are not
next to each other in the plan or when its first real eviction fails; a pod, a suspension or a resumption that a
plan names twice is written (and reported, and counted) once; a plan that both suspends and resumes a workload
applies neither. Against the in-memory ``FakeCluster``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoscaler.actuator import ActionResult, Actuator, GuardContext
from autoscaler.core.cluster import PodInfo
from autoscaler.core.model import Action, EvictPod, ResumeWorkload, ScaleDeployment, ScaleNodePool, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import EvictionOutcome, PortError, WriteGuard

NS = "train"
GANG = f"kubeflow/{NS}/g1"
PREEMPT = Reason.PREEMPT_FOR_INFERENCE


def pod(name: str, gang: str | None = GANG) -> PodInfo:
    return PodInfo(NS, name, "gpu-0", 1, 0, "Running", True, gang=gang, uid=f"uid-{name}")


def evict(name: str, gang: str | None = GANG) -> EvictPod:
    return EvictPod(NS, name, PREEMPT, "for ml/chat", gang=gang, service="ml/chat", lost_work_gpu_s=3600.0,
                    uid=f"uid-{name}")


def cluster(*names: str) -> FakeCluster:
    c = FakeCluster(pods=[pod(n) for n in names])
    c.add_deployment("ml", "chat", 2)
    return c


def context() -> GuardContext:
    return GuardContext(1000.0, {})


def outcomes(results: list[ActionResult]) -> list[str]:
    return [r.result for r in results]


def real_evictions(c: FakeCluster) -> list[tuple[Any, ...]]:
    return [w.args for w in c.writes if w.op == "evict_pod" and "dry-run" not in w.args and w.outcome != "blocked"]


# ---- a gang whose evictions are not contiguous in the plan --------------------------------------------------------


def test_a_gang_split_by_another_action_in_the_plan_is_still_stopped_whole_or_not_at_all() -> None:
    """The gang's second pod is refused by a budget: the first must not have been evicted already (the old apply
    made two gangs of one, dry-ran and evicted the first half before asking about the second)."""
    c = cluster("w-0", "w-1")
    c.block_evictions(NS, "w-1")
    scale = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
    plan: list[Action] = [evict("w-0"), scale, evict("w-1")]
    results = Actuator(c, c).apply(plan, context())
    assert [r.action for r in results] == plan  # one result per action, in the plan's order
    assert outcomes(results) == ["blocked", "applied", "blocked"]
    assert real_evictions(c) == []
    assert f"{NS}/w-0" in c.pods and f"{NS}/w-1" in c.pods


def test_a_split_gang_that_may_be_stopped_is_stopped_once_with_one_event_on_the_service() -> None:
    c = cluster("w-0", "w-1")
    scale = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
    results = Actuator(c, c).apply([evict("w-0"), scale, evict("w-1")], context())
    assert outcomes(results) == ["applied", "applied", "applied"]
    assert not c.pods
    dry_runs = [w.args for w in c.writes if w.op == "evict_pod" and "dry-run" in w.args]
    assert [a[1] for a in dry_runs] == ["w-0", "w-1"]  # both asked before either went
    assert [e.name for e in c.events if e.kind == "Deployment" and "gang" in e.message] == ["chat"]


# ---- the first real eviction of a gang fails -------------------------------------------------------------------------


class FirstEvictionFails(FakeCluster):
    """The dry runs pass; the first real eviction fails (an API error) or is refused (a budget spent meanwhile)."""

    def __init__(self, outcome: EvictionOutcome | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outcome = outcome
        self.tripped = False

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> EvictionOutcome:
        if not dry_run and not self.tripped:
            self.tripped = True
            if self.outcome is None:
                raise PortError(f"evict pod {namespace}/{name}: HTTP 500")
            return self.outcome
        return super().evict_pod(namespace, name, dry_run=dry_run, can_write=can_write, uid=uid)


def test_an_api_error_on_a_gangs_first_eviction_leaves_the_whole_gang_running() -> None:
    """A Kubernetes API error never causes a preemption: the first eviction failed, nothing is stopped yet, so the
    other pods are not evicted (the old loop went on and broke the gang)."""
    c = FirstEvictionFails(None, pods=[pod(n) for n in ("w-0", "w-1", "w-2")])
    errors: list[str] = []
    results = Actuator(c, c, on_error=errors.append).apply([evict(n) for n in ("w-0", "w-1", "w-2")], context())
    assert outcomes(results) == ["failed", "failed", "failed"]
    assert all(r.component == "cluster_write" and f"gang {GANG} left running" in r.message for r in results)
    assert errors == ["cluster_write"]  # one failed request, counted once
    assert len(c.pods) == 3 and real_evictions(c) == []
    assert not [e for e in c.events if e.kind in ("Pod", "Deployment")]


def test_a_budget_spent_between_the_dry_run_and_a_gangs_first_eviction_leaves_the_whole_gang_running() -> None:
    c = FirstEvictionFails(EvictionOutcome.BLOCKED, pods=[pod(n) for n in ("w-0", "w-1")])
    results = Actuator(c, c).apply([evict("w-0"), evict("w-1")], context())
    assert outcomes(results) == ["blocked", "blocked"]
    assert len(c.pods) == 2 and real_evictions(c) == []


# ---- the same object twice in one plan -------------------------------------------------------------------------------


def test_a_pod_named_twice_in_a_plan_is_evicted_reported_and_told_once() -> None:
    """The second eviction of a pod the first one removed answers 404 (GONE, reported applied): it would be a second
    Normal Event, and its lost work would be counted twice."""
    c = cluster("solo")
    results = Actuator(c, c).apply([evict("solo", gang=None), evict("solo", gang=None)], context())
    assert outcomes(results) == ["applied", "skipped"]
    assert "twice" in results[1].message
    assert len([w for w in c.writes if w.op == "evict_pod"]) == 1
    assert [(e.kind, e.name, e.count) for e in c.events if e.kind == "Pod"] == [("Pod", "solo", 1)]


def test_a_gang_member_named_twice_is_evicted_once() -> None:
    c = cluster("w-0", "w-1")
    results = Actuator(c, c).apply([evict("w-0"), evict("w-1"), evict("w-0")], context())
    assert outcomes(results) == ["applied", "applied", "skipped"]
    assert [a[1] for a in real_evictions(c)] == ["w-0", "w-1"]


def test_a_workload_suspended_twice_in_a_plan_is_suspended_and_told_once() -> None:
    c = FakeCluster()
    suspend = SuspendWorkload("Job", NS, "train-a", PREEMPT, "for ml/chat", "ml/chat", 7200.0)
    results = Actuator(c, c).apply([suspend, suspend], context())
    assert outcomes(results) == ["applied", "skipped"]
    assert [e.count for e in c.events if e.kind == "Job"] == [1]


def test_a_plan_that_suspends_and_resumes_the_same_workload_applies_neither() -> None:
    """Suspended then resumed, the training would lose its pods (and the work since its checkpoint) for nothing;
    the plan contradicts itself, so the next tick decides on fresh data."""
    c = FakeCluster()
    suspend = SuspendWorkload("Job", NS, "train-a", PREEMPT, "for ml/chat", "ml/chat", 7200.0)
    resume = ResumeWorkload("Job", NS, "train-a", Reason.RESUME_TRAINING, "GPUs free again")
    other = ResumeWorkload("Job", NS, "train-b", Reason.RESUME_TRAINING, "GPUs free again")
    c.suspended.add(("Job", NS, "train-b"))
    # train-b is resumed by the first plan; the second finds it running: unchanged, nothing written
    for plan, other_result in (([suspend, other, resume], "applied"), ([resume, other, suspend], "unchanged")):
        c.writes.clear()
        results = Actuator(c, c).apply(plan, context())
        assert outcomes(results)[1] == other_result
        assert [r.result for r in results if r.action.name == "train-a"] == ["skipped", "skipped"]
        assert all("both suspends and resumes" in r.message for r in results if r.action.name == "train-a")
        assert [w.args for w in c.writes if w.outcome == "applied"] in ([("Job", NS, "train-b")], [])
        assert ("Job", NS, "train-a") not in c.suspended


def test_a_deployment_scaled_twice_alike_in_a_plan_is_scaled_and_told_once() -> None:
    c = cluster()
    scale = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
    results = Actuator(c, c).apply([scale, scale], context())
    assert outcomes(results) == ["applied", "skipped"]
    assert [(e.name, e.count) for e in c.events if e.kind == "Deployment"] == [("chat", 1)]


def test_a_plan_that_scales_a_deployment_both_ways_applies_neither() -> None:
    """Up and down from the same replicas: with the scale-up failing (an API error) the old apply went on and
    scaled down; the plan contradicts itself, so neither is written."""
    c = cluster()
    c.fail("scale_deployment")
    up = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
    down = ScaleDeployment("ml", "chat", 1, 2, Reason.METRIC_BELOW_TARGET, "down")
    results = Actuator(c, c).apply([up, down], context())
    assert outcomes(results) == ["skipped", "skipped"]
    assert c.deployments["ml/chat"].spec_replicas == 2


def test_a_plan_that_resizes_a_pool_two_ways_applies_neither() -> None:
    c = cluster()
    c.add_pool("burst", 2)
    grow = ScaleNodePool("burst", 3, 2, Reason.METRIC_ABOVE_TARGET, "burst")
    shrink = ScaleNodePool("burst", 1, 2, Reason.METRIC_BELOW_TARGET, "give back")
    results = Actuator(c, c).apply([grow, shrink, grow], context())
    assert outcomes(results) == ["skipped", "skipped", "skipped"]
    assert c.pools["burst"].size == 2


# ---- a consolidation: the node is given back only once its move's stops are made ---------------------------------

MOVE = "burst-a: give back burst-1, its 2 replica(s) fit once train/g1 is stopped, for 700s"


def consolidation(c: FakeCluster) -> list[Action]:
    """``core.arbitrate``'s consolidation: stop the gangs whose GPUs take the node's replicas, give the node back
    (the resize names the stops it needs)."""
    c.add_pool("burst-a", 2)
    stops = [replace(evict(n), detail=MOVE) for n in ("w-0", "w-1")]
    give_back = ScaleNodePool(
        "burst-a", 1, 2, Reason.BURST_SCALE_DOWN, MOVE, remove_node="burst-a-1", needs=tuple(stops)
    )
    return [*stops, give_back]


def test_a_burst_node_is_not_given_back_when_the_gangs_its_move_needs_stopped_were_not() -> None:
    """A budget refuses the gang's eviction: the node's replicas would have nowhere to go (the old apply removed
    the node anyway, an API error or a PDB turned into a replica-killing scale-down)."""
    c = cluster("w-0", "w-1")
    c.block_evictions(NS, "w-1")
    results = Actuator(c, c).apply(consolidation(c), context())
    assert outcomes(results) == ["blocked", "blocked", "skipped"]
    assert "train/w-0" in results[2].message or "not made" in results[2].message
    assert c.pools["burst-a"].size == 2 and not [w for w in c.writes if w.op == "scale"]


def test_a_burst_node_is_not_given_back_when_the_suspension_its_move_needs_failed() -> None:
    c = cluster()
    c.add_pool("burst-a", 2)
    c.fail("suspend_workload")
    suspend = SuspendWorkload("Job", NS, "train-a", PREEMPT, MOVE, "ml/chat", 7200.0)
    give_back = ScaleNodePool(
        "burst-a", 1, 2, Reason.BURST_SCALE_DOWN, MOVE, remove_node="burst-a-1", needs=(suspend,)
    )
    other = ScaleNodePool("burst-b", 3, 2, Reason.BURST_SCALE_UP, "short")
    c.add_pool("burst-b", 2)
    results = Actuator(c, c).apply([suspend, give_back, other], context())
    assert outcomes(results) == ["failed", "skipped", "applied"]
    assert c.pools["burst-a"].size == 2 and c.pools["burst-b"].size == 3


def test_a_burst_node_whose_move_was_made_is_given_back() -> None:
    c = cluster("w-0", "w-1")
    results = Actuator(c, c).apply(consolidation(c), context())
    assert outcomes(results) == ["applied", "applied", "applied"]
    assert c.pools["burst-a"].size == 1 and "burst-a-1" not in c.pools["burst-a"].nodes


def test_a_give_back_is_applied_in_its_place_in_the_plan_not_after_the_plans_other_writes() -> None:
    """Waiting for its stops must not move the give-back after the plan's later writes: a replica scaled up after
    it would land on the node about to go (in the simulator: mixed-training's actions went 831 -> 853)."""
    c = cluster("w-0", "w-1")
    up = ScaleDeployment("ml", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "up")
    results = Actuator(c, c).apply([*consolidation(c), up], context())
    assert outcomes(results) == ["applied", "applied", "applied", "applied"]
    order = [w.op for w in c.writes if w.outcome == "applied" and "dry-run" not in w.args]
    assert order.index("scale") < order.index("scale_deployment"), order
