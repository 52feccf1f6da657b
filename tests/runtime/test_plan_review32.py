"""Review 32 of ``autoscaler plan``: each test reproduces a defect found in the review (it failed before the fix).

The command runs in-process with the adapters replaced by in-memory fakes (``app.build_adapters`` patched), so what
is checked is the command itself: what it reads, what it prints and its exit code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from runtime_fakes import FakePolicies, policy_object

from autoscaler import app
from autoscaler.app import Adapters
from autoscaler.cli import main
from autoscaler.controller import Controller
from autoscaler.core.cluster import NodeInfo
from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import PortError, Series

STEP = 60.0
DAY = 86_400.0
DAY0 = 20_833 * DAY  # midnight UTC
JUMP = DAY0 + 2 * DAY + 9 * 3600  # 09:00 on the third day: demand steps up, as it did the two days before


def office_hours(t: float) -> float:
    """10 req/s, 25 req/s from 09:00 to 17:00 every day (a daily model sees the 09:00 step coming)."""
    return 25.0 if 9 * 3600 <= (t - DAY0) % DAY < 17 * 3600 else 10.0


def history(start: float, end: float) -> Series:
    times = np.arange(start, end + STEP / 2, STEP)
    return Series(tuple(float(t) for t in times), tuple(office_hours(float(t) - STEP) for t in times))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("AUTOSCALER_"):
            monkeypatch.delenv(key)
    yield


def _chat(mode: ForecastMode | None) -> ServicePolicy:
    return ServicePolicy(
        "ml",
        "chat",
        min_replicas=1,
        max_replicas=40,
        metric=MetricKind.REQUEST_RATE,
        target=5.0,
        cold_start_s=90.0,
        forecast=ForecastPolicy(mode, 0.9, None) if mode is not None else None,
    )


def _world(monkeypatch: pytest.MonkeyPatch, now: float, mode: ForecastMode | None) -> FakeCluster:
    """One request-rate service (5 req/s per replica) at 2 replicas seeing 10 req/s, with three days of an office-
    hours history in Prometheus; the plan's adapters are these fakes."""
    cluster = FakeCluster()
    cluster.add_node(NodeInfo("gpu-0", 64, "A100", None, True))
    cluster.add_deployment("ml", "chat", 2)
    metrics = FakeMetricsSource()
    metrics.set_history("ml/chat", "request_rate", history(DAY0, DAY0 + 4 * DAY))
    rate = office_hours(now)
    metrics.set_service("ml/chat", spec_replicas=2, ready_replicas=2, metric_total=rate, request_rate=rate)
    policies = FakePolicies([policy_object(_chat(mode))])

    def fake_build(settings: object, *, check_prometheus: bool = True) -> Adapters:
        return Adapters(metrics, cluster, cluster, policies, None, None)

    monkeypatch.setattr(app, "build_adapters", fake_build)
    monkeypatch.setenv("AUTOSCALER_FORECAST__MODEL", "seasonal_naive")
    monkeypatch.setenv("AUTOSCALER_FORECAST__HISTORY_SECONDS", str(3 * DAY))
    monkeypatch.setenv("AUTOSCALER_FORECAST__WORKERS", "1")
    monkeypatch.setenv("AUTOSCALER_FORECAST__NODE_BOOT_SECONDS", "0")
    return cluster


def _plan_json(capsys: pytest.CaptureFixture[str], now: float) -> tuple[int, dict[str, object]]:
    code = main(["plan", "-o", "json", "--time", f"{now:.0f}"])
    return code, json.loads(capsys.readouterr().out)


