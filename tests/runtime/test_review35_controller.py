"""Review 35 of the controller loop under faults (``autoscaler/controller.py``, ``runtime.py``, ``app.py``,
``actuator.py``): reproductions of the defects found, each a strict xfail until it is fixed.

The rule under test: a Prometheus outage or a Kubernetes API error never causes a scale-down, a preemption or a
crash loop, and a restart, a change of leader or a clock step causes no spurious action. Everything runs on the
in-memory ports (``runtime_fakes``, ``autoscaler.fakes``); time is an argument or a fake clock: nothing sleeps.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
from pydantic import ValidationError
from runtime_fakes import FakeCluster as SimpleCluster
from runtime_fakes import FakeMetrics, FakePolicies, full_cluster_with_training, policy_object
from test_forecasting import DAY, DAY0, JUMP, PEAK, TICK, World, policy, series

from autoscaler.adapters.kubernetes.policies import PolicyLoader
from autoscaler.app import Adapters, build_runtime
from autoscaler.controller import Controller
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import RateKind, RatePolicy, ScalingRules, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import ChangedSinceRead, PortError
from autoscaler.runtime import Runtime, noop_job
from autoscaler.settings import Settings, SettingsError
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
KEY = "ml/chat"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


# ---- 1. a failed scale-up still preempts the training it was for (actuator.py: Actuator.apply) ----------------------


def _training_stopped(cluster: FakeCluster) -> list[Any]:
    return [w for w in cluster.writes if w.op in ("suspend_workload", "evict_pod") and w.outcome == "applied"]


def test_the_preemption_goes_out_when_the_scale_up_succeeds() -> None:
    """The baseline the next test departs from: the scale-up is written, the training is stopped for it."""
    controller, cluster, _ = full_cluster_with_training(FakeCluster, T0)
    controller.run_once(T0)
    assert [(w.op, w.outcome) for w in cluster.writes if w.op == "scale_deployment"] == [
        ("scale_deployment", "applied")
    ]
    assert len(_training_stopped(cluster)) == 1


@pytest.mark.parametrize(
    "fault",
    [
        PortError("scale_deployment: HTTP 500 Internal Server Error"),
        ChangedSinceRead("scale deployment inference/chat: replicas are 0, not the 8 the tick decided from"),
    ],
    ids=["api-error", "changed-since-read"],
)
def test_a_scale_up_that_was_not_written_stops_no_training(fault: Exception) -> None:
    controller, cluster, _ = full_cluster_with_training(FakeCluster, T0)
    cluster.fail("scale_deployment", fault, times=None)
    controller.run_once(T0)
    report = controller.last_report
    assert report is not None
    assert [r.result for r in report.results if type(r.action).__name__ == "ScaleDeployment"] != ["applied"]
    assert _training_stopped(cluster) == [], "training preempted for a scale-up that was never written"
    assert ("Job", "ml", "train") not in cluster.suspended


# ---- 2. a forecast read failure is not a hold (controller.py: Controller._decide_tick) -----------------------------


def _earned_world() -> World:
    world = World([policy(quantile=0.9)], demand=lambda t: PEAK)
    world.metrics.set_history(KEY, "request_rate", series(lambda t: PEAK, DAY0, DAY0 + 4 * DAY, noise=0.5))
    world.service.refit(JUMP)
    return world


def test_an_earned_service_holds_its_replicas_while_the_forecasts_read_fine() -> None:
    world = _earned_world()
    for i in range(8):
        plan = world.tick(JUMP + i * TICK)
    assert plan.forecasts[KEY].headroom.state is HeadroomState.EARNED
    before = world.replicas()
    for i in range(8, 16):
        world.tick(JUMP + i * TICK)
    assert world.replicas() == before


def test_a_forecast_read_failure_does_not_scale_an_earned_service_up() -> None:
    world = _earned_world()
    for i in range(8):
        world.tick(JUMP + i * TICK)
    before = world.replicas()

    def broken() -> Any:
        raise RuntimeError("forecast store unreadable")

    world.service.read_config = broken  # type: ignore[method-assign]
    for i in range(8, 16):
        world.tick(JUMP + i * TICK)
    report = world.controller.last_report
    assert report is not None and any(e.startswith("forecast_read:") for e in report.errors)
    assert world.replicas() == before, "a forecast read failure scaled an earned service up"


# ---- 3. a forward step of the wall clock skips the scale-down window (runtime.py / controller.py) -------------------


def _steady_controller(replicas: int = 8) -> tuple[Controller, SimpleCluster, FakeMetrics, Telemetry]:
    cluster = SimpleCluster(deployments={KEY: [replicas, replicas]})
    metrics = FakeMetrics(cluster)
    metrics.util[KEY] = 70.0
    chat = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)
    telemetry = Telemetry(identity="test")
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(chat)]),
        telemetry=telemetry,
    )
    return controller, cluster, metrics, telemetry


class _Clocks:
    """A wall clock and a monotonic clock the test moves; ``step`` moves the wall clock alone (NTP, a VM resumed)."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def monotonic(self) -> float:
        return self.mono

    def perf_counter(self) -> float:
        return self.mono


