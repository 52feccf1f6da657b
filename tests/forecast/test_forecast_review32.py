"""Review 32 of the forecasting path, the ``forecast`` package side: reproductions of the defects found, kept as
regression tests."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from forecast.phase import PhaseNaive

STEP = 60.0
DAY0 = 20_833 * 86_400.0


def _ten_minute_windows(n: int) -> np.ndarray:
    t = DAY0 + np.arange(n) * STEP
    return 10.0 + 5.0 * ((t // 600 * 7919) % 5) + np.random.default_rng(0).normal(0.0, 0.5, n)


def test_the_residual_sets_an_updated_model_keeps_are_stored_compactly() -> None:
    """The controller's update job keeps each service's fitted model for as long as it runs, and with it the sorted
    residual sets (``OrderHints``) that make an update cheap: one per phase and lead, hundreds of thousands of
    residuals for the default ``phase_naive`` on a week of one-minute history. They were lists of Python floats,
    32 bytes a value and as much again for its weight: about 44 MB per service at a week of history (the comment
    said a few hundred kB), growing with the history over the service's first week, with a 1.5 GiB limit on the
    controller. Stored as arrays of doubles they take 8 bytes a value, and the quantiles are the same."""
    n = 2 * 1440
    y = _ten_minute_windows(n + 10)
    model = PhaseNaive(quantiles=(0.1, 0.5, 0.9, 0.99))
    model.fit(y[:n], start=DAY0, step_s=STEP)
    gc.collect()
    tracemalloc.start()
    try:
        for k in range(1, 11):  # ten minutes of updates: the kept sets of ten origin phases
            model.update(y[k : n + k], start=DAY0 + k * STEP).predict(60)
        gc.collect()
        kept_bytes, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    residuals = sum(len(s.values) for s in model.order_hints_._sets.values())
    assert residuals > 100_000  # the sets this is about
    # everything the updates left alive (the sets, their weights and last residuals, the model's copies of the
    # history), per kept residual: was about 75 bytes
    assert kept_bytes / residuals < 40.0, kept_bytes / residuals


def test_compact_residual_sets_give_the_same_forecasts_as_learning_from_scratch() -> None:
    """The kept sets only make updates cheaper: the forecasts equal a fresh fit's up to float rounding (without mean
    reversion: its slopes are fitted parameters, kept by an update and re-estimated by a fresh fit;
    ``test_phase_reversion`` checks that path against learning from scratch with the slopes kept)."""
    n = 2 * 1440
    y = _ten_minute_windows(n + 20)
    kept = PhaseNaive(quantiles=(0.1, 0.5, 0.9, 0.99), reversion_periods=None).fit(y[:n], start=DAY0, step_s=STEP)
    kept.predict(60)
    for k in range(1, 21):
        updated = kept.update(y[k : n + k], start=DAY0 + k * STEP).predict(60)
        fresh = PhaseNaive(
            quantiles=(0.1, 0.5, 0.9, 0.99), period_s=kept.period_bins_ * STEP, reversion_periods=None
        )
        scratch = fresh.fit(y[k : n + k], start=DAY0 + k * STEP, step_s=STEP).predict(60)
        assert updated.start == scratch.start
        for level in updated.levels:
            np.testing.assert_allclose(updated.quantiles[level], scratch.quantiles[level], rtol=1e-9, atol=1e-9)
