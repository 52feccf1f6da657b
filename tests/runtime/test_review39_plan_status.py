"""Review 39 of ``autoscaler plan``, the GPUScalingPolicy status the controller writes and its Warning Events.

Defects (each was an ``xfail(strict=True)`` test below, failing on the code as it was; all four fixed in the same stop,
their tests say "Fixed"):

1. ``status.lastForecast.headroom*`` goes stale when the service's published fit is withheld (its
   ``spec.queries.requestRate`` was edited: the fit forecast another series). The tick then decides at the
   untrusted share of the target (0.75, a scale-up by a third), the gauge and ``plan`` say ``untrusted``, but the
   status -- rewritten for the new generation -- keeps ``headroomState: earned``, ``headroomRatio: 1.0``
   (``reporting.forecast_record`` returns None without a published fit, and ``lastForecast`` is never cleared).
2. An active forecasting service without a fit (a new policy, or a controller before its first refit) gets no
   headroom state in its status at all, though README says the state, ratio and reason are in
   ``status.lastForecast.headroom*`` (the same root cause as 1).
3. Status write churn: a service whose stale reason carries a changing detail (the Prometheus adapter's
   ``last sample 95s old (> staleness_seconds 60)``) gets its status rewritten at every tick (a new resourceVersion
   each time), although nothing about the condition changed; the Warning Event of the same episode is (rightly) sent
   once "whatever its changing detail says".
4. A failed status write loses the ``lastAction`` (and ``lastScaleTime``) of the scale the tick applied: the next
   tick writes only its own update, which has no action, so the status never says the controller scaled.

Passing tests pin behaviour checked in this review that no other test pins: ``plan`` agrees with an acting
controller (``run --once``) on the same inputs, and writes no status even when a status writer exists; the
controller's status over the REST-faithful fake API server (no PUT in steady state, observedGeneration from the
generation decided on with the Ready transition time kept, an invalid edit named by field in the condition and in one
Warning Event, the spec never touched); a recommend-only service's status and Events claim no action.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object
from test_forecasting import JUMP, TICK, World

from autoscaler import app
from autoscaler.app import Adapters, KubePolicySource
from autoscaler.cli import main
from autoscaler.controller import Controller
from autoscaler.core.cluster import HpaInfo, NodeInfo
from autoscaler.core.model import MetricKind, Mode, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster as SharedCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
KEY = "ml/chat"
IDENT = ("ml", "chat-policy")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("AUTOSCALER_"):
            monkeypatch.delenv(key)
    yield


def make(
    replicas: int = 2, util: float = 70.0, mode: Mode = Mode.ACTIVE
) -> tuple[Controller, FakeCluster, FakeMetrics, FakeStatus]:
    cluster = FakeCluster(deployments={KEY: [replicas, replicas]})
    metrics = FakeMetrics(cluster)
    metrics.util[KEY] = util
    policy = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0, mode=mode)
    status = FakeStatus()
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(policy)]),
        status_writer=status,
        telemetry=Telemetry(identity="test"),
    )
    return controller, cluster, metrics, status


class QueryAwareMetrics(FakeMetricsSource):
    """Says what a service's history is a series of (``history_query``, as the Prometheus adapter does): its
    ``spec.queries.requestRate`` override, else the default query."""

    def history_query(self, policy: ServicePolicy, signal: str) -> str:
        override = self.service_queries.get(policy.key)
        return str(override["requestRate"]) if override else "default request-rate query"


def forecasting_world() -> World:
    world = World()
    metrics = QueryAwareMetrics()
    metrics._history = world.metrics._history
    world.metrics = metrics
    world.service.metrics = metrics
    world.controller.metrics = metrics
    return world


# ---- defect 1: lastForecast.headroom* stale once the fit is withheld -------------------------------------------------


def test_status_headroom_follows_the_decision_when_the_fit_is_withheld() -> None:
    """Fixed (was a strict xfail).

    WRONG: the policy's ``spec.queries.requestRate`` is edited (generation 2): the refit job's fit was of the old
    series, so ``published`` withholds it and the tick decides the service as one without a forecast -- ``untrusted``,
    target x 0.75, scaling 2 -> 3 on ``metric_above_target``; the gauge says 0.75. The status is rewritten for
    generation 2 (observedGeneration 2) but ``lastForecast`` still says ``headroomState: earned``,
    ``headroomRatio: 1.0``, ``reason: forecast_floor``, ``replicas: 2``: it describes the previous spec's forecast as if
    it were the one in force. RIGHT: the status says what the tick ran at (``untrusted``, 0.75, with why), or at least
    drops the withheld fit's record."""
    world = forecasting_world()
    world.service.refit(JUMP - 1200)
    world.tick(JUMP - 1200)
    before = world.status.status[IDENT]["lastForecast"]
    assert (before["headroomState"], before["headroomRatio"]) == ("earned", 1.0)

    edited = dataclasses.replace(
        world.controller.policies.objects[0],  # type: ignore[attr-defined]
        queries={"requestRate": 'sum(rate(gateway_requests_total{namespace="ml"}[2m]))'},
        generation=2,
    )
    world.controller.policies.objects = [edited]  # type: ignore[attr-defined]
    plan = world.tick(JUMP - 1200 + TICK)
    report = world.controller.last_report
    assert report is not None
    view = report.forecasts[KEY]
    assert view.published is None and view.headroom is not None
    assert (view.headroom.state.value, view.headroom.ratio) == ("untrusted", 0.75)
    assert plan.decisions[0].desired_replicas == 3  # the tick ran at 0.75 of the target
    assert world.sample("gpu_autoscaler_headroom_target_ratio", namespace="ml", service="chat") == 0.75
    status = world.status.status[IDENT]
    assert status["observedGeneration"] == 2
    last = status.get("lastForecast") or {}
    assert last.get("headroomState") != "earned" and last.get("headroomRatio") != 1.0, last


