"""Review 32 of the controller's forecasting path (``autoscaler/forecasting.py``): reproductions of the defects found,
kept as regression tests.

The worker-process tests spawn a small pool (as ``test_forecasting.py`` does); nothing here sleeps longer than a
fraction of a second at a time, and nothing asserts on timing.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from autoscaler.forecasting import FitJob, FitRunner, on_grid
from forecast.baselines import LastValue
from forecast.preprocessing import FloatArray

STEP = 60.0
DAY0 = 20_833 * 86_400.0


class Unpicklable(LastValue):
    """The last value, with a fitted attribute that cannot be pickled (a forecaster of one's own holding a lock, a
    client, a generator...): it fits and forecasts, but its fitted model cannot travel back from a worker process.
    Importable by name (``test_forecasting_review32:Unpicklable``) in spawned workers, which inherit ``sys.path``."""

    def _fit(self, y: FloatArray) -> None:
        super()._fit(y)
        self.lock_ = threading.Lock()


def job(key: str, model: str, y: np.ndarray, timeout_s: float = 60.0) -> FitJob:
    return FitJob(key, model, {}, y, DAY0, STEP, 30, (0.1, 0.5, 0.9), 0.9, timeout_s)


def demand() -> np.ndarray:
    return 10.0 + np.arange(600, dtype=np.float64) % 7


def _wait_until_broken(runner: FitRunner) -> None:
    """The pool's manager thread notices a dead worker within moments; poll in short sleeps (bounded)."""
    pool = runner._pool
    assert pool is not None
    deadline = time.monotonic() + 30.0
    while not getattr(pool, "_broken", False):
        assert time.monotonic() < deadline, "the pool never noticed its dead worker"
        time.sleep(0.05)


# ---- defect: a pool broken while idle was never replaced when only quarantined series were left to fit ----------


def test_a_pool_broken_between_rounds_is_replaced_when_only_quarantined_series_are_fitted() -> None:
    """A worker that dies between two rounds (OOM-killed while idle) breaks the pool. ``_run_alone`` submitted to it
    outside any ``try``: ``BrokenProcessPool`` escaped ``FitRunner.run``, the whole refit round failed, and as
    nothing closed the broken pool (and the quarantine never counted down) every later round failed the same way:
    a cluster whose forecasting services were all quarantined never refitted again."""
    runner = FitRunner(workers=2, fit_timeout_s=20.0, stuck_grace_s=30.0)
    try:
        assert [r.status for r in runner.run([job("warm", "last_value", demand())])] == ["ok"]
        runner._quarantine["solo"] = 3  # as after this series once killed its worker
        pool = runner._pool
        assert pool is not None
        next(iter(pool._processes.values())).kill()
        _wait_until_broken(runner)
        for left in (2, 1):  # every round fits it, and the quarantine counts down
            results = runner.run([job("solo", "last_value", demand())])
            assert [r.status for r in results] == ["ok"], results
            assert runner._quarantine == {"solo": left}
    finally:
        runner.close()


def test_a_pool_broken_between_rounds_took_no_fit_down(caplog: pytest.LogCaptureFixture) -> None:
    """The same with series that are not quarantined: the pool broke before the round, so no fit of this round went
    down with it; it is replaced and the round runs in parallel as usual (it used to take every series for one a
    dead worker took down, and fit them all one at a time, each in a pool of its own after any failure)."""
    runner = FitRunner(workers=2, fit_timeout_s=20.0, stuck_grace_s=30.0)
    try:
        assert [r.status for r in runner.run([job("warm", "last_value", demand())])] == ["ok"]
        pool = runner._pool
        assert pool is not None
        next(iter(pool._processes.values())).kill()
        _wait_until_broken(runner)
        caplog.clear()
        results = runner.run([job(f"s{i}", "last_value", demand()) for i in range(3)])
        assert sorted(r.key for r in results if r.status == "ok") == ["s0", "s1", "s2"], results
        assert not any("took down" in r.getMessage() for r in caplog.records), caplog.text
        assert runner._quarantine == {}
    finally:
        runner.close()


# ---- defect: any exception out of a worker's future was taken for a dead worker ------------------------------------