def test_without_a_clock_step_the_scale_down_window_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    clocks = _Clocks()
    monkeypatch.setattr("autoscaler.runtime.time", clocks)
    controller, cluster, metrics, telemetry = _steady_controller()
    runtime = Runtime(controller, telemetry, http=None, clock=lambda: clocks.wall)
    for _ in range(40):  # 10 minutes at 15 s: past the takeover grace, the window full of "8"
        runtime.tick()
        clocks.advance(15.0)
    metrics.util[KEY] = 10.0  # the load drops: the window (300 s) holds 8 for five more minutes
    for _ in range(4):
        runtime.tick()
        clocks.advance(15.0)
    assert [w for w in cluster.writes if w.op == "scale"] == []


def test_a_forward_step_of_the_wall_clock_does_not_skip_the_scale_down_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clocks = _Clocks()
    monkeypatch.setattr("autoscaler.runtime.time", clocks)
    controller, cluster, metrics, telemetry = _steady_controller()
    runtime = Runtime(controller, telemetry, http=None, clock=lambda: clocks.wall)
    for _ in range(40):
        runtime.tick()
        clocks.advance(15.0)
    metrics.util[KEY] = 10.0
    runtime.tick()
    clocks.advance(15.0)
    clocks.wall += 3600.0  # the wall clock steps an hour forward; 15 s of real time pass
    for _ in range(3):
        runtime.tick()
        clocks.advance(15.0)
    assert [w for w in cluster.writes if w.op == "scale"] == [], "a clock step bypassed the scale-down window"


# ---- 4. a scale-down whose write timed out is forgotten by the rate policy (actuator.py: forget_unapplied) ---------


class _AppliedThenTimedOut(SimpleCluster):
    """The API server commits the next scale write, but its answer never arrives (the request times out)."""

    timeouts: int = 0

    def scale_deployment(self, namespace: str, name: str, replicas: int, **guards: object) -> None:
        super().scale_deployment(namespace, name, replicas, **guards)
        if self.timeouts > 0:
            self.timeouts -= 1
            raise PortError(f"scale deployment {namespace}/{name} to {replicas}: read timed out (10s)")


def _one_pod_a_minute(cluster: SimpleCluster) -> Controller:
    gentle = ScalingRules(stabilisation_s=0.0, policies=(RatePolicy(RateKind.PODS, 1, 60.0),))
    chat = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0, scale_down=gentle)
    metrics = FakeMetrics(cluster)
    metrics.util[KEY] = 10.0  # wants 2 of its 8 replicas: the rate policy allows one pod a minute
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(chat)]),
        telemetry=Telemetry(identity="test"),
    )
    controller.acting_since = T0 - 3600
    return controller