def test_plan_decides_an_active_forecasting_service_with_its_forecast(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: ``plan`` built its Controller without the forecasts (``forecasts=None``), so an active forecasting
    service was decided reactively: one minute before the daily 09:00 step the controller (with its fit) scales to 5
    replicas on ``forecast_floor``, while the plan said 3 on ``metric_above_target``; and the earned headroom that the
    README says ``plan`` prints was never there (``headroom: null``)."""
    now = JUMP - 60
    _world(monkeypatch, now, ForecastMode.ACTIVE)
    code, doc = _plan_json(capsys, now)
    assert code == 0
    decision = doc["decisions"][0]  # type: ignore[index]
    assert decision["reason"] == "forecast_floor", decision
    assert decision["desiredReplicas"] == 5, decision
    headroom = decision["headroom"]
    assert headroom is not None and headroom["state"] == "earned", headroom
    assert headroom["coverage"] is not None
    assert doc["actions"] == [
        {
            "kind": "ScaleDeployment",
            "target": "deployment/ml/chat",
            "change": "scale deployment/ml/chat from 2 to 5",
            "reason": "forecast_floor",
            "reasonText": decision["reasonText"],
            "detail": decision["detail"],
            "wouldApply": True,
            "heldBack": None,
        }
    ]


def test_plan_table_prints_the_earned_headroom(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = JUMP - 60
    _world(monkeypatch, now, ForecastMode.ACTIVE)
    assert main(["plan", "--time", f"{now:.0f}"]) == 0
    out = capsys.readouterr().out
    assert "Earned headroom" in out and "ml/chat: earned, target x 1" in out, out
    assert "forecast_floor" in out


def test_plan_of_a_shadow_forecast_shows_it_but_scales_reactively(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shadow forecast never changes the decision (as in the controller); the plan still reads it."""
    now = JUMP - 60
    _world(monkeypatch, now, ForecastMode.SHADOW)
    code, doc = _plan_json(capsys, now)
    assert code == 0
    decision = doc["decisions"][0]  # type: ignore[index]
    assert decision["reason"] != "forecast_floor" and decision["desiredReplicas"] == 2, decision


def test_plan_without_forecasting_policies_reads_no_history(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fix fits forecasts only for policies that forecast: a plan of reactive policies reads the cluster and the
    metrics once, as before."""
    now = JUMP - 60
    cluster = _world(monkeypatch, now, None)
    reads: list[float] = []
    snapshot = cluster.snapshot

    def counted(at: float) -> object:
        reads.append(at)
        return snapshot(at)

    monkeypatch.setattr(cluster, "snapshot", counted)
    code, doc = _plan_json(capsys, now)
    assert code == 0 and len(reads) == 1
    assert doc["decisions"][0]["headroom"] is None  # type: ignore[index]


def test_plan_exits_1_when_the_rebalance_pass_cannot_read_the_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: the README's exit codes are 0 = fresh reads, 1 = a read failed and it would hold. With
    ``rebalance.enabled``, a cluster read that failed for the rebalance pass held the pass (``held: cluster_read:
    ...`` in the Rebalance section) but ``plan`` still exited 0."""
    now = JUMP - 60
    cluster = _world(monkeypatch, now, None)
    monkeypatch.setenv("AUTOSCALER_REBALANCE__ENABLED", "true")
    original: Callable[[Controller, float], object] = Controller.rebalance

    def failing_rebalance(self: Controller, at: float) -> object:
        def broken(_: float) -> object:
            raise PortError("apiserver: connection refused")

        monkeypatch.setattr(cluster, "snapshot", broken)
        return original(self, at)

    monkeypatch.setattr(Controller, "rebalance", failing_rebalance)
    assert main(["plan", "--time", f"{now:.0f}"]) == 1
    out = capsys.readouterr().out
    assert "held: cluster_read: PortError: apiserver: connection refused" in out


def test_plan_exits_0_with_the_rebalancer_on_and_every_read_fresh(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = JUMP - 60
    _world(monkeypatch, now, None)
    monkeypatch.setenv("AUTOSCALER_REBALANCE__ENABLED", "true")
    code, doc = _plan_json(capsys, now)
    assert code == 0
    assert doc["rebalance"] is not None and doc["rebalance"]["result"] == "ok"  # type: ignore[index]
