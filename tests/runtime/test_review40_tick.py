"""Review 40 of the controller's tick flow (``autoscaler/controller.py``: ``Controller._tick`` and what it hands the
ports) and of its actuator (``autoscaler/actuator.py``: the guard, leadership, gangs, preconditions).

Defects found (each has a test below that was a strict xfail on the code as it was):

1. WRONG: two GPUScalingPolicies on one Deployment: the first listed (or the established owner) scales it, the other
   is reported invalid ("already scaled by"). ``_configure_queries`` built the PromQL overrides by service key from
   *every* object naming the Deployment, the last listed winning: the duplicate's ``spec.queries`` replaced the
   owner's, so the owner's Deployment was scaled on a signal its own policy never asked for; and a duplicate whose
   override the metrics source rejects made the *owner* invalid (the error of the duplicate's field reported on the
   owner, its Deployment no longer scaled at all). RIGHT: only the owning object's ``spec.queries`` are handed to
   the metrics source, and a rejected override invalidates the object that carries it.
2. WRONG: ``_yield_to_hpas`` picked the object of each service the same way (the last listed): with an HPA on the
   Deployment, the ``HpaConflict`` / ``WaitingForHpaRemoval`` Event went to the duplicate policy, and the owner's
   ``spec.adoptHpa`` was ignored for the duplicate's (none): a hand-over under way was reported as a conflict on an
   object that scales nothing. RIGHT: the owner's ``adoptHpa`` decides, and the Event is on the owner.
3. WRONG: ``Actuator._apply_gang`` asked ``can_act()`` once and, on "no", handed every eviction of the gang to
   ``apply_one`` one by one, which asks ``can_act()`` again for each. ``can_act`` is the Lease's ``may_write``: False
   a moment before a renewal, True right after it. A gang met in that moment skipped the PodDisruptionBudget checks
   and the dry-run evictions, and its pods were evicted independently: the first made, the second refused by its
   budget, the gang broken (its work lost, its other pods holding their GPUs for a job that cannot progress) -- the
   very outcome the dry runs are there to prevent. RIGHT: a gang met without the Lease is left running whole
   (``not_leader`` for every pod, nothing sent); the next tick plans it again.
4. WRONG: ``Controller._rebalance`` counted only the ``applied`` evictions against the hourly bound (and the move
   ledger was corrected down for the others). An eviction the API server made but whose answer was lost (a read
   timeout) is ``failed``: a move made and never counted, so a flaky API server lets the rebalancer evict past
   ``max_moves_per_hour``. RIGHT: a failed eviction's outcome is unknown and it stays counted, as a failed
   scale-down stays counted against its rate policy (``forget_unapplied``); only evictions known not made (refused,
   gone, held, not the leader) give their budget back.

Also pinned, checked here and pinned nowhere else: the guard's takeover grace (a new leader's scale-down waits one
scale-down window after it took over, a scale-up does not); a Deployment scaled to the wanted replicas by somebody
else between the tick's read and its write is ``unchanged`` -- no Event, no scale event counted against the rate
policies -- and the preemption planned for those replicas goes out (they are real); a gang met without the Lease
sends no request at all. Everything runs on the in-memory ports; time is an argument.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from runtime_fakes import FakeCluster as SimpleCluster
from runtime_fakes import FakeMetrics, FakePolicies, full_cluster_with_training, policy_object

from autoscaler.actuator import Actuator, GuardContext, guard
from autoscaler.controller import Controller
from autoscaler.core.cluster import ClusterSnapshot, HpaInfo, NodeInfo, PodInfo
from autoscaler.core.model import EvictPod, MetricKind, ScaleDeployment, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import RebalanceConfig
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import EvictionOutcome, PolicyObject, PortError
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
TICK = 15.0
KEY = "ml/chat"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


# ---- 1, 2. two policies on one Deployment: the duplicate's spec must not steer the owner's -----------------------


class _QueryMetrics(FakeMetrics):
    """Records the overrides handed to it; rejects ``{"broken": ...}`` as the Prometheus adapter rejects a bad
    override: ``ValueError("<namespace>/<name>: spec.queries.<field>: <why>")``, nothing changed."""

    def __init__(self, cluster: SimpleCluster) -> None:
        super().__init__(cluster)
        self.queries: dict[str, Any] = {}

    def set_service_queries(self, service_queries: Mapping[str, Any]) -> None:
        for key, spec in service_queries.items():
            if "broken" in spec:
                raise ValueError(f"{key}: spec.queries.gpuUtilization: parse error at char 3")
        self.queries = dict(service_queries)


def _chat(min_replicas: int = 1) -> ServicePolicy:
    return ServicePolicy("ml", "chat", min_replicas=min_replicas, max_replicas=20, target=70.0)


def _two_policies(owner: PolicyObject, duplicate: PolicyObject) -> tuple[Controller, SimpleCluster, _QueryMetrics]:
    cluster = SimpleCluster(deployments={KEY: [4, 4]})
    metrics = _QueryMetrics(cluster)
    metrics.util[KEY] = 140.0  # wants 8 of its 4
    controller = Controller(metrics=metrics, cluster=cluster, writer=cluster, policies=FakePolicies([owner, duplicate]))
    controller.acting_since = T0 - 3600
    return controller, cluster, metrics


def _invalid(controller: Controller) -> dict[str, str | None]:
    assert controller.last_report is not None
    return {o.name: o.error for o in controller.last_report.invalid_policies}


def test_a_duplicate_policys_query_override_never_reaches_the_owners_service() -> None:
    """Fixed (was a strict xfail).

    WRONG: chat-policy owns ml/chat with its own gpuUtilization override; z-duplicate, listed after it, names ml/chat
    too (reported invalid, "already scaled by chat-policy") with another override. The metrics source was handed
    z-duplicate's query for ml/chat: the owner's Deployment scaled on a signal its policy never named. RIGHT: the
    metrics source gets the owner's override only."""
    owner = dataclasses.replace(policy_object(_chat()), queries={"gpuUtilization": "owner_query"})
    duplicate = dataclasses.replace(
        policy_object(_chat(), name="z-duplicate"), queries={"gpuUtilization": "duplicate_query"}
    )
    controller, _, metrics = _two_policies(owner, duplicate)
    controller.run_once(T0)
    assert set(_invalid(controller)) == {"z-duplicate"}
    assert metrics.queries == {KEY: {"gpuUtilization": "owner_query"}}


