"""Issue 14: a minute without demand is covered by every forecast, so it says nothing of how well the provisioned
quantile covers the demand (``core.headroom.judges_coverage``). The controller (live scores and the bootstrap
backtest) and the simulator judge the coverage and the calibrated share of the excess on the minutes with demand
only; the idle minutes still count for the reliability verdict."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from autoscaler.core.headroom import calibrated_excess, judges_coverage
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.forecasting import ForecastService, _backtest_coverage, _backtest_share, _Score, _ServiceState
from autoscaler.settings import ForecastSettings
from autoscaler.sim.policies import SimService
from autoscaler.sim.predictive import ForecastingConfig, PredictivePolicy

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("actual", "judges"),
    [(0.0, False), (-0.0, False), (1e-9, True), (0.5, True), (40.0, True)],
)
def test_only_demand_above_zero_judges_a_coverage(actual: float, judges: bool) -> None:
    assert judges_coverage(actual) is judges


def _service() -> ForecastService:
    settings = ForecastSettings(model="last_value", workers=1, min_history_seconds=0, bootstrap_origins=0)
    return ForecastService(settings, FakeMetricsSource(), lambda: [], refit_interval_s=900.0)


def _busy_and_idle(busy: int, missed: int, idle: int) -> _ServiceState:
    """``busy`` minutes with demand, ``missed`` of them above the P99 (20), and ``idle`` minutes of none; one a
    minute, newest first, all inside the accountability window."""
    state = _ServiceState(quantile=0.99)
    for i in range(busy):
        actual = 25.0 if i < missed else 14.0
        state.scores.append(_Score(NOW - i * 60.0, actual, 20.0, 10.0, 20.0))
    for i in range(idle):
        state.scores.append(_Score(NOW - (busy + i) * 60.0, 0.0, 0.5, 0.2, 0.5))
    return state


def test_the_live_coverage_leaves_the_idle_minutes_out() -> None:
    service = _service()
    # 3 misses in 120 busy minutes (2.5 %, 2.5 x a P99's allowance), and 180 idle minutes (a night)
    state = _busy_and_idle(busy=120, missed=3, idle=180)
    *_, scored, coverage = service._judge(state, 0.99, "last_value", NOW)
    assert scored == 300  # the verdict is judged on every score
    assert coverage is not None
    assert coverage[0] == pytest.approx(117 / 120)  # not 297 / 300: the night halved the misses
    assert coverage[1] == 120


def test_a_window_of_idle_minutes_only_judges_no_coverage() -> None:
    service = _service()
    state = _busy_and_idle(busy=0, missed=0, idle=200)
    *_, scored, coverage = service._judge(state, 0.99, "last_value", NOW)
    assert scored == 200 and coverage is None


def test_the_calibrated_share_leaves_the_idle_minutes_out() -> None:
    service = _service()
    # 100 busy minutes needing 0, 1, ..., 99 % of the excess over the median, and 300 idle ones that needed none
    state = _ServiceState(quantile=0.99)
    state.scores.extend(_Score(NOW - i * 60.0, 10.0 + 0.1 * i, 20.0, 10.0, 20.0) for i in range(100))
    state.scores.extend(_Score(NOW - (100 + i) * 60.0, 0.0, 0.5, 0.2, 0.5) for i in range(300))
    assert service._excess_share(state, 0.99, NOW) == pytest.approx(0.99)  # the 100th of 100 (ceil(101 x 0.99))
    # counted, the idle minutes rank below every busy one and the share fell to the 97th busy minute's
    every = [(sc.actual, sc.model_median, sc.model_q) for sc in state.scores]
    assert calibrated_excess(every, 0.99, 30)[0] == pytest.approx(0.96)
    # with fewer busy minutes than a P99 needs the share is the quantile's own
    few = _busy_and_idle(busy=99, missed=0, idle=300)
    assert service._excess_share(few, 0.99, NOW) == 1.0


def test_the_backtest_speaks_until_enough_busy_minutes_are_scored() -> None:
    """A restarted controller's backtest coverage speaks until the live scores can judge the quantile: idle minutes
    do not make them enough."""
    service = _service()
    state = _busy_and_idle(busy=60, missed=0, idle=200)
    state.verdict, state.verdict_coverage, state.verdict_samples = (True, "ok", 0.5), 0.95, 150
    state.verdict_at = NOW - 600.0
    *_, coverage = service._judge(state, 0.99, "last_value", NOW)
    assert coverage == (0.95, 150)
    enough = _busy_and_idle(busy=100, missed=0, idle=200)
    enough.verdict, enough.verdict_coverage, enough.verdict_samples = (True, "ok", 0.5), 0.95, 150
    enough.verdict_at = NOW - 600.0
    *_, coverage = service._judge(enough, 0.99, "last_value", NOW)
    assert coverage == (1.0, 100)


def _backtest(actuals: np.ndarray, medians: np.ndarray, uppers: np.ndarray) -> SimpleNamespace:
    origins = np.arange(actuals.shape[0]) * actuals.shape[1]  # no overlap: every value distinct
    return SimpleNamespace(levels=(0.5, 0.99), origins=origins, actuals=actuals,
                           predictions=np.stack([medians, uppers]))  # fmt: skip


def test_the_backtest_coverage_and_share_leave_the_idle_minutes_out() -> None:
    rng = np.random.default_rng(5)
    actuals = rng.normal(10.0, 1.0, size=(30, 10))
    actuals[:, 5:] = 0.0  # half of every horizon idle
    actuals[0, 0] = 30.0  # one miss among the 150 busy values
    actuals[1, 7] = np.nan  # a missing value: no evidence either way
    medians = np.full((30, 10), 10.0)
    uppers = np.full((30, 10), 14.0)
    result = _backtest(actuals, medians, uppers)
    coverage, samples = _backtest_coverage(result, 0.99)
    assert samples == 150
    assert coverage == pytest.approx(149 / 150)
    busy = actuals[:, :5].ravel()
    share = _backtest_share(result, 0.99, samples, 30)
    triples = [(a, 10.0, 14.0) for a in busy]
    assert share == pytest.approx(calibrated_excess(triples, 0.99, 30)[0])
    idle = _backtest(np.zeros((30, 10)), medians, uppers)
    assert _backtest_coverage(idle, 0.99) == (None, 0)


def test_overlapping_backtest_horizons_count_a_busy_minute_once() -> None:
    actuals = np.array([[5.0, 0.0, 6.0], [6.0, 7.0, 0.0]])  # origin 1's first value is origin 0's third
    result = SimpleNamespace(levels=(0.5, 0.99), origins=np.array([0, 2]), actuals=actuals,
                             predictions=np.stack([np.full((2, 3), 5.0), np.full((2, 3), 6.5)]))  # fmt: skip
    coverage, samples = _backtest_coverage(result, 0.99)
    assert samples == 3  # steps 0, 2 and 3 (step 2 scored twice, steps 1 and 4 idle)
    assert coverage == pytest.approx(3 / 4)  # the share is over the scored pairs, as the quality's is


def test_the_simulator_judges_as_the_controller_does() -> None:
    """The same scores through the simulator's running sums and the controller's window give the same coverage, the
    same values behind it, and the same calibrated share; the verdict's count keeps the idle minutes."""
    sim_service = SimService(
        ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=2.0, max_replicas=40),
        np.full(10, 10.0), throughput=3.0, base_latency_s=1.0, slo_s=2.0, quantile=0.95,
    )  # fmt: skip
    config = ForecastingConfig()
    policy = PredictivePolicy(config, metrics_delay_s=0.0)
    policy.reset([sim_service], 60.0)
    sim_state = policy.per_service[0]
    controller = _service()
    ctl_state = _ServiceState(quantile=0.99)
    rng = np.random.default_rng(11)
    for minute in range(400):
        now = 60.0 * (minute + 2)
        target = now - 60.0
        median, upper = 10.0, 14.0
        actual = 0.0 if (minute // 50) % 2 else float(rng.normal(11.0, 1.5))  # 50 busy minutes, 50 idle
        sim_state.pending_scores.append((target, upper, upper, median))
        policy._observe(sim_state, now, actual, 0.99)
        policy._judge(sim_state, 0.99, now)
        ctl_state.scores.append(_Score(target, actual, upper, median, upper))
    *_, scored, coverage = controller._judge(ctl_state, 0.99, "phase_naive", now)
    assert coverage is not None
    assert sim_state.coverage == pytest.approx(coverage[0])
    assert sim_state.coverage_samples == coverage[1] < sim_state.scored == scored
    assert sim_state.excess_share == pytest.approx(controller._excess_share(ctl_state, 0.99, now))
