"""Review 42 of issue 14's calibrated excess in the controller (``autoscaler/forecasting.py`` ``_excess_share``):
the defects found (strict xfails at review, fixed in the same stop) and what was checked and found right, pinned.
In-process (``workers = 1``), on the in-memory ports of ``test_forecasting.py``; time is an argument."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from test_forecasting import DAY, DAY0, JUMP, PEAK, REFIT, TICK, World, forecast_settings, policy, series

from autoscaler.core.headroom import calibrated_excess
from autoscaler.core.model import ForecastMode, ForecastPolicy
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.forecasting import ForecastService, _Score, _ServiceState
from autoscaler.settings import ForecastSettings

UPDATE = 60.0


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="autoscaler")


def steady(t: float) -> float:
    return PEAK


def _service(world: World) -> ForecastService:
    """A ForecastService as the runtime builds it: refits every 15 minutes, updates every minute."""
    return ForecastService(
        forecast_settings(model="last_value"),
        world.metrics,
        lambda: world.policies,
        refit_interval_s=REFIT,
        tick_interval_s=TICK,
        update_interval_s=UPDATE,
    )


def _run(service: ForecastService, start: float, refits: int) -> float:
    """``refits`` refit rounds with the minute's updates between them; the time after the last."""
    for i in range(refits):
        now = start + i * REFIT
        service.refit(now)
        for k in range(1, int(REFIT // UPDATE)):
            service.update(now + k * UPDATE)
    return start + refits * REFIT


def _world(quantile: float = 0.99) -> World:
    world = World([policy(quantile=quantile)], demand=steady, model="last_value")
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, DAY0 + 4 * DAY, noise=1.0))
    return world


def test_the_share_is_measured_on_the_very_scores_the_coverage_is() -> None:
    """``_excess_share`` and ``_judge`` select the same live scores (the accountability window, by sample time):
    the share is measured on the values behind the published coverage."""
    world = _world()
    service = _service(world)
    end = _run(service, JUMP, 12)  # 3 hours: 170+ live scores, more than a P99's 100
    pub = service.published["ml/chat"]
    state = service._state["ml/chat"]
    window = service.settings.accountability_window_seconds
    last = end - REFIT + (REFIT // UPDATE - 1) * UPDATE  # the last update's time
    kept = [(sc.actual, sc.model_median, sc.model_q) for sc in state.scores if sc.time >= last - window]
    share, n = calibrated_excess(kept, 0.99, service.settings.min_scored_samples)
    assert n == pub.scored == pub.coverage_samples >= 100
    assert pub.excess_share == pytest.approx(share) and share < 1.0  # last_value's P99 over-covered here


def test_a_new_quantile_starts_its_share_afresh() -> None:
    """The scores of the old level are dropped with the state at the next refit: the new level's share is 1 until
    it has its own scores, and the tick would not apply an old level's share anyway (``pub.quantile``)."""
    world = _world(0.99)
    service = _service(world)
    end = _run(service, JUMP, 12)
    assert service.published["ml/chat"].excess_share < 1.0
    world.policies = [dataclasses.replace(world.policies[0], forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.95))]
    service.refit(end)
    pub = service.published["ml/chat"]
    assert pub.quantile == 0.95 and pub.excess_share == 1.0


def test_a_restart_provisions_the_backtests_share_as_it_keeps_the_backtests_coverage() -> None:
    """Fixed (was a strict xfail: the share lived only in the live scores, so a restart went back to the full P99
    while the backtest's coverage kept the service earned). Now the bootstrap backtest also gives a share
    (``_backtest_share``) that speaks until the live scores can judge the quantile, as its coverage does. In this
    world the backtest's P99 under-covers (98.3 %), so its share is 1 -- the same answer the live scores would give on
    those values; a backtest that over-covers gives less (the next test)."""
    world = _world(0.99)
    end = _run(_service(world), JUMP, 12)
    restarted = _service(world)
    restarted.refit(end)
    pub = restarted.published["ml/chat"]
    state = restarted._state["ml/chat"]
    assert pub.scored == 0 and pub.coverage is not None and pub.coverage_samples >= 100  # the backtest speaks
    assert pub.excess_share == state.verdict_share == 1.0


def test_the_backtest_share_is_the_calibration_of_its_scores() -> None:
    from types import SimpleNamespace

    import numpy as np

    from autoscaler.forecasting import _backtest_share

    rng = np.random.default_rng(3)
    actuals = rng.normal(10.0, 1.0, size=(20, 10))
    medians = np.full((20, 10), 10.0)
    uppers = np.full((20, 10), 14.0)  # a P99 4 sigma up: over-covers
    result = SimpleNamespace(levels=(0.5, 0.99), actuals=actuals, predictions=np.stack([medians, uppers]))
    triples = list(zip(actuals.ravel(), medians.ravel(), uppers.ravel(), strict=True))
    share = _backtest_share(result, 0.99, 200, 30)
    assert share == pytest.approx(calibrated_excess(triples, 0.99, 30)[0]) and share < 0.8
    assert _backtest_share(result, 0.99, 99, 30) == 1.0  # fewer distinct values than a P99 needs
    no_median = SimpleNamespace(levels=(0.1, 0.99), actuals=actuals, predictions=np.stack([medians, uppers]))
    assert _backtest_share(no_median, 0.99, 200, 30) == 1.0  # no median to narrow towards


def test_the_backtest_share_speaks_until_the_live_scores_can_judge() -> None:
    settings = ForecastSettings(model="last_value", workers=1, min_history_seconds=0, bootstrap_origins=0)
    service = ForecastService(settings, FakeMetricsSource(), lambda: [], refit_interval_s=900.0)
    now = 1_000_000.0
    state = _ServiceState(quantile=0.99, verdict=(True, "ok", 0.5), verdict_coverage=0.999, verdict_samples=150,
                          verdict_share=0.6, verdict_at=now - 600.0)  # fmt: skip
    assert service._excess_share(state, 0.99, now) == 0.6  # no live scores: the backtest's
    state.scores.extend(_Score(now - i * 60.0, 14.0, 20.0, 10.0, 20.0) for i in range(99))
    assert service._excess_share(state, 0.99, now) == 0.6  # 99 < the 100 a P99 needs
    state.scores.append(_Score(now, 14.0, 20.0, 10.0, 20.0))
    assert service._excess_share(state, 0.99, now) == pytest.approx(0.4)  # the live scores judge
    state.scores.clear()
    state.verdict_at = now - settings.accountability_window_seconds - 1.0
    assert service._excess_share(state, 0.99, now) == 1.0  # a stale verdict says nothing


def test_scores_outside_the_window_say_nothing_and_non_finite_actuals_never_become_scores() -> None:
    """The window is the coverage's (``sample time >= now - window``) at its edge, to the second."""
    settings = ForecastSettings(model="last_value", workers=1, min_history_seconds=0, bootstrap_origins=0)
    service = ForecastService(settings, FakeMetricsSource(), lambda: [], refit_interval_s=900.0)
    now = 1_000_000.0
    window = settings.accountability_window_seconds
    state = _ServiceState(quantile=0.99)
    state.scores.extend(_Score(now - window - 1.0, 30.0, 20.0, 10.0, 20.0) for _ in range(10))  # just outside
    state.scores.extend(_Score(now - window, 14.0, 20.0, 10.0, 20.0) for _ in range(100))  # on the edge: in
    assert service._excess_share(state, 0.99, now) == pytest.approx(0.4)