def test_a_duplicate_policys_broken_override_does_not_invalidate_the_owner() -> None:
    """Fixed (was a strict xfail).

    WRONG: the duplicate's override does not parse. It was the one handed to the metrics source for ml/chat, the
    source rejected it, and ``_configure_queries`` reported the first object naming ml/chat -- the owner -- invalid
    with the duplicate's ``spec.queries.gpuUtilization`` error, and dropped the service: ml/chat, wanting 8, was not
    scaled at all, for as long as the duplicate exists. RIGHT: the owner (no override) stays valid and scales its
    Deployment; the duplicate is reported as the duplicate it is."""
    owner = policy_object(_chat())
    duplicate = dataclasses.replace(policy_object(_chat(), name="z-duplicate"), queries={"broken": "rate(("})
    controller, cluster, _ = _two_policies(owner, duplicate)
    controller.run_once(T0)
    invalid = _invalid(controller)
    assert set(invalid) == {"z-duplicate"}
    assert "already scaled by chat-policy" in (invalid["z-duplicate"] or "")
    assert [w.args for w in cluster.writes if w.op == "scale"] == [("ml", "chat", 8)]


def test_the_owners_adopt_hpa_decides_and_the_hpa_event_goes_to_the_owner() -> None:
    """Fixed (was a strict xfail).

    WRONG: chat-policy adopts HPA chat-hpa (``spec.adoptHpa``: the hand-over is under way, recommend-only until the
    user deletes the HPA); z-duplicate names ml/chat too, without adoptHpa. The HPA Event was written on
    z-duplicate, as an ``HpaConflict`` Warning telling the user to delete the HPA or set adoptHpa -- on an object that
    scales nothing, while the owner's hand-over went unmentioned. RIGHT: ``WaitingForHpaRemoval`` (Normal) on
    chat-policy; the duplicate gets its own invalid-spec Event only."""
    owner = dataclasses.replace(policy_object(_chat()), adopt_hpa="chat-hpa")
    duplicate = policy_object(_chat(), name="z-duplicate")
    controller, cluster, _ = _two_policies(owner, duplicate)
    cluster.hpas = [HpaInfo("ml", "chat-hpa", "Deployment", "chat", 1, 10, 4, 4)]
    controller.run_once(T0)
    hpa_events = [(e["name"], e["reason"], e["type"]) for e in cluster.events if "Hpa" in e["reason"]]
    assert hpa_events == [("chat-policy", "WaitingForHpaRemoval", "Normal")]
    assert [w for w in cluster.writes if w.op == "scale"] == []  # recommend-only while the HPA is there


