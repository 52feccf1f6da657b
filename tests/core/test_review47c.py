"""Review 47c: the scale-down hold over two lead times (commit 8e938d9) beside the contended hold.

``core.tick`` folds ``ReplicaFloor.contended_hold`` into ``hold`` only when it exceeds the hold, and then reports the
contended window as the hold's (``hold_window_s``, the "again within Ns" of ``autoscaler plan``). With the hold now
reading up to two lead times, a contended hold of fewer seconds past the lead than one lead time
(``forecast.contended_hold_seconds`` below the lead) ends *before* the hold's window: were it ever folded in, the
decision would say a window shorter than the one it holds for. It never is: the contended hold is read from now, so
a window inside the hold's reads no more than the hold (``contended_hold == hold``), and one that reads more reaches
past the hold's window. This test passes on the reviewed code; it pins that invariant on random forecasts.
"""

from __future__ import annotations

import dataclasses
import random

from autoscaler.core.predictive import ForecastInput, PredictiveSettings, forecast_floor
from forecast.types import Forecast
from tests.core.test_scale_down_hold_leads import CHAT


def test_a_contended_hold_above_the_hold_always_covers_a_longer_window() -> None:
    rng = random.Random(47)
    shorter = folded = 0
    for _ in range(3000):
        n, step = rng.randint(1, 20), rng.choice([15.0, 60.0])
        med = [rng.uniform(0.0, 50.0) for _ in range(n)]
        top = [m + rng.uniform(0.0, 20.0) for m in med]
        forecast = Forecast(0.0, step, {0.5: med, 0.99: top}, "random")
        policy = dataclasses.replace(CHAT, min_replicas=0, max_replicas=40)
        lead = rng.choice([0.0, 30.0, 90.0, 300.0])
        settings = PredictiveSettings(
            rng.choice([1.0, 3.2]), rng.choice([0.5, 0.99]), refit_period_s=1e9,
            hold_leads=rng.choice([1.0, 2.0, 3.0]), contended_hold_s=rng.choice([0.0, 15.0, 60.0, 200.0, 1800.0]),
        )  # fmt: skip
        now = rng.uniform(0.0, n * step)
        floor = forecast_floor(policy, ForecastInput(forecast, 0.0), settings, now, lead, rng.choice([0.0, 15.0]))
        if floor is None or not floor.usable:
            continue
        if floor.contended_hold and floor.contended_window_s < floor.hold_window_s:
            shorter += 1
            assert floor.contended_hold == floor.hold
        if floor.contended_hold > floor.hold:
            folded += 1
            assert floor.contended_window_s > floor.hold_window_s
    assert shorter > 50 and folded > 50