# ---- defect 2: no headroom state in the status of a service without a fit -------------------------------------------


def test_status_shows_the_headroom_state_of_an_active_service_without_a_fit() -> None:
    """Fixed (was a strict xfail).

    WRONG: an active forecasting service before its first refit is held (``untrusted``, "held until the first
    refit") -- ``autoscaler plan`` prints that state and ``gpu_autoscaler_headroom_state{state="untrusted"}`` is 1 --
    but its status has no ``lastForecast`` at all, so ``kubectl get gsp -o yaml`` cannot tell why it holds. README:
    "The state, ratio and reason are in autoscaler plan, status.lastForecast.headroom*, ...". RIGHT: the status carries
    ``headroomState: untrusted`` and its message (``lastForecast.time`` etc. optional while there is no fit)."""
    world = forecasting_world()
    world.tick(JUMP - 1200)
    report = world.controller.last_report
    assert report is not None
    headroom = report.forecasts[KEY].headroom
    assert headroom is not None and headroom.state.value == "untrusted"
    assert world.sample("gpu_autoscaler_headroom_state", namespace="ml", service="chat", state="untrusted") == 1
    status = world.status.status[IDENT]
    assert (status.get("lastForecast") or {}).get("headroomState") == "untrusted", status


# ---- defect 3: status rewritten at every tick while a stale reason's age moves --------------------------------------


def stale_reason(age: float) -> str:
    """The Prometheus adapter's reason for a service whose every pod's DCGM sample is too old
    (``_read_copies`` then ``_pod_metrics``), at ``age`` seconds."""
    return (
        "DCGM_FI_DEV_GPU_UTIL: 2 of 2 ready pods without a valid sample: chat-0 (node-1 GPU 0: last sample "
        f"{age:.0f}s old (> staleness_seconds 60)), chat-1 (node-1 GPU 1: last sample {age:.0f}s old "
        "(> staleness_seconds 60))"
    )


