"""Review 38 of the forecasting path (``autoscaler/forecasting.py``, ``forecast/``, ``core/headroom.py``).

The tests saying "Fixed" were strict xfails on the code as reviewed, all four fixed in the same stop. The rest pins
right behaviour checked here that no other test covers. Everything runs in this process (``workers = 1``) on the
in-memory ports of ``test_forecasting.py``; time is an argument: nothing sleeps.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
from test_forecasting import DAY, DAY0, JUMP, PEAK, REFIT, STEP, TICK, World, policy, series
from test_review34_forecasting import earned_world, new_leader

from autoscaler.core.headroom import HeadroomState
from autoscaler.forecasting import FitJob, on_grid, run_fit
from autoscaler.ports import PortError, Series


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="autoscaler")


def steady(t: float) -> float:
    return PEAK


def fit_job(model: str, y: np.ndarray, **overrides: Any) -> FitJob:
    values: dict[str, Any] = {
        "key": "ml/chat",
        "model": model,
        "params": {},
        "y": np.asarray(y, dtype=np.float64),
        "start": DAY0,
        "step_s": STEP,
        "horizon_steps": 60,
        "levels": (0.1, 0.5, 0.9),
        "quantile": 0.9,
        "timeout_s": 60.0,
        "backtest_origins": 4,
        "backtest_horizon_steps": 17,
    }
    values.update(overrides)
    return FitJob(**values)


# ---- defects ---------------------------------------------------------------------------------------------------------


def test_a_p99_service_keeps_the_bootstrap_coverage_until_its_live_scores_can_judge_the_quantile() -> None:
    """Fixed (was a strict xfail).

    WRONG: after a restart (or a new service's first fit) the bootstrap backtest earns a P99 service its full
    target at once (it scores the 100 values a P99 needs). Once 30 live scores have arrived (``min_scored_samples``),
    ``ForecastService._judge`` drops the backtest and publishes the live coverage over those 30 values; the headroom
    needs 100 for a P99, so the service goes EARNED -> LEARNING (target x 0.75: a scale-up by a third, 5 -> 7
    replicas here) about 32 minutes after the restart and back to EARNED only after 100 minutes: the very swing
    review 34 removed from the restart itself, moved half an hour later. The refit does not backtest again either
    (``needs_bootstrap`` also stops at ``min_scored_samples``).
    RIGHT: the backtest's coverage (and samples) speak while the live scores are fewer than
    ``scores_needed(quantile, min_scored_samples)``, as long as the verdict is fresh; the service stays EARNED."""
    world = earned_world(0.99, noise=0.0)
    world.service.update_interval_s = 60.0
    t0 = JUMP
    world.service.refit(t0)
    assert world.tick(t0).forecasts["ml/chat"].headroom.state is HeadroomState.EARNED
    for minute in range(1, 36):
        world.service.update(t0 + minute * 60.0)
    published = world.service.published["ml/chat"]
    assert published.scored >= 30  # live scores have taken over the verdict
    plan = world.tick(t0 + 35 * 60.0 + 1)
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is HeadroomState.EARNED, headroom.detail


def test_a_first_refit_that_could_not_read_any_history_does_not_end_the_new_leaders_hold() -> None:
    """Fixed (was a strict xfail).

    WRONG: a new leader (or a restarted controller) holds every service without a usable forecast until its first
    refit, because it does not know what trust they had earned. A first refit whose range queries all fail (a
    Thanos/Mimir store down: ``_range`` turns the partial answer into a PortError, while the tick's instant queries
    still work) knows no more, yet it ends the hold: the next tick reads the earned service as "no forecast fitted
    yet", runs it at 0.75 x its target and scales it up (6 -> 7 replicas here), and back once a refit reads.
    RIGHT: the hold ends with the first refit that read the service's history (fitted it, or found it too short);
    a round in which the history could not be read leaves the hold in place."""
    world = earned_world()
    world.service.refit(JUMP)
    for i in range(8):
        world.tick(JUMP + i * TICK)
    before = world.replicas()
    takeover = JUMP + 8 * TICK
    new_leader(world, takeover)

    def unreadable(*args: Any, **kwargs: Any) -> Series:
        raise PortError("history of ml/chat request_rate: Prometheus answered with a warning (partial answer)")

    world.metrics.history = unreadable  # type: ignore[method-assign]
    world.tick(takeover)
    report = world.service.refit(takeover + 5)
    assert "ml/chat" in report.no_data and "unreadable" in report.no_data["ml/chat"]
    for i in range(1, 30):
        plan = world.tick(takeover + i * TICK)
    headroom = plan.forecasts["ml/chat"].headroom
    assert world.replicas() == before, headroom.detail
    assert headroom is not None and headroom.ratio == 1.0


def test_fourier_arima_fits_a_constant_history() -> None:
    """Fixed (was a strict xfail).

    WRONG: a service whose request rate is flat (a fixed-rate client, a synthetic probe) makes ``fourier_arima``
    raise ``numpy.linalg.LinAlgError`` in statsmodels' stationary initialisation at every refit: the failure is kept
    local (``failed``), but it recurs every round, so the service has no forecast for as long as its demand is flat
    (an all-zero history fits; 5 req/s does not).
    RIGHT: a constant series is fitted (a flat forecast at its level, e.g. by skipping the ARMA fit when the
    variance is zero), as every other registered model does."""
    result = run_fit(fit_job("fourier_arima", np.full(2 * 1440, 5.0), backtest_origins=0))
    assert result.status == "ok", result.error


def test_one_service_whose_samples_are_all_nan_does_not_take_the_other_services_refit_down() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``on_grid`` is meant to leave NaN where a sample is not finite, but when *every* sample is dropped
    (all NaN or +-Inf, or all outside the grid) ``last = np.append(index[1:] != index[:-1], True)`` has one element
    for an empty index and ``v[last]`` raises IndexError. ``_prepare`` calls it outside any ``try``: the exception
    leaves the job generator, ``runner.run`` and ``_refit``; ``refit`` logs "refit round failed" and publishes
    nothing for *any* service, at every round while that one history stays so (all fits go stale after 45 minutes).
    The update job reads its tail through ``on_grid`` the same way. The MetricsSource port does not promise finite
    values (a custom source, a recording rule's NaN), and the docstring promises "Failures stay local".
    RIGHT: an all-NaN (or all off-grid) history is an all-NaN grid: ``no_data`` for that service, the others fit."""
    nan_history = Series(tuple(JUMP - i * STEP for i in range(120, -1, -1)), (math.nan,) * 121)
    assert np.isnan(on_grid(nan_history.times, nan_history.values, JUMP - 120 * STEP, STEP, 121)).all()
    world = World([policy(), policy("embed")])
    world.metrics.set_history("ml/embed", "request_rate", nan_history)
    report = world.service.refit(JUMP)
    assert report.ok == ["ml/chat"] and "ml/embed" in report.no_data
    assert "ml/chat" in world.service.published


# ---- right behaviour, pinned -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["zeros", "constant", "huge", "drop_to_zero", "two_points", "mostly_missing"],
)
def test_the_default_model_fits_bad_histories_into_a_finite_non_negative_forecast(case: str) -> None:
    """All zeros, a constant, values near 1e200 req/s, a drop to zero (a counter reset read as a rate that stops), two
    samples, 95 % missing: the default model (and the baseline beside it) fits, and the forecast is finite,
    non-negative and starts where the history ends."""
    n = 3 * 1440
    rng = np.random.default_rng(7)
    y = {
        "zeros": np.zeros(n),
        "constant": np.full(n, 5.0),
        "huge": rng.uniform(0.5, 1.0, n) * 1e200,
        "drop_to_zero": np.concatenate([np.full(n // 2, 10.0), np.zeros(n - n // 2)]),
        "two_points": np.array([1.0, 2.0]),
        "mostly_missing": np.where(rng.uniform(size=n) < 0.95, np.nan, 3.0),
    }[case]
    y[-1] = y[-1] if np.isfinite(y[-1]) else 3.0
    result = run_fit(fit_job("phase_naive", y, levels=(0.1, 0.5, 0.9, 0.99), quantile=0.99))
    assert result.status == "ok", result.error
    assert result.forecast is not None and result.baseline is not None
    for data in (result.forecast, result.baseline):
        assert data["start"] == DAY0 + y.size * STEP
        for values in data["quantiles"].values():
            assert all(math.isfinite(v) and v >= 0.0 for v in values)


@pytest.mark.parametrize("history", ["empty", "one_point", "one_nan_among_finite"])
def test_a_history_too_short_to_fit_is_no_data_and_the_refit_goes_on(history: str) -> None:
    """A single sample, nothing at all, or a single finite sample beside a NaN: ``no_data`` for that service,
    nothing raised, nothing published, and the next refit with a usable history fits it."""
    world = World([policy()], min_history_seconds=0.0)
    times = {"empty": (), "one_point": (JUMP,), "one_nan_among_finite": (JUMP - STEP, JUMP)}[history]
    values = (math.nan, 10.0)[-len(times) :] if times else ()
    world.metrics.set_history("ml/chat", "request_rate", Series(times, values))
    report = world.service.refit(JUMP)
    assert "ml/chat" in report.no_data and not report.ok
    assert "ml/chat" not in world.service.published
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, DAY0 + 4 * DAY))
    assert world.service.refit(JUMP + REFIT).ok == ["ml/chat"]


def test_duplicated_timestamps_keep_the_later_sample_and_off_grid_ones_are_dropped() -> None:
    """Two samples for one instant (an overlap of two range-query chunks): the later one wins; samples before the
    grid or past its end, and non-finite values, leave their grid point empty rather than shifting the series."""
    times = [-STEP, 0.0, STEP, STEP, 2 * STEP, 3 * STEP, 9 * STEP]
    values = [99.0, 1.0, 2.0, 3.0, math.inf, 4.0, 99.0]
    out = on_grid(times, values, 0.0, STEP, 4)
    assert out[0] == 1.0 and out[1] == 3.0 and math.isnan(out[2]) and out[3] == 4.0


def test_updates_out_of_phase_with_refits_score_each_actual_once_within_the_window() -> None:
    """Updates every minute, half a minute after the refits' minute, for six and a half hours: each actual is scored
    once (one score per forecast step, as ``max_scored`` assumes), the scores stay within the accountability
    window, and no forecast waits for its actuals forever."""
    world = World([policy()], model="last_value")
    service = world.service
    service.update_interval_s = 60.0
    service.refit(JUMP)
    for minute in range(1, 400):
        now = JUMP + minute * 60.0
        if minute % 15 == 0:
            service.refit(now)
        service.update(now + 30.0)
    state = service._state["ml/chat"]
    times = [score.time for score in state.scores]
    assert len(times) == len(set(times))
    max_scored = service.read_config().headroom.max_scored  # type: ignore[union-attr]
    assert max_scored is not None and 300 <= len(times) <= max_scored
    assert len(state.pending) <= 3


def test_a_metric_that_stops_leaves_no_pending_forecast_behind_and_the_fit_goes_stale() -> None:
    """The service's metric stops (reads succeed, no sample): updates report no data and keep nothing waiting, and
    the published fit is not renewed, so it goes stale after ``stale_after_periods`` refit intervals."""
    world = World([policy()], model="last_value")
    service = world.service
    service.update_interval_s = 60.0
    t0 = JUMP
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, t0))
    service.refit(t0)
    for minute in range(1, 200):
        service.update(t0 + minute * 60.0)
    assert len(service._state["ml/chat"].pending) <= 2
    assert service.published["ml/chat"].latest.refit_time == t0
    plan = world.tick(t0 + 3 * REFIT + 60.0)
    view = plan.forecasts["ml/chat"]
    assert view.floor is not None and not view.floor.usable


def test_a_flat_fourier_arima_forecasts_its_level_and_follows_an_update() -> None:
    """The flat fit forecasts the series' level at every quantile, and an update re-conditions it on the newest level
    (a naive forecast until the next refit fits the model on the changed history)."""
    from forecast.statistical import FourierARIMA

    model = FourierARIMA().fit(np.full(2 * 1440, 5.0), start=0.0, step_s=60.0)
    forecast = model.predict(30)
    assert all(np.allclose(values, 5.0) for values in forecast.quantiles.values())
    model.update(np.append(np.full(2 * 1440, 5.0), np.full(60, 7.0)), start=0.0, step_s=60.0)
    assert all(np.allclose(values, 7.0) for values in model.predict(30).quantiles.values())