# ---- 3. a gang met in the moment the Lease is not sure ------------------------------------------------------------


def _gang_cluster() -> FakeCluster:
    """A two-pod gang; its second pod's evictions are refused (a PodDisruptionBudget that allows none)."""
    cluster = FakeCluster(
        pods=[
            PodInfo("train", n, "gpu-0", 1, 0, "Running", True, gang="job/train/g", uid=f"uid-{n}")
            for n in ("w-0", "w-1")
        ]
    )
    cluster.block_evictions("train", "w-1")
    return cluster


def _gang() -> list[EvictPod]:
    return [
        EvictPod("train", n, Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang="job/train/g", uid=f"uid-{n}")
        for n in ("w-0", "w-1")
    ]


def test_a_gang_met_while_the_lease_is_not_sure_is_left_running_whole() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``can_act()`` says no when the gang comes up (the Lease near its renew deadline) and yes a moment later
    (renewed). The gang's evictions went to ``apply_one`` one at a time, without the budget check and the dry runs:
    w-0 was evicted, w-1 refused by its budget -- the gang broken. RIGHT: without the Lease the gang is left running
    whole (``not_leader`` for both pods, no request sent)."""
    cluster = _gang_cluster()
    answers = iter([False])
    actuator = Actuator(cluster, cluster, can_act=lambda: next(answers, True))
    results = actuator.apply(_gang(), GuardContext(T0, {}))
    assert [r.result for r in results] == ["not_leader", "not_leader"]
    assert [w for w in cluster.writes if w.op == "evict_pod"] == []


def test_review_setup_the_same_gang_with_the_lease_is_left_running_by_its_dry_run() -> None:
    """What the test above departs from: with the Lease, w-1's dry run is refused and neither pod is evicted."""
    cluster = _gang_cluster()
    results = Actuator(cluster, cluster).apply(_gang(), GuardContext(T0, {}))
    assert [r.result for r in results] == ["blocked", "blocked"]
    assert [
        w for w in cluster.writes if w.op == "evict_pod" and w.outcome == "evicted" and "dry-run" not in w.args
    ] == []


def test_a_gang_met_without_the_lease_sends_nothing() -> None:
    """Pin: a gang met after the Lease is lost: every pod ``not_leader``, not even a dry-run eviction is sent."""
    cluster = _gang_cluster()
    results = Actuator(cluster, cluster, can_act=lambda: False).apply(_gang(), GuardContext(T0, {}))
    assert [r.result for r in results] == ["not_leader", "not_leader"]
    assert cluster.writes == []


# ---- pins: the takeover grace; a Deployment scaled by somebody else between the read and the write --------------


def test_a_new_leaders_scale_down_waits_one_window_and_its_scale_up_does_not() -> None:
    """Pin: ``guard`` holds a scale-down for the service's scale-down window (300 s by default) after the process
    took over -- the previous leader's window may have been holding it back -- and lets it go after; a scale-up is
    never held by it."""
    policy = _chat()
    window = policy.scale_down.stabilisation_s
    down = ScaleDeployment("ml", "chat", 2, 8, Reason.METRIC_BELOW_TARGET, "down")
    up = ScaleDeployment("ml", "chat", 12, 8, Reason.METRIC_ABOVE_TARGET, "up")
    taken_over = T0 - window + 10
    within = GuardContext(T0, {KEY: policy}, acting_since=taken_over)
    held = guard(down, within)
    assert held is not None and held.startswith("takeover grace")
    assert guard(up, within) is None
    assert guard(down, GuardContext(T0 + 10, {KEY: policy}, acting_since=taken_over)) is None


class _ScaledBySomebodyElse(FakeCluster):
    """Somebody else (a person, a CI job) sets inference/chat to ``to`` replicas right after each tick's read."""

    to: int | None = None

    def snapshot(self, now: float) -> ClusterSnapshot:
        snapshot = super().snapshot(now)
        if self.to is not None:
            dep = self.deployments["inference/chat"]
            self.deployments["inference/chat"] = dataclasses.replace(dep, spec_replicas=self.to)
        return snapshot


