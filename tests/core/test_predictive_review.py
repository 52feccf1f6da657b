"""Review of the predictive path (issue 14): earned headroom, the forecast floor and the forecasts' accountability."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import forecast.registry
from autoscaler.core.headroom import HeadroomState, earned_headroom
from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
from autoscaler.core.predictive import ForecastInput
from autoscaler.sim.policies import CorePolicy, SimService
from autoscaler.sim.predictive import ForecastingConfig, PredictivePolicy, _ServiceForecasting
from forecast.types import Forecast

KEY = "ml/chat"


def _policy(quantile: float, window_s: float = 60.0) -> ServicePolicy:
    base = ServicePolicy(namespace="ml", name="chat", metric=MetricKind.REQUEST_RATE, target=3.2, max_replicas=40)
    return dataclasses.replace(
        base,
        forecast=ForecastPolicy(ForecastMode.ACTIVE, quantile),
        scale_down=dataclasses.replace(base.scale_down, stabilisation_s=window_s),
    )


# ---- earned headroom at its documented boundaries ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantile", "covered", "scored", "state"),
    [
        # "at most 2.5 x the misses the quantile allows means full trust": exactly 2.5 x is EARNED, whatever the
        # quantile (P90: 25 % misses; P99: 2.5 %; P95: 12.5 %), with the spec's own scale-down window
        (0.9, 75, 100, HeadroomState.EARNED),
        (0.9, 30, 40, HeadroomState.EARNED),
        (0.99, 975, 1000, HeadroomState.EARNED),
        (0.95, 875, 1000, HeadroomState.EARNED),
        (0.8, 50, 100, HeadroomState.EARNED),
        # "5 x or more means none": exactly 5 x is DEGRADED
        (0.9, 50, 100, HeadroomState.DEGRADED),
        (0.99, 95, 100, HeadroomState.DEGRADED),
        (0.95, 75, 100, HeadroomState.DEGRADED),
        (0.98, 90, 100, HeadroomState.DEGRADED),
    ],
)
def test_trust_at_exactly_the_documented_miss_ratios(
    quantile: float, covered: int, scored: int, state: HeadroomState
) -> None:
    policy = _policy(quantile)
    headroom = earned_headroom(policy, coverage=covered / scored, scored=scored, usable=True)
    assert headroom.state is state
    if state is HeadroomState.EARNED:
        assert (headroom.ratio, headroom.trust, headroom.down_window_s) == (1.0, 1.0, 0.0)
    else:
        assert (headroom.ratio, headroom.trust) == (0.75, 0.0)
        assert headroom.down_window_s == 300.0


# ---- the simulator's accountability: each forecast scored against the demand at its own target time -------------


def _forecast(value: float) -> Forecast:
    return Forecast(0.0, 60.0, {0.5: [value] * 100, 0.9: [value] * 100}, "const")


def _predictive(monkeypatch: pytest.MonkeyPatch, leads: list[float]) -> tuple[PredictivePolicy, _ServiceForecasting]:
    """A predictive policy whose tick reads its forecast at the leads given, one per ``plan`` (the lead grows by a
    node boot while free GPUs are short, and falls back when they are not)."""
    policy = PredictivePolicy(metrics_delay_s=0.0)
    policy.services = [SimpleNamespace(policy=SimpleNamespace(key=KEY))]  # type: ignore[list-item]
    state = _ServiceForecasting()
    state.latest = ForecastInput(_forecast(10.0), fitted_at=0.0)
    state.baseline_forecast = _forecast(10.0)
    policy.per_service = [state]
    policy.quantiles = [0.9]
    policy.step_s = 15.0
    policy.bucket_steps = 4
    reads = iter(leads)

    def core_plan(self: Any, step: int, now: float, observation: Any, snapshot: Any) -> Any:
        view = SimpleNamespace(floor=object(), lead_s=next(reads))
        return SimpleNamespace(forecasts={KEY: view})

    monkeypatch.setattr(CorePolicy, "plan", core_plan)
    return policy, state


@pytest.mark.parametrize(
    ("leads", "due"),
    [
        ([390.0, 90.0], [105.0]),  # the lead fell by the node boot: the second target (15 + 90) comes first
        ([390.0, 90.0, 90.0], [105.0, 120.0]),
        ([90.0, 390.0, 90.0], [90.0, 120.0]),
        ([90.0, 90.0], [90.0, 105.0]),  # in order anyway
    ],
)
def test_a_forecast_is_scored_when_its_target_arrives_even_behind_a_later_one(
    monkeypatch: pytest.MonkeyPatch, leads: list[float], due: list[float]
) -> None:
    policy, state = _predictive(monkeypatch, leads)
    for i in range(len(leads)):
        policy.plan(i, i * 15.0, None, None)  # type: ignore[arg-type]
    # the demand of each due target's step arrives (seen at the step's end, no delay here: since stop 40 a forecast
    # for T is scored against the step containing T, not the one ending at T): that forecast is scored on it, not on
    # the demand of a later time
    for target in due:
        policy._observe(state, target + policy.step_s, 12.0, 0.9)
    assert sorted(score[0] for score in state.scores) == due
    # the forecast of the later target is still waiting for its demand
    assert len(state.scores) == len(due)
    remaining = len(leads) - len(due)
    policy._observe(state, 10_000.0, 12.0, 0.9)
    assert len(state.scores) == len(due) + remaining


# ---- the simulator's predictive column runs the spec's forecast, active ---------------------------------------------


@pytest.mark.parametrize("mode", [ForecastMode.SHADOW, ForecastMode.ACTIVE])
def test_the_predictive_policy_keeps_the_specs_forecast_settings(mode: ForecastMode) -> None:
    spec = ForecastPolicy(mode, 0.95, rate_per_replica=2.5, untrusted_target_ratio=0.9)
    policy = dataclasses.replace(_policy(0.95), forecast=spec)
    service = SimService(policy, np.zeros(4), throughput=3.5, base_latency_s=2.0, slo_s=4.0, quantile=0.95,
                         forecast_quantile=0.95)
    used = PredictivePolicy().policy_for(service).forecast
    assert used == ForecastPolicy(ForecastMode.ACTIVE, 0.95, rate_per_replica=2.5, untrusted_target_ratio=0.9)


# ---- the simulator's history: each bucket stamped with the time its demand happened ----------------------------------


class _Recorder:
    """A forecaster that records the series it is fitted on (and forecasts its last value)."""

    levels_independent = False
    fitted: ClassVar[list[tuple[np.ndarray, float, float]]] = []

    def __init__(self, **params: Any) -> None:
        self.levels = tuple(params.get("quantiles", (0.5, 0.9)))

    def fit(self, y: np.ndarray, *, start: float, step_s: float) -> _Recorder:
        self.y, self.start, self.step_s = np.array(y), start, step_s
        _Recorder.fitted.append((self.y, start, step_s))
        return self

    def update(self, y: np.ndarray, *, start: float, step_s: float | None = None) -> _Recorder:
        return self.fit(y, start=start, step_s=self.step_s if step_s is None else step_s)

    def predict(self, steps: int) -> Forecast:
        end = self.start + self.y.size * self.step_s
        return Forecast(end, self.step_s, {q: [float(self.y[-1])] * steps for q in self.levels}, "recorder")


@pytest.mark.parametrize(("step_s", "resolution_s"), [(15.0, 60.0), (25.0, 60.0), (45.0, 60.0), (20.0, 50.0)])
def test_the_history_is_stamped_with_the_time_of_its_demand_whatever_the_step(
    monkeypatch: pytest.MonkeyPatch, step_s: float, resolution_s: float
) -> None:
    monkeypatch.setattr(forecast.registry, "make_model", lambda name, **params: _Recorder(**params))
    monkeypatch.setattr(_Recorder, "fitted", [])
    config = ForecastingConfig(model="recorder", resolution_s=resolution_s, min_history_s=600.0, horizon_s=600.0)
    policy = PredictivePolicy(config)
    policy.step_s = step_s
    policy.bucket_steps = max(1, round(resolution_s / step_s))
    policy.quantiles = [0.9]
    state = _ServiceForecasting()
    # the demand is a ramp: rate(t) = t; the observation at ``now`` is the mean rate over the step before it
    now = 0.0
    for _ in range(200):
        now += step_s
        policy._observe(state, now, now - step_s / 2, 0.9)
        policy._refit_step(0, state, now)
    assert _Recorder.fitted, "no fit was made"
    y, start, bucket_s = _Recorder.fitted[-1]
    # bucket i covers [start + i * step, start + (i + 1) * step): its mean demand is the ramp at the middle
    middles = start + (np.arange(y.size) + 0.5) * bucket_s
    np.testing.assert_allclose(y, middles, atol=1e-6)


@pytest.mark.parametrize(("gap_from", "gap_ticks", "missing"), [(40, 8, 2), (41, 8, 1), (40, 3, 0), (100, 0, 0)])
def test_a_metrics_gap_leaves_a_gap_in_the_history_not_a_shift(
    monkeypatch: pytest.MonkeyPatch, gap_from: int, gap_ticks: int, missing: int
) -> None:
    """A tick without a request rate is a gap the forecaster fills; skipped, the demand before it would be stamped
    later than it happened by the gap's length (and a phase model would learn the wrong phase)."""
    monkeypatch.setattr(forecast.registry, "make_model", lambda name, **params: _Recorder(**params))
    monkeypatch.setattr(_Recorder, "fitted", [])
    config = ForecastingConfig(model="recorder", resolution_s=60.0, min_history_s=600.0, horizon_s=600.0)
    policy = PredictivePolicy(config)
    policy.step_s, policy.bucket_steps, policy.quantiles = 15.0, 4, [0.9]
    state = _ServiceForecasting()
    now = 0.0
    for tick in range(200):
        now += 15.0
        gap = gap_from <= tick < gap_from + gap_ticks
        policy._observe(state, now, None if gap else now - 7.5, 0.9)
    policy._refit_step(0, state, now)
    y, start, bucket_s = _Recorder.fitted[-1]
    assert int(np.isnan(y).sum()) == missing
    middles = start + (np.arange(y.size) + 0.5) * bucket_s
    seen = np.isfinite(y)
    # a bucket part-observed is the mean of what was seen: the ramp at the middle of the seen ticks, within a bucket
    np.testing.assert_allclose(y[seen], middles[seen], atol=bucket_s / 2)
    assert y.size * bucket_s == pytest.approx(now - start)
