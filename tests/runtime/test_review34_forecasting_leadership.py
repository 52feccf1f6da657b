"""Review 34: what the forecasting path's fixes needed beyond ``autoscaler/forecasting.py`` and
``autoscaler/core/headroom.py``: the hold of a new leadership term (``Controller`` calls ``ForecastReader.start_term``)
and an accountability window too short to judge anything (accepted: its services say they can never earn
trust). The first was a strict xfail until fixed."""

from __future__ import annotations

import logging

import pytest
from test_forecasting import DAY, DAY0, JUMP, PEAK, TICK, World, policy, series

from autoscaler.core.headroom import HeadroomState
from autoscaler.runtime import Runtime
from autoscaler.settings import ForecastSettings


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="autoscaler")


class Scheduler:
    """Stands in for apscheduler: the jobs the runtime brings forward are only noted."""

    running = True

    def modify_job(self, job: str, **kw: object) -> None:
        pass


def test_a_replica_that_takes_the_lease_back_holds_until_its_next_refit() -> None:
    """A fresh process holds the services it has no forecast for until its first refit (review 34). A replica that
    led, lost the Lease for longer than ``stale_after_periods`` refit intervals and takes it back still has its old
    fits: stale, they are read as untrusted at the first tick of the new term (which always runs before its refit),
    and every earned service is scaled up by a third until the refit lands."""
    world = World([policy()], demand=lambda t: PEAK)
    world.metrics.set_history("ml/chat", "request_rate", series(lambda t: PEAK, DAY0, DAY0 + 4 * DAY, noise=0.5))
    world.service.refit(JUMP)
    for i in range(8):
        plan = world.tick(JUMP + i * TICK)
    assert plan.forecasts["ml/chat"].headroom.state is HeadroomState.EARNED
    before = world.replicas()
    regained = JUMP + 2 * 3600.0  # the other replica led for two hours
    runtime = Runtime(world.controller, world.telemetry, http=None, clock=lambda: regained)
    runtime.scheduler = Scheduler()  # type: ignore[assignment]
    for p in world.policies:
        world.metrics.set_service(p.key, spec_replicas=before, ready_replicas=before, metric_total=PEAK,
                                  request_rate=PEAK)  # fmt: skip
    runtime.on_started_leading()
    runtime.tick()
    assert world.replicas() == before


def test_an_accountability_window_too_short_to_judge_anything_is_accepted_and_bounds_the_scores() -> None:
    """One live score per forecast step: a 10-minute window at 60 s steps holds 11 scores at most, never the 30 a
    verdict needs. Refusing it at start-up crash-looped a controller whose settings had started it the day before
    (any forecast.step_seconds above 720 with the default window): the settings load, and the headroom's bound
    says such a service can never earn trust (test_review34_forecasting checks the detail)."""
    settings = ForecastSettings(accountability_window_seconds=600.0, step_seconds=60.0, min_scored_samples=30)
    assert int(settings.accountability_window_seconds // settings.step_seconds) + 1 == 11
