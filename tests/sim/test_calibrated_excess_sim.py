"""Issue 14: the simulator's calibrated share of the quantile's excess (kept as a sorted list as scores come and go)
equals the core's ``calibrated_excess`` over the same window, and both switches (scenario ``calibratedExcess``, the
controller's ``forecast.calibrated_excess``) reach the tick's config."""

from __future__ import annotations

import random

import numpy as np
import pytest

from autoscaler.core.headroom import calibrated_excess
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.forecasting import ForecastService
from autoscaler.settings import ForecastSettings
from autoscaler.sim.policies import SimService
from autoscaler.sim.predictive import ForecastingConfig, PredictivePolicy
from autoscaler.sim.scenario import Forecasting


def _service() -> SimService:
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=2.0, max_replicas=40)
    return SimService(policy, np.full(10, 10.0), throughput=3.0, base_latency_s=1.0, slo_s=2.0, quantile=0.95)


def test_the_sorted_window_gives_the_core_share_as_scores_come_and_expire() -> None:
    rng = random.Random(7)
    config = ForecastingConfig()
    policy = PredictivePolicy(config, metrics_delay_s=0.0)
    policy.reset([_service()], 60.0)
    state = policy.per_service[0]
    window: list[tuple[float, float, float, float]] = []  # (time, actual, median, upper)
    for minute in range(600):  # 10 hours of one score a minute, through a 6 h window
        now = 60.0 * (minute + 2)
        target = now - 60.0
        median = 10.0 + rng.random()
        upper = median + rng.choice([0.5, 2.0])
        actual = median + rng.uniform(-1.0, 0.4)
        if minute % 20 == 0:  # a zero-width band, covered by its median
            upper, actual = median, median - 0.1
        state.pending_scores.append((target, upper, upper, median))
        policy._observe(state, now, actual, 0.99)
        window.append((target, actual, median, upper))
        policy._judge(state, 0.99, now)
        kept = [(a, m, u) for t, a, m, u in window if t >= now - config.accountability_s]
        assert state.excess_share == pytest.approx(calibrated_excess(kept, 0.99, config.min_scored_samples)[0])
        assert len(state.calibration_sorted) == len(state.calibration) == len(kept)
    assert state.excess_share < 1.0  # the band over-covered: the share was used, not the default


def test_the_scenario_switch_reaches_the_tick() -> None:
    on = Forecasting.model_validate({"model": "phase_naive"}).to_config()
    off = Forecasting.model_validate({"model": "phase_naive", "calibratedExcess": False}).to_config()
    assert on.calibrated_excess and not off.calibrated_excess
    policy = PredictivePolicy(off, metrics_delay_s=0.0)
    policy.reset([_service()], 60.0)
    assert policy.tick_config.forecast.calibrated_excess is False


def test_the_controller_setting_reaches_the_tick() -> None:
    for value in (True, False):
        settings = ForecastSettings(model="last_value", workers=1, calibrated_excess=value)
        service = ForecastService(settings, FakeMetricsSource(), lambda: [], refit_interval_s=900.0)
        assert service.read_config().calibrated_excess is value


def test_a_score_without_a_baseline_counts_for_neither_the_coverage_nor_the_share() -> None:
    """The controller judges its coverage and calibrates its share on one window of scores (``_window_scores``). The
    simulator scored a forecast without a baseline forecast (NaN) into the share but not into the coverage: the share
    then read scores the coverage never judged (stop 43). Every third score here has no baseline: both must see the
    other two thirds only."""
    rng = random.Random(11)
    config = ForecastingConfig()
    policy = PredictivePolicy(config, metrics_delay_s=0.0)
    policy.reset([_service()], 60.0)
    state = policy.per_service[0]
    judged: list[tuple[float, float, float, float]] = []
    for minute in range(300):
        now = 60.0 * (minute + 2)
        target = now - 60.0
        median = 10.0 + rng.random()
        upper = median + 2.0
        # the ones without a baseline are the ones the band would miss: counted, they would raise the share to 1
        baseless = minute % 3 == 0
        actual = median + (3.0 if baseless else rng.uniform(-1.0, 0.5))
        state.pending_scores.append((target, upper, float("nan") if baseless else upper, median))
        policy._observe(state, now, actual, 0.99)
        if not baseless:
            judged.append((target, actual, median, upper))
        policy._judge(state, 0.99, now)
    kept = [(a, m, u) for t, a, m, u in judged if t >= 60.0 * 301 - config.accountability_s]
    assert state.scored == len(kept) == len(state.calibration)
    assert state.coverage == 1.0
    assert state.excess_share == pytest.approx(calibrated_excess(kept, 0.99, config.min_scored_samples)[0])
    assert state.excess_share < 1.0
