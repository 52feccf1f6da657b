"""SlidingQuantiles gives new residuals the weight 2 ** (ordinal * rate) relative to a reference fixed at build time
and only rebuilds after MAX_UPDATES changed residuals. With a short half-life (rate = step / half-life >= ~0.5),
the exponent passes 1024 before the rebuild and Python's float pow raises OverflowError in predict."""

import numpy as np

from forecast.baselines import LastValue
from forecast.phase import PhaseNaive

STEP = 60.0


def _run(make, y, window, updates):
    model = make()
    for k, end in enumerate(range(window + 100, window + 100 + updates)):
        first = end - window
        if k == 0:
            model.fit(y[first:end], start=first * STEP, step_s=STEP)
        else:
            model.update(y[first:end], start=first * STEP)
        forecast = model.predict(3)  # OverflowError here after ~1024 one-step updates
    reference = make().fit(y[first:end], start=first * STEP, step_s=STEP).predict(3)
    for level in forecast.levels:
        np.testing.assert_allclose(forecast.quantiles[level], reference.quantiles[level], rtol=1e-9, atol=1e-9)


def test_last_value_with_a_one_step_half_life_survives_long_runs_of_updates() -> None:
    y = np.random.default_rng(0).gamma(2.0, 10.0, 3000)
    _run(lambda: LastValue(residual_window=300, residual_half_life_s=STEP), y, 300, 1100)


def test_phase_naive_with_a_half_life_of_one_period_survives_a_week_of_minute_updates() -> None:
    rng = np.random.default_rng(1)
    n = 12_000
    y = np.repeat(np.exp(rng.normal(3.0, 0.5, n // 10 + 1)), 10)[:n] * (1 + rng.normal(0, 0.02, n))
    # 10-minute windows, a 10-minute half-life: rate = 600 / 600 = 1 per visit of a phase's residual set
    # without mean reversion: a fresh fit re-estimates its slopes, an update keeps them (the reference is a fresh fit)
    _run(
        lambda: PhaseNaive(period_s=600.0, residual_window=600, residual_half_life_s=600.0, reversion_periods=None),
        y,
        600,
        10_400,
    )