def test_a_result_that_cannot_be_sent_back_is_that_series_failure_not_a_dead_worker() -> None:
    """A fitted model that cannot be pickled makes the worker send back the pickling error instead of the result.
    It was handled as a dead worker: the pool was torn down twice per round, the series was reported as having
    killed its worker process and quarantined for 24 rounds. It is that series' failure, with the real error."""
    runner = FitRunner(workers=2, fit_timeout_s=20.0, stuck_grace_s=30.0)
    try:
        results = {
            r.key: r
            for r in runner.run(
                [job("odd", "test_forecasting_review32:Unpicklable", demand()), job("fine", "last_value", demand())]
            )
        }
        assert results["fine"].status == "ok"
        odd = results["odd"]
        assert odd.status == "failed" and "pickle" in odd.error, odd
        assert "worker process died" not in odd.error
        assert runner._quarantine == {}
        assert runner._pool is not None  # no worker died: the pool is kept
    finally:
        runner.close()


# ---- defect: samples half a step off the grid collided and left every other grid point empty ----------------------


def test_samples_half_a_step_off_the_grid_each_land_on_their_own_grid_point() -> None:
    """``np.rint`` rounds ties to even: samples at 30, 90, 150... s on a 60 s grid went to grid points 0, 2, 2, 4,
    4...: half of them were dropped and every other grid point was a gap."""
    times = [30.0 + STEP * i for i in range(10)]
    values = [float(i) for i in range(10)]
    out = on_grid(times, values, 0.0, STEP, 11)
    assert np.isnan(out[0])
    assert out[1:].tolist() == values


@pytest.mark.parametrize("offset", [0.0, 0.2 * STEP, -0.2 * STEP])
def test_samples_near_the_grid_keep_their_grid_point(offset: float) -> None:
    times = [STEP * i + offset for i in range(1, 6)]
    out = on_grid(times, [1.0, 2.0, 3.0, 4.0, 5.0], 0.0, STEP, 6)
    assert out[1:].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


# ---- defect: the update job misaligned a series shorter than its overlap -------------------------------------------


def test_an_update_of_a_fit_on_fewer_samples_than_the_overlap_keeps_the_series_on_its_times() -> None:
    """The update job re-reads the last ``UPDATE_OVERLAP_STEPS`` (3) steps of the series it knows. A fit on fewer
    samples (a new service with ``min_history_seconds`` at 0 or a step or two) took the fresh overlap from the start
    of the tail instead of its end: the samples were shifted by a step, one was counted twice, and the forecast was
    dated one step in the future (and updates then skipped a minute), until the next refit."""
    from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
    from autoscaler.fakes.metrics import FakeMetricsSource
    from autoscaler.forecasting import ForecastService
    from autoscaler.ports import Series
    from autoscaler.settings import ForecastSettings

    start = DAY0 + 9 * 3600

    def rate(t: float) -> float:
        return 10.0 + (t - start) / STEP  # 9, 10, 11... req/s: the sample's own step number

    def history(end: float) -> Series:
        times = np.arange(start - STEP, end + STEP / 2, STEP)
        return Series(tuple(float(t) for t in times), tuple(rate(t) for t in times))

    policy = ServicePolicy(
        "ml", "chat", metric=MetricKind.REQUEST_RATE, target=5.0,
        forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.9, None),
    )  # fmt: skip
    metrics = FakeMetricsSource()
    settings = ForecastSettings(
        model="last_value", workers=1, min_history_seconds=0, history_seconds=86_400.0, bootstrap_origins=0
    )
    service = ForecastService(settings, metrics, lambda: [policy], refit_interval_s=900.0)
    metrics.set_history(policy.key, "request_rate", history(start))
    assert service.refit(start).ok == ["ml/chat"]
    for now in (start + 5 * STEP, start + 6 * STEP):
        metrics.set_history(policy.key, "request_rate", history(now))
        assert service.update(now).ok == ["ml/chat"]
        state = service._state[policy.key]
        assert state.y is not None
        assert state.y.tolist() == [rate(start - STEP + i * STEP) for i in range(state.y.size)]
        assert state.y_start + state.y.size * STEP == now  # the last sample is the one at now
        forecast = service.published["ml/chat"].latest.forecast
        assert forecast.start == now  # the step right after the last sample, not one later