def test_a_scale_up_somebody_else_made_between_read_and_write_still_gets_its_gpus() -> None:
    """Pin: chat (8 replicas, wanting 12) fills n1; n2 holds a low-priority training. Right after the tick's read,
    somebody else scales chat to 12 too. The write finds 12: ``unchanged`` (nothing written, no Event on the
    Deployment, no scale event counted as this controller's), and the suspension planned for those 4 replicas goes
    out: they exist, and their GPUs are the training's."""
    controller, cluster, _ = full_cluster_with_training(_ScaledBySomebodyElse, T0, node_pools=True)
    cluster.to = 12
    controller.run_once(T0)
    report = controller.last_report
    assert report is not None
    assert [(type(r.action).__name__, r.result) for r in report.results] == [
        ("ScaleDeployment", "unchanged"),
        ("SuspendWorkload", "applied"),
    ]
    assert ("Job", "ml", "train") in cluster.suspended
    assert [e.kind for e in cluster.events if e.kind == "Deployment" and e.reason == "MetricAboveTarget"] == []
    assert controller.state.services["inference/chat"].scale_events == ()


# ---- 4. a rebalance eviction made but answered by a timeout ---------------------------------------------------------


class _EvictedThenTimedOut(FakeCluster):
    """The eviction is made, then its answer is lost (a read timeout after the API server committed it)."""

    timeouts: int = 0

    def evict_pod(self, namespace: str, name: str, **options: Any) -> EvictionOutcome:
        outcome = super().evict_pod(namespace, name, **options)
        if self.timeouts > 0 and not options.get("dry_run"):
            self.timeouts -= 1
            raise PortError(f"evict pod {namespace}/{name}: read timed out (10s)")
        return outcome


def _rebalance_world() -> tuple[Controller, _EvictedThenTimedOut]:
    """chat has a replica on n1 beside a 4-GPU job and one alone on n2; an 8-GPU job waits and fits only once
    chat-1 leaves n2 (as ``test_rebalance_pass.world``)."""
    chat = ServicePolicy("inf", "chat", min_replicas=1, max_replicas=10, metric=MetricKind.REQUEST_RATE, target=10.0)
    cluster = _EvictedThenTimedOut(nodes=[NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3")])
    cluster.add_deployment("inf", "chat", 2, selector={"app": "chat"})
    for i, node in enumerate(("n1", "n2")):
        cluster.add_pod(
            PodInfo("inf", f"chat-{i}", node, 1, 1000, "Running", True, "Deployment", "chat", labels={"app": "chat"})
        )
    for name, node, gpus in (("fixed", "n1", 4), ("big", "n3", 6), ("wait", None, 8)):
        cluster.add_pod(
            PodInfo("ml", name, node, gpus, 100, "Running" if node else "Pending", node is not None, "Job", name,
                    gang=f"job/ml/{name}")
        )  # fmt: skip
    metrics = FakeMetricsSource()
    metrics.set_service(chat.key, spec_replicas=2, ready_replicas=2, metric_total=20.0, request_rate=20.0)
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(chat)]),
        telemetry=Telemetry(),
        rebalance=RebalanceConfig(max_moves_per_pass=2, max_moves_per_hour=3, spare_replicas_only=False),
    )
    controller.acting_since = T0 - 3600
    return controller, cluster


def test_a_rebalance_eviction_whose_answer_timed_out_still_counts_against_the_hourly_bound() -> None:
    """Fixed (was a strict xfail).

    WRONG: the pass evicts chat-1; the API server makes the eviction but its answer is lost (a read timeout):
    ``failed``. ``_rebalance`` counted only ``applied`` evictions, so the move spent none of the hourly bound (and
    its target was not made to wait): a flaky API server lets the rebalancer evict past ``max_moves_per_hour``,
    every eviction made and none counted. RIGHT: a failed eviction's outcome is unknown, so it stays counted, as a
    failed scale-down stays counted against its rate policy (``forget_unapplied``); only an eviction known not made
    (refused by a budget, the pod gone, not the leader) gives its budget back."""
    controller, cluster = _rebalance_world()
    cluster.timeouts = 1
    controller.run_once(T0)
    report = controller.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["failed"]
    assert "inf/chat-1" not in cluster.pods  # it went all the same
    assert controller.rebalance_state.move_times == (T0 + 1,)