def test_a_stale_episode_does_not_rewrite_the_status_every_tick() -> None:
    """Fixed (was a strict xfail).

    WRONG: during one stale episode (the same cause: DCGM samples too old) the reason's age grows by 15 s per tick,
    the MetricsStale message with it, and the reporter writes the status at every tick: 8 writes, 8 resourceVersions
    for watchers (GitOps diffs, ``kubectl get -w``), while status, reason and lastTransitionTime of every condition stay
    as they were. The Warning Event of the episode is sent once, "whatever its changing detail says". RIGHT: the
    status changes once when the episode starts (a message without the moving numbers, or rewritten only when the
    condition's status/reason changes)."""
    c, _, metrics, status = make()
    c.acting_since = T0 - 3600
    for i in range(8):
        metrics.stale[KEY] = (stale_reason(95 + 15 * i),)
        c.run_once(T0 + 15 * i)
    conditions = {x["type"]: x for x in status.status[IDENT]["conditions"]}
    assert conditions["MetricsStale"]["status"] == "True"
    assert conditions["MetricsStale"]["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    warnings = [e for e in c.writer.events if e["reason"] == "MetricsStale"]  # type: ignore[attr-defined]
    assert len(warnings) == 1  # the Event of the episode: once
    assert status.writes == 1, f"{status.writes} status writes in one unchanged stale episode"


def test_a_stale_episode_with_a_steady_reason_is_written_once() -> None:
    """The pin beside defect 3: a reason without a moving detail is written once, and its end once more; the Ready
    condition's transition time never moves."""
    c, _, metrics, status = make()
    c.acting_since = T0 - 3600
    c.run_once(T0)
    ready_since = {x["type"]: x for x in status.status[IDENT]["conditions"]}["Ready"]["lastTransitionTime"]
    metrics.stale[KEY] = ("empty result",)
    for i in range(1, 6):
        c.run_once(T0 + 15 * i)
    assert status.writes == 2
    del metrics.stale[KEY]
    c.run_once(T0 + 120)
    assert status.writes == 3
    conditions = {x["type"]: x for x in status.status[IDENT]["conditions"]}
    assert conditions["MetricsStale"]["status"] == "False"
    assert conditions["MetricsStale"]["lastTransitionTime"] == "2027-01-15T08:02:00Z"
    assert conditions["Ready"]["lastTransitionTime"] == ready_since


# ---- defect 4: the lastAction of a scale is lost with a failed status write -----------------------------------------


def test_a_failed_status_write_does_not_lose_the_last_action() -> None:
    """Fixed (was a strict xfail).

    WRONG: the tick scales chat 2 -> 4 (applied, Event sent) and its status write fails (a 500, a timeout); the next
    tick, steady at 4, writes its own status: currentReplicas 4 but no ``lastAction`` and no ``lastScaleTime`` -- the
    status never says that the controller scaled the Deployment, nor why. RIGHT: an applied action not yet written is
    kept for the next status write (``lastAction`` 2 -> 4, ``metric_above_target``, ``lastScaleTime`` of the scale)."""
    c, cluster, metrics, status = make(replicas=2, util=140.0)
    status.fail = True
    c.run_once(T0)
    assert cluster.deployments[KEY] == [4, 4]
    status.fail = False
    metrics.util[KEY] = 70.0
    c.run_once(T0 + 15)
    written = status.status[IDENT]
    assert written["currentReplicas"] == 4
    assert "lastAction" in written, written
    assert (written["lastAction"]["fromReplicas"], written["lastAction"]["toReplicas"]) == (2, 4)
    assert written["lastScaleTime"] == "2027-01-15T08:00:00Z"


# ---- pins: recommend-only status and Events claim no action ----------------------------------------------------------


def test_a_service_yielding_to_an_hpa_claims_no_action_in_status_or_events() -> None:
    """An HPA scales the Deployment: recommend-only. Its status has the recommendation as desiredReplicas but no
    lastAction/lastScaleTime, and the only Event is the conflict's Warning, once."""
    c, cluster, _, status = make(replicas=2, util=140.0)
    cluster.hpas = [HpaInfo("ml", "chat-hpa", "Deployment", "chat", 1, 10, 2, 2)]
    for i in range(3):
        c.run_once(T0 + 15 * i)
    assert cluster.writes == []
    written = status.status[IDENT]
    assert written["desiredReplicas"] == 4 and "lastAction" not in written and "lastScaleTime" not in written
    ready = {x["type"]: x for x in written["conditions"]}["Ready"]
    assert ready["status"] == "True" and ready["reason"] == "RecommendOnly"
    assert [(e["reason"], e["type"]) for e in cluster.events] == [("HpaConflict", "Warning")]


# ---- pins: plan against an acting controller ---------------------------------------------------------------------


def _world(monkeypatch: pytest.MonkeyPatch, status: FakeStatus | None = None) -> tuple[SharedCluster, FakePolicies]:
    """A request-rate service at 2 replicas seeing 23 req/s at 5 req/s per replica: 5 replicas wanted."""
    cluster = SharedCluster()
    cluster.add_node(NodeInfo("gpu-0", 64, "A100", None, True))
    cluster.add_deployment("ml", "chat", 2)
    metrics = FakeMetricsSource()
    metrics.set_service(KEY, spec_replicas=2, ready_replicas=2, metric_total=23.0, request_rate=23.0)
    policy = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=5.0)
    policies = FakePolicies([policy_object(policy)])

    def fake_build(settings: object, *, check_prometheus: bool = True) -> Adapters:
        return Adapters(metrics, cluster, cluster, policies, status, None)

    monkeypatch.setattr(app, "build_adapters", fake_build)
    return cluster, policies