def test_the_scale_down_rate_policy_allows_one_pod_a_minute() -> None:
    cluster = SimpleCluster(deployments={KEY: [8, 8]})
    controller = _one_pod_a_minute(cluster)
    for i in range(4):
        controller.run_once(T0 + i * TICK)
    assert [w.args for w in cluster.writes if w.op == "scale"] == [("ml", "chat", 7)]


def test_a_scale_down_whose_answer_timed_out_still_counts_against_the_rate_policy() -> None:
    cluster = _AppliedThenTimedOut(deployments={KEY: [8, 8]})
    cluster.timeouts = 1
    controller = _one_pod_a_minute(cluster)
    controller.run_once(T0)
    report = controller.last_report
    assert report is not None and [r.result for r in report.results] == ["failed"]
    assert cluster.deployments[KEY][0] == 7  # it happened all the same
    for i in range(1, 4):  # the next 45 s: one pod a minute allows no other
        controller.run_once(T0 + i * TICK)
    assert [w.args for w in cluster.writes if w.op == "scale"] == [("ml", "chat", 7)]


# ---- 5. the tick's stall bound ignores the Kubernetes timeouts (settings.py / app.py) -------------------------------


def _fake_adapters() -> Adapters:
    cluster = FakeCluster()
    return Adapters(
        metrics=FakeMetricsSource(),
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies(),
        status_writer=None,
        node_pools=None,
    )


def test_the_tick_stall_bound_outlasts_a_tick_held_on_an_unanswering_kubernetes_api() -> None:
    timeout = 60.0
    try:
        settings = Settings(kubernetes={"request_timeout_seconds": timeout}, leader_election={"enabled": False})
    except (ValidationError, SettingsError):
        return  # refused, naming the settings: fixed
    retries = inspect.signature(PolicyLoader.__init__).parameters["read_retries"].default
    policy_read_s = (1 + retries) * timeout  # every try timing out, not counting the connect retry or the backoff
    runtime = build_runtime(settings, adapters=_fake_adapters(), refit=noop_job, http=False)
    assert runtime._stall > policy_read_s, (
        f"/healthz fails after {runtime._stall:g}s, a tick held on the policy read takes {policy_read_s:g}s"
    )


# ---- 1b. the burst growth planned for a scale-up follows it (actuator.py: _for_a_scale_up) --------------------------


def _burst_plan_world() -> tuple[object, object]:
    from autoscaler.actuator import Actuator
    from autoscaler.fakes.cluster import FakeCluster

    cluster = FakeCluster()
    cluster.add_deployment("ml", "chat", 8)
    cluster.add_pool("burst", 0)
    return cluster, Actuator(cluster, cluster)


def _burst_plan() -> list[object]:
    from autoscaler.core.model import ScaleDeployment, ScaleNodePool
    from autoscaler.core.reasons import Reason

    return [
        ScaleDeployment("ml", "chat", 12, 8, Reason.METRIC_ABOVE_TARGET, "demand"),
        ScaleNodePool("burst", 1, 0, Reason.BURST_SCALE_UP, "4 replicas short", services=("ml/chat",)),
    ]


@pytest.mark.parametrize("fails", [False, True])
def test_a_burst_node_is_bought_only_for_a_scale_up_that_was_made(fails: bool) -> None:
    from autoscaler.actuator import GuardContext
    from autoscaler.ports import PortError

    cluster, actuator = _burst_plan_world()
    if fails:
        cluster.fail("scale_deployment", PortError("scale_deployment: HTTP 403 Forbidden"), times=None)  # type: ignore[attr-defined]
    results = actuator.apply(_burst_plan(), GuardContext(T0, {}))  # type: ignore[attr-defined]
    assert [r.result for r in results] == (["failed", "skipped"] if fails else ["applied", "applied"])
    assert cluster.node_count("burst") == (0 if fails else 1)  # type: ignore[attr-defined]
    if fails:
        assert "was not made" in results[1].message
