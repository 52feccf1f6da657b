"""Review 34 of the controller's forecasting path (``autoscaler/forecasting.py``, ``autoscaler/core/headroom.py``):
reproductions of the defects found, kept as regression tests.

Everything runs in this process (``workers = 1``) on the in-memory ports of ``test_forecasting.py``; time is an
argument: nothing here sleeps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from runtime_fakes import FakePolicies, policy_object
from test_forecasting import DAY, DAY0, JUMP, PEAK, REFIT, STEP, TICK, World, forecast_settings, policy, series

from autoscaler.controller import Controller
from autoscaler.core.headroom import HeadroomState
from autoscaler.forecasting import FitJob, FitResult, ForecastService


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="autoscaler")


def steady(t: float) -> float:
    return PEAK


def new_leader(world: World, now: float, **settings: Any) -> None:
    """What a restart or a change of leader leaves: a fresh ForecastService (no fit, no score) and a fresh
    controller that took the Lease at ``now``, on the same cluster, metrics and policies."""
    world.service = ForecastService(
        forecast_settings(**settings),
        world.metrics,
        lambda: world.policies,
        refit_interval_s=REFIT,
        tick_interval_s=TICK,
        telemetry=world.telemetry,
    )
    world.controller = Controller(
        metrics=world.metrics,
        cluster=world.cluster,
        writer=world.cluster,
        policies=FakePolicies([policy_object(p) for p in world.policies]),
        status_writer=world.status,
        telemetry=world.telemetry,
        forecasts=world.service,
    )
    world.controller.start_acting(now)


def earned_world(
    quantile: float = 0.9, demand: Callable[[float], float] = steady, noise: float = 0.5, **settings: Any
) -> World:
    world = World([policy(quantile=quantile)], demand=demand, **settings)
    world.metrics.set_history("ml/chat", "request_rate", series(demand, DAY0, DAY0 + 4 * DAY, noise=noise))
    return world


# ---- 1. a restart or a new leader holds what it finds until its first refit -----------------------------------------


def test_a_new_leader_does_not_scale_up_every_earned_service_before_its_first_refit() -> None:
    """The first tick of a new leader (or of a restarted controller) always runs before its first refit: with no fit
    yet, every ACTIVE forecasting service was read as ``untrusted`` and its reactive path ran at 0.75 x its target,
    so every earned service was scaled up by a third at each rollout or change of leader (with capacity arbitration:
    training preempted, burst nodes bought for it), and given back once the refit had restored the earned headroom."""
    world = earned_world()
    world.service.refit(JUMP)
    for i in range(8):
        plan = world.tick(JUMP + i * TICK)
    before = world.replicas()
    assert plan.forecasts["ml/chat"].headroom.state is HeadroomState.EARNED
    takeover = JUMP + 8 * TICK
    new_leader(world, takeover)
    plan = world.tick(takeover)
    assert world.replicas() == before, "a new leader scaled an earned service up before its first refit"
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.ratio == 1.0
    assert "first refit" in headroom.detail
    # the refit lands: the bootstrap backtest earns the target back, nothing moved in between
    world.service.refit(takeover + 5)
    for i in range(1, 30):
        plan = world.tick(takeover + i * TICK)
    assert world.replicas() == before
    assert plan.forecasts["ml/chat"].headroom.state is HeadroomState.EARNED


def test_before_its_first_refit_a_new_leader_gives_nothing_back_either() -> None:
    """The held service keeps its replicas until the first refit, however long that refit takes (it is not the
    time to decide on a target nobody has judged yet), then scales on the usual rules."""
    takeover = JUMP + 8 * TICK

    def demand(t: float) -> float:
        return PEAK if t < takeover else PEAK / 2  # demand halves while the first refit is still running

    world = earned_world(demand=demand, model="last_value")
    world.service.refit(JUMP)
    for i in range(8):
        world.tick(JUMP + i * TICK)
    before = world.replicas()
    new_leader(world, takeover, model="last_value")
    world.metrics.set_history("ml/chat", "request_rate", series(demand, DAY0, DAY0 + 4 * DAY))
    for i in range(60):  # 15 minutes, three scale-down windows
        world.tick(takeover + i * TICK)
    assert world.replicas() == before
    # once the refit has run, the scale-down goes on the usual rules
    world.service.refit(takeover + 60 * TICK)
    for i in range(60, 120):
        world.tick(takeover + i * TICK)
    assert world.replicas() < before


def test_after_the_first_refit_a_service_without_a_fit_runs_at_the_untrusted_target() -> None:
    """The hold is the new leader's, not a new service's: once a refit has run, a service it could not fit (too
    little history) is learning from nothing, as before."""
    world = World([policy()])
    world.metrics.set_history("ml/chat", "request_rate", series(steady, JUMP - 600, JUMP))  # 10 minutes
    assert world.service.read_config().headroom.hold_unfitted  # type: ignore[union-attr]
    report = world.service.refit(JUMP)
    assert "ml/chat" in report.no_data
    assert not world.service.read_config().headroom.hold_unfitted  # type: ignore[union-attr]
    plan = world.tick(JUMP)
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is HeadroomState.UNTRUSTED and headroom.ratio == 0.75


# ---- 2. the bootstrap backtest earns a high quantile's headroom too -------------------------------------------------


@pytest.mark.parametrize("quantile", [0.9, 0.97, 0.99])
def test_a_restart_keeps_the_earned_headroom_of_a_high_quantile(quantile: float) -> None:
    """The bootstrap backtest's coverage was counted as ``min_scored_samples`` (30) values whatever it had scored
    (68 with the defaults), and a P97 needs 34, a P99 100, before its coverage is judged: every restart put such a
    service back to ``learning`` at 0.75 x its target for the 100 minutes its live scores took (a scale-up by a third
    and back). The backtest now counts what it scored, and scores enough values for the provisioned quantile."""
    world = earned_world(quantile, noise=0.0)
    report = world.service.refit(JUMP)
    assert report.ok == ["ml/chat"]
    published = world.service.published["ml/chat"]
    assert published.scored == 0  # no live score yet: the bootstrap backtest speaks
    assert published.coverage_samples >= math.ceil(1 / (1 - quantile) - 1e-9)
    plan = world.tick(JUMP)
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is HeadroomState.EARNED, headroom.detail


def test_the_bootstrap_counts_the_values_it_scored_not_the_minimum() -> None:
    world = earned_world(0.9)
    world.service.refit(JUMP)
    published = world.service.published["ml/chat"]
    detail = published.latest.reliability_detail
    assert f"over {published.coverage_samples} values" in detail  # the backtest's own count, as its verdict says


def test_bootstrap_origins_zero_still_waits_for_live_scores() -> None:
    world = earned_world(0.99)
    world.service = ForecastService(
        forecast_settings(bootstrap_origins=0), world.metrics, lambda: world.policies, refit_interval_s=REFIT
    )
    world.service.refit(JUMP)
    published = world.service.published["ml/chat"]
    assert not published.latest.reliable and published.coverage_samples == 0


# ---- 3. a bootstrap verdict expires as live scores do ----------------------------------------------------------------


class Spy:
    """Records the fit jobs a ForecastService hands its runner."""

    def __init__(self, service: ForecastService) -> None:
        self.jobs: list[FitJob] = []
        run = service.runner.run

        def recording(jobs: Iterable[FitJob]) -> list[FitResult]:
            def seen() -> Iterable[FitJob]:
                for job in jobs:
                    self.jobs.append(job)
                    yield job

            return run(seen())

        service.runner.run = recording  # type: ignore[method-assign]


def test_a_bootstrap_verdict_older_than_the_accountability_window_is_not_trusted_again() -> None:
    """The bootstrap backtest's verdict "stands until enough live scores exist", and it was made once, at a service's
    first fit. Whenever the live scores then thinned out below ``min_scored_samples`` (a leader that lost the Lease
    for longer than the accountability window and took it back, a metric gap of hours), that verdict came back,
    however old: a service whose demand had since outgrown its forecast was judged by a backtest of last week's
    demand and earned its full target (a scale-down) until 30 new live scores said otherwise. A verdict now expires
    after ``accountability_window_seconds``, as live scores do, and the refit backtests the service again."""
    t0 = JUMP
    later = t0 + 7 * 3600.0  # the accountability window is 6 hours

    def demand(t: float) -> float:
        # steady until 90 minutes before ``later``, then a climb the naive forecast keeps lagging
        ramp = later - 5400.0
        return 20.0 if t < ramp else 20.0 + 30.0 * (t - ramp) / 5400.0

    world = World([policy()], demand=demand, history_seconds=4 * 3600.0, model="last_value")
    world.metrics.set_history("ml/chat", "request_rate", series(demand, DAY0, DAY0 + 4 * DAY, noise=0.3))
    world.service.refit(t0)
    headroom = world.tick(t0).forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is HeadroomState.EARNED  # steady demand: an easy forecast
    # ... then no refit for 7 hours (this replica lost the Lease and took it back): no live score in the window
    spy = Spy(world.service)
    world.service.refit(later)
    assert spy.jobs and spy.jobs[0].backtest_origins > 0, "the expired verdict was not backtested again"
    published = world.service.published["ml/chat"]
    assert published.scored == 0
    plan = world.tick(later)
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is not HeadroomState.EARNED, headroom.detail


def test_a_fresh_bootstrap_verdict_is_not_backtested_again() -> None:
    world = earned_world()
    world.service.refit(JUMP)
    spy = Spy(world.service)
    world.service.refit(JUMP + REFIT)
    assert spy.jobs and spy.jobs[0].backtest_origins == 0  # 15 minutes old: it still speaks


# ---- 4. a quantile the accountability window cannot judge says so --------------------------------------------------


def test_a_quantile_the_window_cannot_judge_says_it_can_never_earn_its_target() -> None:
    """A P99.9 needs 1,000 scored values; a 6-hour accountability window at one-minute steps holds 360 (one score per
    step). The service stayed ``learning`` forever, its status saying "360 of 1000 live scores" as if it were on its
    way. The detail now says it cannot get there, and which settings to change."""
    world = earned_world(0.999)
    world.service.refit(JUMP)
    assert world.service.read_config().headroom.max_scored == 361  # type: ignore[union-attr]
    plan = world.tick(JUMP)
    headroom = plan.forecasts["ml/chat"].headroom
    assert headroom is not None and headroom.state is HeadroomState.LEARNING
    assert "never" in headroom.detail and "accountability_window_seconds" in headroom.detail


# ---- 5. the update job reads no more history than a refit would ------------------------------------------------------


def test_an_update_after_a_long_absence_leaves_the_history_to_the_refit() -> None:
    """The update job reads the history from the end of the series it knew. On a replica that led, lost the Lease
    and took it back days later, that was days of history per service (more than the training window the refit
    reads), read before the refit it kept waiting (they share a lock), for a fit the refit replaces anyway."""
    world = World([policy()], model="last_value")
    world.service.update_interval_s = 60.0
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, DAY0 + 12 * DAY))
    t0 = DAY0 + 4 * DAY
    world.service.refit(t0)
    calls = len(world.metrics.history_calls)
    report = world.service.update(t0 + 5 * DAY)  # the training window is 3 days
    for _, _, start, end, _ in world.metrics.history_calls[calls:]:
        assert end - start <= 3 * DAY
    assert "ml/chat" in report.no_data and "refit" in report.no_data["ml/chat"]
    assert world.service.refit(t0 + 5 * DAY).ok == ["ml/chat"]
    assert world.service.update(t0 + 5 * DAY + 120).ok == ["ml/chat"]


def test_the_update_job_still_reads_only_the_new_tail() -> None:
    world = World([policy()], model="last_value")
    world.metrics.set_history("ml/chat", "request_rate", series(steady, DAY0, DAY0 + 4 * DAY))
    t0 = JUMP - 600
    world.service.refit(t0)
    calls = len(world.metrics.history_calls)
    assert world.service.update(t0 + 300).ok == ["ml/chat"]
    (_, _, start, end, _) = world.metrics.history_calls[calls]
    assert end == t0 + 300 and start == pytest.approx(t0 - 3 * STEP)
    assert np.isfinite(world.service.published["ml/chat"].latest.forecast.at(t0 + 400, 0.9))


def test_a_verdict_about_to_expire_is_renewed_by_the_refit_before_it_not_left_to_lapse_between_refits() -> None:
    """A service whose live scores stay too few (a metric that is often missing) lives on its bootstrap verdict. The
    refit renews it when it would expire before the next refit: an update in between must not find it lapsed and
    call the forecast unreliable (``only N scored values``) until the next refit backtests again."""
    world = earned_world(model="last_value")
    world.service.update_interval_s = 60.0
    world.service.refit(JUMP)
    window = forecast_settings().accountability_window_seconds
    spy = Spy(world.service)
    world.service.refit(JUMP + window - REFIT / 2)  # the verdict would lapse half-way to the next refit
    assert spy.jobs[-1].backtest_origins > 0
    world.service._state["ml/chat"].scores.clear()  # no live score: the verdict alone speaks
    report = world.service.update(JUMP + window + REFIT / 4)
    assert report.ok == ["ml/chat"]
    detail = world.service.published["ml/chat"].latest.reliability_detail
    assert detail.startswith("backtest: "), detail  # not "live: ... only 0 scored values"