def test_plan_agrees_with_an_acting_controller_and_writes_no_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = FakeStatus()
    cluster, _ = _world(monkeypatch, status)
    assert main(["plan", "-o", "json", "--time", f"{T0:.0f}"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert status.writes == 0 and status.status == {}  # a status writer at hand: still nothing written
    assert cluster.deployments[KEY].spec_replicas == 2

    # the same inputs through the controller ``run --once`` builds (acting, not a dry run)
    adapters = app.build_adapters(None)  # type: ignore[arg-type]
    acting = Controller(
        metrics=adapters.metrics,
        cluster=adapters.cluster,
        writer=adapters.writer,
        policies=adapters.policies,
        status_writer=status,
        telemetry=Telemetry(),
    )
    plan = acting.run_once(T0)
    decision = doc["decisions"][0]
    assert (
        (decision["currentReplicas"], decision["desiredReplicas"], decision["reason"])
        == (
            plan.decisions[0].current_replicas,
            plan.decisions[0].desired_replicas,
            plan.decisions[0].reason.value,
        )
        == (2, 5, "metric_above_target")
    )
    assert [a["change"] for a in doc["actions"]] == ["scale deployment/ml/chat from 2 to 5"]
    assert [a["wouldApply"] for a in doc["actions"]] == [True]
    assert cluster.deployments[KEY].spec_replicas == 5  # what the plan said is what the controller did
    assert status.status[IDENT]["desiredReplicas"] == 5


# ---- pins: the controller's status over the REST-faithful fake API server --------------------------------------------


API = "gpuautoscaler.dev/v1alpha1"
KIND = "GPUScalingPolicy"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    from autoscaler.adapters.kubernetes.config import load_api_client
    from tests.kube.fake_apiserver import FakeApiServer

    server = FakeApiServer().start()
    api = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield server, api
    finally:
        api.close()
        server.stop()


def test_the_controllers_status_over_the_api_server(kube: tuple[Any, Any]) -> None:
    """Steady ticks PUT nothing; a spec edit (generation 2) is written with observedGeneration 2 and the Ready
    condition's transition time kept; an invalid edit gets InvalidSpec naming the field and one Warning Event; the
    status writes never touch the spec."""
    from autoscaler.adapters.kubernetes import KubeClusterWriter, PolicyLoader, WriterConfig
    from tests.kube import objects as o

    server, api = kube
    server.seed(o.policy_crd(), o.gpu_policy("chat", "ml", minReplicas=1, maxReplicas=20))
    cluster = FakeCluster(deployments={KEY: [2, 2]})
    metrics = FakeMetrics(cluster)
    metrics.util[KEY] = 70.0
    kube_writer = KubeClusterWriter(api, WriterConfig(reporting_instance="t"), clock=lambda: T0, sleep=lambda s: None)
    c = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=kube_writer,
        policies=KubePolicySource(PolicyLoader(api)),
        status_writer=kube_writer,
        telemetry=Telemetry(),
    )
    c.acting_since = T0 - 3600

    def stored() -> dict[str, Any]:
        obj = server.get(API, KIND, "chat", "ml")
        assert obj is not None
        return obj

    def puts() -> int:
        return server.request_count("PUT", r"/gpuscalingpolicies/chat/status$")

    c.run_once(T0)
    first = stored()
    assert first["status"]["observedGeneration"] == 1 and puts() == 1
    ready_since = {x["type"]: x for x in first["status"]["conditions"]}["Ready"]["lastTransitionTime"]
    for i in range(1, 4):
        c.run_once(T0 + 15 * i)
    assert puts() == 1 and stored()["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    edited = stored()
    edited["spec"]["maxReplicas"] = 30
    edited["metadata"]["generation"] = 2
    server.update_object(edited)
    c.run_once(T0 + 60)
    now = stored()
    assert now["status"]["observedGeneration"] == 2 and now["spec"]["maxReplicas"] == 30
    conditions = {x["type"]: x for x in now["status"]["conditions"]}
    assert conditions["Ready"]["observedGeneration"] == 2
    assert conditions["Ready"]["lastTransitionTime"] == ready_since

    broken = stored()
    broken["spec"]["maxReplicas"] = 0
    broken["metadata"]["generation"] = 3
    server.update_object(broken)
    for i in range(3):
        c.run_once(T0 + 120 + 15 * i)
    now = stored()
    assert now["spec"]["maxReplicas"] == 0 and now["spec"]["minReplicas"] == 1  # the spec as the user left it
    conditions = {x["type"]: x for x in now["status"]["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "True" and conditions["InvalidSpec"]["observedGeneration"] == 3
    assert conditions["InvalidSpec"]["message"].startswith("spec.maxReplicas: ")
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "InvalidSpec"
    events = [
        e
        for e in server.objects("events.k8s.io/v1", "Event")
        if e["regarding"]["name"] == "chat" and e["reason"] == "InvalidSpec"
    ]
    assert len(events) == 1 and events[0]["type"] == "Warning" and "spec.maxReplicas" in events[0]["note"]
    assert cluster.writes == []
