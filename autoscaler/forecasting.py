"""Demand forecasts for the running controller: the refit job fits, the tick only reads.

``ForecastService.refit(now)`` is the leader-only scheduled job (every ``refit_interval_seconds``). For every managed
service whose ``spec.forecast.mode`` is shadow or active it

1. reads the request-rate history through the ``MetricsSource`` (``forecast.history_seconds`` at
   ``forecast.step_seconds``) and puts it on a regular grid (gaps are NaN; the forecasters fill them);
2. scores the forecasts it published earlier against the history that has arrived since (accountability, below);
3. fits the configured model (``forecast.model``; ``auto`` = per-series choice by a short rolling-origin backtest
   against seasonal naive, scored at the provisioned quantile, re-made every ``selection_interval_seconds``) and
   the seasonal-naive baseline, in parallel across series in a ``ProcessPoolExecutor`` of ``forecast.workers``
   processes (1 = in this process);
4. publishes the latest ``ForecastInput`` of every service as one immutable mapping, swapped in a single assignment:
   the tick, in another thread, reads whichever mapping is current and never waits for a refit.

Failures stay local. A history that cannot be read (Prometheus outage), is too short, or a fit that raises or runs out
of time (``fit_timeout_seconds``, enforced inside the worker process) leaves that service's previous fit published:
it ages and, after ``stale_after_periods`` refit intervals, the core falls back to reactive scaling with reason
``forecast_stale``. Each failure is counted (``gpu_autoscaler_forecast_fits_total{result}`` and
``gpu_autoscaler_errors_total{component="refit"}``); nothing is raised out of ``refit``.

Accountability. Every published forecast is kept until the values it predicted have arrived, then scored on the leads
the tick actually reads it at (from ``fitted_at + lead`` to ``fitted_at + refit interval + lead``): pinball loss at the
service's provisioned quantile and MAE of the median, next to the seasonal-naive forecast made from the same history at
the same time. Over the last ``accountability_window_seconds``, ``forecast.assess_reliability`` decides: a model whose
pinball loss is above ``reliability_max_ratio`` x the baseline's, or that has fewer than ``min_scored_samples``
scored values, is *unreliable* and the core scales the service reactively (reason ``forecast_unreliable``, with the
numbers). So that a restarted controller or a new service does not wait for live scores, the first fit of a service
also backtests the model against the baseline on its own history (``bootstrap_origins`` origins, more when the
provisioned quantile needs more scored values to be judged: 100 for a P99, see ``core.headroom.scores_needed``); that
verdict, and its coverage on the distinct values it scored, stand while there are too few live scores, for an
accountability window: older, the next refit backtests again. Until the first refit of this process and of each
leadership term has run (it just started, or took over: ``start_term``), a service without a usable forecast holds
(``ForecastReadConfig.headroom.hold_unfitted``, ``core.headroom.earned_headroom``): the previous leader's replicas
are neither scaled up for want of trust nor given back before the forecasts are fitted.

What a service's memory is of. The state kept per service (history, fit, forecasts waiting to be scored, scores,
verdict, coverage) is of one series at one quantile: ``ForecastService.series_of`` (the query the metrics source reads
the history with: a ``spec.queries.requestRate`` override, else the default) and ``spec.forecast.quantile``. A policy
re-created for the same Deployment with another override has another series under the same key: from the next tick
its old fit is withheld from the tick (``published``), and the next update or refit drops its state, so that it
starts learning again (bootstrap backtest included). A quantile change leaves the fit readable until the next refit
(a level inside the fit's is interpolated, but no headroom is earned on a coverage measured at another level:
``core.tick._earned``); that refit starts the service afresh at the new level. Bounds, target, metric and
``ratePerReplica`` change what the floor does with the forecast, not what it forecasts: the state is kept.

The tick side is the core's (``autoscaler.core.tick.read_forecasts``, called by ``decide_tick``; ``readout`` here
is the same for callers outside a tick): it turns the published fits into one ``ReplicaFloor`` per forecasting
service with ``autoscaler.core.predictive.forecast_floor`` at ``now + lead``, where the lead is the p95 of the
service's observed pod bind-to-ready times (else ``coldStartSeconds``), plus ``node_boot_seconds`` when the cluster's
free GPUs do not cover the floor's extra replicas. ``shadow`` floors are reported, not applied.

Timeouts: a fit in a worker process is interrupted by SIGALRM after ``fit_timeout_seconds``; a worker that does not
answer even then is killed with its pool (a new pool is started for the next round). With ``workers = 1`` fits run in
the controller process, where a fit cannot be interrupted: its timeout is not enforced.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib
import logging
import math
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.decide import ReplicaFloor
from autoscaler.core.headroom import DEFAULT_HEADROOM, calibrated_excess, judges_coverage, scores_needed
from autoscaler.core.model import Observation, ServicePolicy
from autoscaler.core.predictive import MEDIAN_LEVEL, ForecastInput
from autoscaler.core.tick import (
    ForecastReadConfig,
    PublishedForecast,
    ServiceForecastView,
    TickInput,
    read_forecasts,
)
from autoscaler.ports import MetricsSource
from autoscaler.telemetry import Telemetry
from forecast.registry import BAND_LEVELS
from forecast.types import Forecast, ForecastQuality, assess_reliability

if TYPE_CHECKING:
    from autoscaler.settings import ForecastSettings

log = logging.getLogger("autoscaler.forecasting")

SIGNAL = "request_rate"  # the demand signal forecast (requests/s, whole service)
BASELINE = "seasonal_naive"  # every model is judged against it (forecast.registry.BASELINE)
AUTO = "auto"
BASE_LEVELS = BAND_LEVELS  # always fitted beside the provisioned quantile: the median scores MAE
# Bootstrap backtest origins are spread over the latest day at most this far apart (different times of day).
BOOTSTRAP_SPACING_S = 6 * 3600.0
# A high quantile needs more scored values than ``bootstrap_origins`` give (a P99: 100); the bootstrap backtest takes
# as many origins as that needs, up to this many (each origin is one more fit of the model).
MAX_BOOTSTRAP_ORIGINS = 24
# A history whose newest valid sample is more than this many steps old is not fitted: the service's metric is gone.
MAX_HISTORY_LAG_STEPS = 5
# The parent waits this much beyond the fit timeout before it declares the workers stuck (worker start-up included).
STUCK_GRACE_S = 30.0
_LOGGED_FAILURES = 5  # per round, the rest are summarised


# ---- the worker side: one series' fit, picklable in and out ------------------------------------------------------


class FitTimeout(Exception):
    """Raised inside a worker process when a fit outlives ``fit_timeout_seconds``."""


@dataclass(frozen=True)
class FitJob:
    """Everything one series' fit needs, as plain picklable data."""

    key: str
    model: str  # registry name or module:Class
    params: Mapping[str, Any]
    y: np.ndarray  # regular series, NaN = missing; y[i] covers [start + i*step_s, start + (i+1)*step_s)
    start: float
    step_s: float
    horizon_steps: int
    levels: tuple[float, ...]
    quantile: float  # the provisioned level: backtest verdicts score it
    timeout_s: float
    candidates: tuple[str, ...] = ()  # non-empty: choose among these by backtest first (model = auto)
    backtest_origins: int = 0  # > 0: also backtest the model against the baseline (bootstrap trust)
    backtest_horizon_steps: int = 1
    max_ratio: float = 1.0
    min_samples: int = 30


@dataclass(frozen=True)
class FitResult:
    key: str
    status: Literal["ok", "failed", "timeout"]
    seconds: float
    model: str = ""  # the model fitted (for auto: the one chosen)
    selected: bool = False  # a selection was made this time
    forecast: Mapping[str, Any] | None = None  # Forecast.to_dict() (a Forecast holds a mappingproxy: not picklable)
    baseline: Mapping[str, Any] | None = None
    verdict: tuple[bool, str, float | None] | None = None  # backtest: reliable, reason, pinball ratio
    # backtest: share of actuals at or below the provisioned quantile (earns headroom until live scores do)
    coverage: float | None = None
    coverage_samples: int = 0  # backtest: the distinct values behind ``coverage``
    # backtest: the calibrated share of the quantile's excess over the median (``_backtest_share``; 1: the quantile)
    excess_share: float = 1.0
    # the fitted model and baseline themselves (pickled back from the worker): the update job re-conditions them
    fitted: tuple[Any, Any] | None = None
    error: str = ""


_IN_WORKER = False  # set by the pool initializer: only worker processes may use SIGALRM


def _init_worker() -> None:
    global _IN_WORKER
    _IN_WORKER = True
    # One BLAS/OpenMP thread per worker: the workers already use the cores, extra threads only contend.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    # Pay the imports once per worker, not in the first timed fit.
    for module in ("forecast.backtest", "forecast.baselines", "forecast.selection"):
        importlib.import_module(module)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """SIGALRM after ``seconds`` raises FitTimeout in the fit, in a worker process's main thread only (in the
    controller process the signal belongs to others, e.g. pytest-timeout, and the refit runs off the main thread)."""
    if not _IN_WORKER or threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise FitTimeout(f"fit did not finish within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def build_model(name: str, params: Mapping[str, Any], levels: Sequence[float], horizon_steps: int) -> Any:
    """A fresh forecaster: a ``forecast.registry`` name, or ``package.module:Class`` (a forecaster of your own with
    the same contract, importable in the worker processes)."""
    if ":" in name:
        module, _, cls_name = name.partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        return cls(**{"quantiles": tuple(levels), **params})
    from forecast.registry import make_model

    return make_model(name, horizon_steps=horizon_steps, **{"quantiles": tuple(levels), **params})


def _quality_at(result: Any, level: float) -> ForecastQuality:
    """A backtest's scores at one quantile level (the provisioned one), as the live accountability scores it."""
    from forecast.backtest import evaluate

    index = list(result.levels).index(level)
    return evaluate(result.model, result.actuals, result.predictions[index : index + 1], [level])


def _ratio(model: ForecastQuality, baseline: ForecastQuality) -> float | None:
    """Pinball loss / the baseline's; 1 when both are exact (as ``assess_reliability`` counts it), None when
    undefined (no values, or an exact baseline beside an inexact model)."""
    score, base = model.mean_pinball, baseline.mean_pinball
    if not (math.isfinite(score) and math.isfinite(base)):
        return None
    if base <= 0:
        return 1.0 if score <= 0 else None
    return score / base


def _origin_spacing(n: int, horizon: int, origins: int, step_s: float) -> int:
    span = n - horizon - n // 2  # origins lie after the first half of the series (the backtest's minimum training)
    if span < 0:
        raise ValueError(f"{n} samples are too few to backtest a {horizon}-step horizon")
    return max(1, min(round(BOOTSTRAP_SPACING_S / step_s), span // max(1, origins - 1)))


def _distinct_scored(result: Any, judged: Any) -> int:
    """The distinct time steps of ``judged`` (a mask over the backtest's actuals) a backtest scored: on a short
    history the origins' horizons overlap, and one actual scored by several origins is one value of evidence, not
    several."""
    scored: set[int] = set()
    for origin, row in zip(result.origins, judged, strict=True):
        scored.update(int(origin) + int(i) for i in np.flatnonzero(row))
    return len(scored)


def _judging(actuals: np.ndarray) -> np.ndarray:
    """``core.headroom.judges_coverage`` over a backtest's actuals (NaN: no)."""
    judged: np.ndarray = np.nan_to_num(actuals, nan=0.0) > 0.0
    return judged


def _backtest_coverage(result: Any, quantile: float) -> tuple[float | None, int]:
    """The share of the backtest's values at or below its ``quantile`` predictions, and the distinct values behind
    it, on the values that judge a coverage (demand above 0, ``core.headroom.judges_coverage``) as the live scores
    are judged: None and 0 when there are none."""
    actuals = np.asarray(result.actuals, dtype=float)
    uppers = np.asarray(result.predictions[list(result.levels).index(quantile)], dtype=float)
    judged = np.isfinite(actuals) & np.isfinite(uppers) & _judging(actuals)
    count = int(judged.sum())
    if count == 0:
        return None, 0
    coverage = float(np.mean(actuals[judged] <= uppers[judged]))
    return coverage, min(count, _distinct_scored(result, judged))


def _verdict(
    job: FitJob, model_bt: Any, base_bt: Any
) -> tuple[tuple[bool, str, float | None], float | None, int, float]:
    """(reliable, reason, pinball ratio), the coverage of the provisioned quantile, the distinct values behind it,
    and the calibrated share of the quantile's excess over the median (``_backtest_share``), from the backtests."""
    model_q, base_q = _quality_at(model_bt, job.quantile), _quality_at(base_bt, job.quantile)
    reliable, reason = assess_reliability(model_q, base_q, max_ratio=job.max_ratio, min_samples=job.min_samples)
    coverage, samples = _backtest_coverage(model_bt, job.quantile)
    share = _backtest_share(model_bt, job.quantile, samples, job.min_samples)
    return (reliable, f"backtest: {reason}", _ratio(model_q, base_q)), coverage, samples, share


def _backtest_share(result: Any, quantile: float, samples: int, min_samples: int) -> float:
    """``core.headroom.calibrated_excess`` on the backtest's scored values, as the live scores give it: what a
    restarted controller (or a new leader) provisions until its live scores can judge the quantile, as the backtest's
    coverage earns its headroom meanwhile. 1 when the backtest lacks the median or the level, or scored fewer
    distinct values than the quantile needs (``scores_needed``)."""
    levels = list(result.levels)
    if MEDIAN_LEVEL not in levels or quantile not in levels or samples < scores_needed(quantile, min_samples):
        return 1.0
    actuals = np.asarray(result.actuals, dtype=float).ravel()
    medians = np.asarray(result.predictions[levels.index(MEDIAN_LEVEL)], dtype=float).ravel()
    uppers = np.asarray(result.predictions[levels.index(quantile)], dtype=float).ravel()
    # the values the coverage is judged on (``_backtest_coverage``): an idle minute needed none of any excess
    scored = np.isfinite(actuals) & np.isfinite(medians) & np.isfinite(uppers) & _judging(actuals)
    triples = zip(actuals[scored].tolist(), medians[scored].tolist(), uppers[scored].tolist(), strict=True)
    return calibrated_excess(triples, quantile, min_samples)[0]


def _fit(job: FitJob) -> FitResult:
    from forecast.backtest import rolling_origin_backtest

    started = time.perf_counter()
    name, selected, verdict, coverage, samples, share = job.model, False, None, None, 0, 1.0
    h_bt = max(1, min(job.backtest_horizon_steps, job.horizon_steps))
    n_origins = max(1, job.backtest_origins)

    def candidate(model_name: str) -> Any:
        params = job.params if model_name == job.model else {}
        return build_model(model_name, params, job.levels, h_bt)

    if job.candidates:
        from forecast.selection import select_model

        names = dict.fromkeys((BASELINE, *job.candidates))
        try:
            every = _origin_spacing(job.y.size, h_bt, n_origins, job.step_s)
            selection = select_model(
                job.y,
                {n: candidate(n) for n in names},
                baseline=BASELINE,
                step_s=job.step_s,
                horizon_steps=h_bt,
                start=job.start,
                n_origins=n_origins,
                origin_every=every,
                max_ratio=job.max_ratio,
                min_samples=job.min_samples,
                # ranked where the verdict (``_verdict``) and the live scores judge the chosen model
                score_levels=(job.quantile,),
            )
        except ValueError:
            name = BASELINE  # too short to backtest: the baseline until a selection succeeds
        else:
            name, selected = selection.best, True
            verdict, coverage, samples, share = _verdict(
                job, selection.results[name], selection.results[BASELINE]
            )
    elif job.backtest_origins > 0:
        try:
            every = _origin_spacing(job.y.size, h_bt, n_origins, job.step_s)
            kw: dict[str, Any] = {
                "step_s": job.step_s,
                "horizon_steps": h_bt,
                "start": job.start,
                "n_origins": n_origins,
                "origin_every": every,
            }
            model_bt = rolling_origin_backtest(candidate(name), job.y, **kw)
            base_bt = model_bt if name == BASELINE else rolling_origin_backtest(candidate(BASELINE), job.y, **kw)
            verdict, coverage, samples, share = _verdict(job, model_bt, base_bt)
        except ValueError:
            verdict = None  # too short to backtest: trust has to come from live scores

    model = build_model(name, job.params if name == job.model else {}, job.levels, job.horizon_steps)
    forecast = model.fit(job.y, start=job.start, step_s=job.step_s).predict(job.horizon_steps)
    if name == BASELINE:
        baseline, base_model = forecast, model
    else:
        base_model = build_model(BASELINE, {}, job.levels, job.horizon_steps)
        baseline = base_model.fit(job.y, start=job.start, step_s=job.step_s).predict(job.horizon_steps)
    return FitResult(
        job.key,
        "ok",
        time.perf_counter() - started,
        model=name,
        selected=selected,
        forecast=forecast.to_dict(),
        baseline=baseline.to_dict(),
        verdict=verdict,
        coverage=coverage,
        coverage_samples=samples,
        excess_share=share,
        fitted=(model, base_model),
    )


def run_fit(job: FitJob) -> FitResult:
    """One series' selection/backtest (when due), fit and forecast, plus the baseline's. Never raises: a failure or
    a timeout is the result."""
    started = time.perf_counter()
    try:
        with _deadline(job.timeout_s):
            return _fit(job)
    except FitTimeout as exc:
        return FitResult(job.key, "timeout", time.perf_counter() - started, model=job.model, error=str(exc))
    except Exception as exc:  # a model's bug or numerical failure must stay this series' problem
        error = f"{type(exc).__name__}: {exc}"
        return FitResult(job.key, "failed", time.perf_counter() - started, model=job.model, error=error)


# ---- running fits: in process, or in a pool of worker processes ---------------------------------------------------


def _unreturned(job: FitJob, exc: BaseException) -> FitResult:
    """A fit whose future raised something else than a broken pool: the worker is alive, but the result did not
    come back (most often a fitted model that cannot be pickled: a forecaster of one's own holding a lock or a
    client). This series' failure, not a dead worker's: no quarantine, the pool is kept."""
    error = f"the fit's result could not be sent back from its worker process: {type(exc).__name__}: {exc}"
    log.error("forecast fit of %s: %s", job.key, error)
    return FitResult(job.key, "failed", 0.0, model=job.model, error=error)


class FitRunner:
    """Runs ``FitJob``s: in this process for 1 worker, else in a persistent ``ProcessPoolExecutor`` (spawned
    processes: forking a process with a scheduler, an HTTP server and API clients running in threads is unsafe).

    Jobs are submitted as the iterable yields them (histories are read while the workers fit). A worker that does
    not return within the fit timeout plus a grace period, even though the fit interrupts itself, is stuck: the pool is
    killed, the jobs left are reported as timed out, and the next round starts a new pool.

    A worker process that dies (an OOM kill, a crash in native code) breaks the whole pool, and every fit in flight
    with it; which series killed it cannot be told. Those series are fitted again one at a time, each alone in the
    pool, so only the one that kills its worker again fails; it is then fitted alone for ``QUARANTINE_ROUNDS``
    rounds, so that it cannot take the other services' fits down with it every round. A pool found broken when a
    round starts (a worker killed while idle) took no fit down: it is replaced. A fit whose result does not come
    back for another reason (a fitted model that cannot be pickled) is that series' failure; its worker lives on.
    """

    QUARANTINE_ROUNDS = 24  # rounds a series that killed its worker is fitted alone (6 h at the 15 min refit)

    def __init__(self, workers: int, fit_timeout_s: float, stuck_grace_s: float = STUCK_GRACE_S) -> None:
        self.workers = workers
        self.fit_timeout_s = fit_timeout_s
        self.stuck_grace_s = stuck_grace_s
        self._pool: cf.ProcessPoolExecutor | None = None
        self._quarantine: dict[str, int] = {}  # series key -> rounds left fitted alone

    def run(self, jobs: Iterable[FitJob]) -> list[FitResult]:
        if self.workers <= 1:
            return [run_fit(job) for job in jobs]
        alone: list[FitJob] = []

        def together() -> Iterator[FitJob]:
            for job in jobs:
                if self._quarantine.get(job.key, 0) > 0:
                    alone.append(job)
                else:
                    yield job

        results, orphaned = self._run_together(together())
        if orphaned:
            log.warning(
                "a forecast worker died; fitting the %d series it took down again, one at a time", len(orphaned)
            )
        served = {job.key for job in alone}
        died: set[str] = set()
        results += self._run_alone(alone + orphaned, died)
        for key in served - died:  # one more round fitted alone (one that killed its worker again starts over)
            left = self._quarantine[key] - 1
            if left > 0:
                self._quarantine[key] = left
            else:
                del self._quarantine[key]
        return results

    def forget(self, keep: Collection[str]) -> None:
        """Drop the quarantine of every series not in ``keep`` (a deleted policy, one that stopped forecasting): it
        is never fitted again, so its rounds would never run out."""
        for key in [k for k in self._quarantine if k not in keep]:
            del self._quarantine[key]

    def _run_together(self, jobs: Iterable[FitJob]) -> tuple[list[FitResult], list[FitJob]]:
        """The fits in parallel; also the jobs a dying worker took down (to be fitted again, alone)."""
        futures: dict[cf.Future[FitResult], FitJob] = {}
        results: list[FitResult] = []
        orphaned: list[FitJob] = []
        for job in jobs:
            if orphaned:  # the pool broke under this round's fits: the rest are fitted alone
                orphaned.append(job)
                continue
            try:
                # a pool that broke before this round (a worker killed while idle) is replaced: nothing of this
                # round's went down with it
                futures[self._submit(job, replace_broken=not futures)] = job
            except Exception:  # BrokenProcessPool: a worker died (OOM kill...) under this round's fits
                orphaned.append(job)
        pending = set(futures)
        while pending:
            done, pending = cf.wait(
                pending, timeout=self.fit_timeout_s + self.stuck_grace_s, return_when=cf.FIRST_COMPLETED
            )
            if not done:
                log.error("forecast workers stuck: no fit returned within %.0fs; killing the pool", self.fit_timeout_s)
                for future in pending:
                    job = futures[future]
                    message = "worker stuck: killed with its pool"
                    results.append(FitResult(job.key, "timeout", self.fit_timeout_s, model=job.model, error=message))
                self.close()
                return results, orphaned
            for future in done:
                job = futures[future]
                try:
                    results.append(future.result())
                except BrokenProcessPool:  # a worker process died: this fit went with the pool, whoever caused it
                    orphaned.append(job)
                except Exception as exc:  # e.g. a fitted model that cannot be pickled back: this series' failure
                    results.append(_unreturned(job, exc))
        if orphaned:
            self.close()
        return results, orphaned

    def _run_alone(self, jobs: Sequence[FitJob], died: set[str]) -> list[FitResult]:
        """Each fit alone in the pool: a worker that dies now died of this series (its key is added to ``died``)."""
        results: list[FitResult] = []
        for job in jobs:
            try:
                # alone: a pool already broken (a worker killed while idle) is no fault of this series
                future = self._submit(job, replace_broken=True)
            except Exception as exc:  # no worker could be started (fork/spawn failed...): fails alone, no quarantine
                error = f"no forecast worker could take this fit: {type(exc).__name__}: {exc}"
                results.append(FitResult(job.key, "failed", 0.0, model=job.model, error=error))
                self.close()
                continue
            try:
                results.append(future.result(timeout=self.fit_timeout_s + self.stuck_grace_s))
            except cf.TimeoutError:
                message = "worker stuck: killed with its pool"
                results.append(FitResult(job.key, "timeout", self.fit_timeout_s, model=job.model, error=message))
                self.close()
            except BrokenProcessPool as exc:  # this series killed its worker process
                self._quarantine[job.key] = self.QUARANTINE_ROUNDS
                died.add(job.key)
                error = (
                    f"the worker process died fitting this series ({type(exc).__name__}); it is fitted alone for "
                    f"the next {self.QUARANTINE_ROUNDS} rounds"
                )
                log.error("forecast fit of %s: %s", job.key, error)
                results.append(FitResult(job.key, "failed", 0.0, model=job.model, error=error))
                self.close()
            except Exception as exc:  # e.g. a fitted model that cannot be pickled back: its worker is fine
                results.append(_unreturned(job, exc))
        return results

    def _submit(self, job: FitJob, replace_broken: bool) -> cf.Future[FitResult]:
        """``job`` submitted to the pool. ``replace_broken``: a pool found broken at submission (none of the fits
        still to come in it can have broken it) is replaced by a new one first, once."""
        try:
            return self._ensure_pool().submit(run_fit, job)
        except BrokenProcessPool:
            if not replace_broken:
                raise
            log.warning("the forecast worker pool was broken (a worker died while idle); starting a new one")
            self.close()
            return self._ensure_pool().submit(run_fit, job)

    def _ensure_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
            )
        return self._pool

    def close(self) -> None:
        """Stop the workers now (running fits are abandoned)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        if terminate is not None:
            with contextlib.suppress(Exception):
                terminate()
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()
        for process in processes:
            with contextlib.suppress(Exception):
                process.join(timeout=5)


# ---- what the refit job publishes and the tick reads ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForecastReadout:
    """The tick's reading of the latest forecasts: floors for ``decide`` and what to report."""

    floors: Mapping[str, ReplicaFloor]
    views: Mapping[str, ServiceForecastView]


@dataclass(slots=True)
class UpdateReport:
    """One round of the update job."""

    time: float
    ok: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    no_data: dict[str, str] = field(default_factory=dict)
    skipped: bool = False  # a refit was running
    seconds: float = 0.0


# The update job re-reads this many steps before the end of the series it knows: samples that arrived late count.
UPDATE_OVERLAP_STEPS = 3


@dataclass(slots=True)
class RefitReport:
    """One refit round, for logs and tests."""

    time: float
    services: int = 0
    ok: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # key -> error (fit raised or timed out)
    no_data: dict[str, str] = field(default_factory=dict)  # key -> why (history unreadable, too short, too old)
    seconds: float = 0.0
    histories_read: int = 0  # services whose history was read (too short or not)


# ---- per-service memory of the refit job --------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    """A published forecast waiting for its actuals."""

    model: Forecast
    baseline: Forecast
    quantile: float
    first: float  # score steps starting at or after this (fitted_at + lead)
    until: float  # ... and before this (fitted_at + refit interval + lead)
    next_index: int = 0


@dataclass(frozen=True, slots=True)
class _Score:
    time: float  # when the actual arrived (sample time)
    actual: float
    model_q: float
    model_median: float
    base_q: float


@dataclass(slots=True)
class _ServiceState:
    pending: deque[_Pending] = field(default_factory=deque)
    scores: deque[_Score] = field(default_factory=deque)
    verdict: tuple[bool, str, float | None] | None = None  # from the bootstrap backtest / the selection
    verdict_coverage: float | None = None  # the backtest's coverage of the provisioned quantile
    verdict_samples: int = 0  # the distinct values the backtest scored
    verdict_share: float = 1.0  # the backtest's calibrated share of the quantile's excess (``_backtest_share``)
    # when the verdict was made: it speaks for ``accountability_window_seconds``, as a live score does
    verdict_at: float = -math.inf
    selected: str | None = None  # auto: the model chosen
    selected_at: float = -math.inf
    quantile: float | None = None  # the provisioned level the scores are for
    series: str | None = None  # what the history is a series of (``ForecastService.series_of``)
    baseline_label: str = BASELINE  # the baseline forecasts' own name, e.g. SeasonalNaive(1d)
    # the update job's material: the latest fit's model and baseline, and the series they were last conditioned on
    fitted: tuple[Any, Any] | None = None
    y: np.ndarray | None = None  # y[i] covers [y_start + i * step, y_start + (i + 1) * step)
    y_start: float = 0.0
    job_y: tuple[np.ndarray, float] | None = None  # the series of the fit in flight (becomes y when it succeeds)


def on_grid(times: Sequence[float], values: Sequence[float], start: float, step: float, n: int) -> np.ndarray:
    """``n`` values at ``start + i * step``: each sample at its nearest grid point (a later sample wins), NaN where
    there is none or it is not finite. A sample half-way between two grid points goes to the later one: always the
    same way (``np.rint`` rounds ties to even, which sent samples half a step off the grid two by two onto every
    other grid point, dropping half of them and leaving the others empty)."""
    out = np.full(n, np.nan)
    if not times:
        return out
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    index = np.floor((t - start) / step + 0.5).astype(np.int64)
    keep = (index >= 0) & (index < n) & np.isfinite(v)
    index, v = index[keep], v[keep]
    if index.size == 0:  # every sample off the grid or not finite
        return out
    last = np.append(index[1:] != index[:-1], True)  # times ascend: the last sample of each grid point
    out[index[last]] = v[last]
    return out


class ForecastService:
    """The refit job (``refit``) and the tick's reading of its output (``readout``). See the module docstring."""

    def __init__(
        self,
        settings: ForecastSettings,
        metrics: MetricsSource,
        policies: Callable[[], Iterable[ServicePolicy]],
        *,
        refit_interval_s: float,
        tick_interval_s: float = 15.0,
        telemetry: Telemetry | None = None,
        runner: FitRunner | None = None,
        update_interval_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self.update_interval_s = update_interval_s  # 0: no update job, a fit is read until the next refit
        self.metrics = metrics
        self.policies = policies
        self.refit_interval_s = refit_interval_s
        self.tick_interval_s = tick_interval_s
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.runner = runner if runner is not None else FitRunner(settings.workers, settings.fit_timeout_seconds)
        self._published: Mapping[str, PublishedForecast] = MappingProxyType({})  # the hand-off, one atomic swap
        self._state: dict[str, _ServiceState] = {}
        self._leads: dict[str, float] = {}  # latest lead time the tick used, per service (scores those leads)
        self._refit_lock = threading.Lock()
        self.last_refit: RefitReport | None = None
        # leadership terms started (start_term) and the term of the latest refit that began within one: until they
        # agree, services without a usable forecast hold (ForecastReadConfig.headroom.hold_unfitted)
        self._term = 0
        self._refitted_term = -1

    # -- the hand-off ------------------------------------------------------------------------------------------------

    @property
    def published(self) -> Mapping[str, PublishedForecast]:
        """The latest fits, one immutable mapping (replaced, never changed, by each refit and update), as the tick
        may read them: without the fit of a service whose series has changed since it was fitted (its policy
        re-created with another ``spec.queries.requestRate``, see ``series_of``). That fit forecast another quantity
        and its scores were of it: the service has no forecast, and earns nothing, until the next refit fits the
        series it has now (the refit, or the update job before it, also drops the service's state)."""
        published = self._published
        if not published or getattr(self.metrics, "history_query", None) is None:
            return published
        changed = {
            p.key
            for p in self.policies()
            if p.forecast is not None and p.key in published and published[p.key].series != self.series_of(p)
        }
        if not changed:
            return published
        return MappingProxyType({k: v for k, v in published.items() if k not in changed})

    def series_of(self, policy: ServicePolicy) -> str | None:
        """What a service's history is a series *of*: the query the metrics source reads it with
        (``history_query`` of the Prometheus adapter: ``spec.queries.requestRate`` when the policy overrides it,
        else the default request-rate query of the Deployment's pods). A service's state (history, fit, scores,
        coverage, verdict) is kept only while this and its quantile stay the same: a policy deleted and re-created
        with another override has another series under the same key, and starts learning again. What the floor
        does with the forecast (min/max replicas, target, metric, ratePerReplica) changes neither: the forecast is
        always of the request rate. None: the source cannot tell (every series is taken to be the same)."""
        describe = getattr(self.metrics, "history_query", None)
        if describe is None:
            return None
        try:
            return str(describe(policy, SIGNAL))
        except Exception as exc:  # a query that cannot be rendered: its history cannot be read either
            return f"unreadable: {type(exc).__name__}: {exc}"

    def close(self) -> None:
        self.runner.close()

    # -- the refit job -----------------------------------------------------------------------------------------------

    def refit(self, now: float) -> RefitReport:
        """One refit round at ``now`` (Unix seconds). Never raises; see the module docstring."""
        with self._refit_lock:
            term = self._term  # a refit that began before a new term does not end that term's hold
            started = time.perf_counter()
            report = RefitReport(now)
            completed = False
            try:
                self._refit(now, report)
                completed = True
            except Exception:  # a bug here must not kill the scheduler's job, nor unpublish anything
                log.exception("refit round failed")
                self.telemetry.error("refit")
            report.seconds = time.perf_counter() - started
            self.telemetry.forecast_refit_duration.set(report.seconds)
            self.last_refit = report
            if completed and (report.histories_read > 0 or report.services == 0):
                # The new term's hold ends once a round has read what there is to read: one whose every history
                # read failed (a long-term store down while the instant queries work) knows no more than none,
                # and would let the tick read an earned service as one without a forecast (a third more replicas).
                self._refitted_term = term
            failures = {**report.failed, **report.no_data}
            if failures:
                shown = "; ".join(f"{k}: {v}" for k, v in list(failures.items())[:_LOGGED_FAILURES])
                more = f" (and {len(failures) - _LOGGED_FAILURES} more)" if len(failures) > _LOGGED_FAILURES else ""
                log.warning(
                    "refit: %d of %d services kept their previous fit: %s%s",
                    len(failures),
                    report.services,
                    shown,
                    more,
                )
            log.info("refit: %d services fitted in %.1fs", len(report.ok), report.seconds)
            return report

    def _refit(self, now: float, report: RefitReport) -> None:
        s = self.settings
        wanted = {p.key: p for p in self.policies() if p.forecast is not None}
        report.services = len(wanted)
        # taken before any history is read: an override changed in between is then seen as a change by the next
        # tick (the fit is withheld), never a new series taken for the old one
        series = {key: self.series_of(policy) for key, policy in wanted.items()}
        before = self._published
        for key in list(self._state):
            policy = wanted.get(key)
            state = self._state[key]
            if policy is None or policy.forecast is None or policy.forecast.quantile != state.quantile:
                del self._state[key]  # gone, or scored at another quantile: start afresh
            elif state.series != series[key]:
                log.info("forecast of %s: its series changed (%s -> %s): afresh", key, state.series, series[key])
                del self._state[key]
        for key in list(self._leads):  # list(): one C-level copy, safe while the tick thread adds a key
            if key not in wanted:
                self._leads.pop(key, None)
        self.runner.forget(wanted)

        def jobs() -> Iterator[FitJob]:
            for key, policy in wanted.items():
                assert policy.forecast is not None
                state = self._state.setdefault(
                    key, _ServiceState(quantile=policy.forecast.quantile, series=series[key])
                )
                try:
                    job = self._prepare(now, policy, state, report)
                except Exception as exc:  # one service's bad history must not take the others' refit down
                    log.exception("refit of %s: preparing its fit failed", key)
                    report.failed[key] = f"prepare: {type(exc).__name__}: {exc}"
                    self.telemetry.forecast_fits.labels(result="failed").inc()
                    self.telemetry.error("refit")
                    continue
                if job is not None:
                    yield job

        results = {r.key: r for r in self.runner.run(jobs())}
        published: dict[str, PublishedForecast] = {}
        for key, policy in wanted.items():
            assert policy.forecast is not None
            state = self._state[key]
            # the fit published before is kept on a failure only while it is of the same series
            previous = before.get(key)
            if previous is not None and previous.series != series[key]:
                previous = None
            result = results.get(key)
            latest: ForecastInput | None = previous.latest if previous is not None else None
            model_name = previous.model if previous is not None else s.model
            quantile = previous.quantile if previous is not None else policy.forecast.quantile
            if result is not None:
                self.telemetry.forecast_fit_duration.observe(result.seconds)
                self.telemetry.forecast_fits.labels(result=result.status).inc()
                if result.status == "ok" and result.forecast is not None and result.baseline is not None:
                    report.ok.append(key)
                    if result.selected:
                        state.selected, state.selected_at = result.model, now
                    if result.verdict is not None:
                        state.verdict, state.verdict_coverage = result.verdict, result.coverage
                        state.verdict_samples, state.verdict_at = result.coverage_samples, now
                        state.verdict_share = result.excess_share
                    state.fitted = result.fitted
                    if state.job_y is not None:
                        state.y, state.y_start = state.job_y
                    forecast = Forecast.from_dict(result.forecast)
                    baseline = Forecast.from_dict(result.baseline)
                    state.baseline_label = baseline.model
                    quantile = policy.forecast.quantile
                    lead = self._leads.get(key, policy.cold_start_s)
                    state.pending.append(
                        _Pending(forecast, baseline, quantile, now + lead, now + self._used_for_s() + lead)
                    )
                    latest = ForecastInput(forecast, fitted_at=now)
                    model_name = f"{AUTO}: {result.model}" if s.model == AUTO else result.model
                else:
                    report.failed[key] = f"{result.status}: {result.error}"
                    self.telemetry.error("refit")
            if latest is None:
                continue
            reliable, detail, ratio, relative, scored, coverage = self._judge(
                state, quantile, latest.forecast.model, now
            )
            latest = replace(latest, reliable=reliable, reliability_detail=detail)
            published[key] = PublishedForecast(
                key,
                latest,
                model_name,
                quantile,
                ratio,
                relative,
                scored,
                coverage[0] if coverage is not None else None,
                coverage[1] if coverage is not None else 0,
                series[key],
                self._excess_share(state, quantile, now),
            )
        self._published = MappingProxyType(published)  # the hand-off: one atomic swap

    def _prepare(
        self,
        now: float,
        policy: ServicePolicy,
        state: _ServiceState,
        report: RefitReport,
    ) -> FitJob | None:
        """Read the history, score what has arrived, and build the fit job (None: nothing to fit this round)."""
        s = self.settings
        assert policy.forecast is not None
        key = policy.key
        step = s.step_seconds
        end = math.floor(now / step) * step
        n = max(2, int(s.history_seconds // step))
        grid_start = end - (n - 1) * step
        try:
            series = self.metrics.history(policy, SIGNAL, grid_start, end, step)
        except Exception as exc:  # an outage: keep the previous fit, it ages into forecast_stale
            report.no_data[key] = f"history unreadable: {type(exc).__name__}: {exc}"
            self.telemetry.forecast_fits.labels(result="no_data").inc()
            self.telemetry.error("refit")
            return None
        report.histories_read += 1
        values = on_grid(series.times, series.values, grid_start, step, n)
        self._score(state, values, grid_start, step, now)
        finite = np.flatnonzero(np.isfinite(values))
        why = None
        if finite.size * step < s.min_history_seconds or finite.size < 2:
            why = f"{finite.size * step:.0f}s of history, need {s.min_history_seconds:g}s"
        elif finite[-1] < n - 1 - MAX_HISTORY_LAG_STEPS:
            why = f"newest sample is {(n - 1 - finite[-1]) * step:.0f}s old"
        if why is not None:
            report.no_data[key] = why
            self.telemetry.forecast_fits.labels(result="no_data").inc()
            return None
        first = int(finite[0])
        y = values[first:].copy()
        state.job_y = (y, grid_start + first * step - step)
        quantile = policy.forecast.quantile
        levels = tuple(sorted({*BASE_LEVELS, quantile}))
        lead = self._leads.get(key, policy.cold_start_s)
        # the live values that judge the quantile's coverage (demand above 0: ``_judge``)
        live = len(self._coverage_scores(state, now))
        candidates: tuple[str, ...] = ()
        model = s.model
        if s.model == AUTO:
            if state.selected is None or now - state.selected_at >= s.selection_interval_seconds:
                candidates = tuple(s.auto_candidates)
                model = BASELINE
            else:
                model = state.selected
        # A bootstrap verdict speaks for the accountability window, as a live score does: one older than that (the
        # service's first fit, days ago) is backtested again when the live scores are too few to judge -- here one
        # that would expire before the next refit, so that the updates in between are not left without a verdict.
        lasts = self._verdict_fresh(state, now + self.refit_interval_s)
        # until the live scores can judge the quantile's coverage, the backtest speaks for it (``_judge``)
        needs_bootstrap = not candidates and not lasts and live < scores_needed(quantile, s.min_scored_samples)
        h_bt = max(1, math.ceil((self.refit_interval_s + lead) / step))
        horizon_steps = max(1, math.ceil(s.horizon_seconds / step))
        origins = s.bootstrap_origins
        if origins > 0:
            # enough scored values for the provisioned quantile's coverage to be judged (``scores_needed``), plus
            # one origin's worth for the gaps
            needed = scores_needed(quantile, s.min_scored_samples)
            origins = max(origins, min(MAX_BOOTSTRAP_ORIGINS, math.ceil(needed / min(h_bt, horizon_steps)) + 1))
        return FitJob(
            key=key,
            model=model,
            params=dict(s.model_params) if s.model != AUTO else {},
            y=y,
            start=grid_start + first * step - step,  # the sample at T measures the interval [T - step, T)
            step_s=step,
            horizon_steps=horizon_steps,
            levels=levels,
            quantile=quantile,
            timeout_s=s.fit_timeout_seconds,
            candidates=candidates,
            backtest_origins=origins if (candidates or needs_bootstrap) else 0,
            backtest_horizon_steps=h_bt,
            max_ratio=s.reliability_max_ratio,
            min_samples=s.min_scored_samples,
        )

    def _score(self, state: _ServiceState, values: np.ndarray, grid_start: float, step: float, now: float) -> None:
        """Score the steps of earlier forecasts whose actuals are now in the history."""
        n = values.size
        last_time = grid_start + (n - 1) * step
        kept: deque[_Pending] = deque()
        for p in state.pending:
            f = p.model
            while p.next_index < len(f):
                s0 = f.start + p.next_index * f.step_s
                if s0 >= p.until:
                    p.next_index = len(f)
                    break
                sample_time = s0 + f.step_s  # the sample that measures the step's interval
                if sample_time > last_time + 1e-6:
                    break
                p.next_index += 1
                if s0 < p.first - 1e-6:
                    continue
                index = round((sample_time - grid_start) / step)
                actual = float(values[index]) if 0 <= index < n else math.nan
                if not math.isfinite(actual):
                    continue  # a missing scrape is no evidence either way
                try:
                    score = _Score(
                        sample_time,
                        actual,
                        f.at(s0, p.quantile),
                        f.at(s0, 0.5),
                        p.baseline.at(s0, p.quantile),
                    )
                except ValueError:  # a forecaster of one's own without the provisioned level
                    p.next_index = len(f)
                    break
                state.scores.append(score)
            if p.next_index < len(f):
                kept.append(p)
        state.pending = kept
        horizon_start = now - self.settings.accountability_window_seconds
        while state.scores and state.scores[0].time < horizon_start:
            state.scores.popleft()

    def _judge(
        self, state: _ServiceState, quantile: float, label: str, now: float
    ) -> tuple[bool, str, float | None, float | None, int, tuple[float, int] | None]:
        """reliable, reason, pinball ratio, relative MAE, live values scored, and (coverage of the provisioned
        quantile, values behind it). Until there are enough live scores the bootstrap backtest speaks, for an
        accountability window after it was made: its verdict, and its coverage with the distinct values it scored, so
        a restarted controller need not earn its headroom again from nothing. Older, it says nothing (the next refit
        backtests again): the live path judges the few scores there are (unreliable below ``min_scored_samples``)."""
        s = self.settings
        scores = self._window_scores(state, now)
        relative = None
        if scores:
            mean_actual = sum(sc.actual for sc in scores) / len(scores)
            mae = sum(abs(sc.actual - sc.model_median) for sc in scores) / len(scores)
            relative = mae / mean_actual if mean_actual > 0 else None
        fresh = self._verdict_fresh(state, now)
        backtest = (
            (state.verdict_coverage, state.verdict_samples) if fresh and state.verdict_coverage is not None else None
        )
        if len(scores) < s.min_scored_samples and fresh:
            assert state.verdict is not None
            reliable, reason, ratio = state.verdict
            return reliable, reason, ratio, relative, len(scores), backtest
        actuals = [sc.actual for sc in scores]
        model_q = ForecastQuality.from_observations(label, actuals, {quantile: [sc.model_q for sc in scores]})
        base_q = ForecastQuality.from_observations(
            state.baseline_label, actuals, {quantile: [sc.base_q for sc in scores]}
        )
        reliable, reason = assess_reliability(
            model_q, base_q, max_ratio=s.reliability_max_ratio, min_samples=s.min_scored_samples
        )
        judged = [sc for sc in scores if judges_coverage(sc.actual)]  # an idle minute is covered by any forecast
        coverage = (sum(1 for sc in judged if sc.actual <= sc.model_q) / len(judged), len(judged)) if judged else None
        if backtest is not None and len(judged) < scores_needed(quantile, s.min_scored_samples):
            # Too few live values to judge this quantile's coverage (100 for a P99): the backtest's still speaks, as
            # it did before the live scores reached min_scored_samples -- else a restarted P99 service swung from
            # earned to learning half an hour after the restart and back an hour later.
            coverage = backtest
        return reliable, f"live: {reason}", _ratio(model_q, base_q), relative, len(scores), coverage

    def _excess_share(self, state: _ServiceState, quantile: float, now: float) -> float:
        """The share of the provisioned quantile's excess over the median the floor needs, measured on the live
        scores of the accountability window (``core.headroom.calibrated_excess``). Until they are enough to judge the
        quantile, the bootstrap backtest's share while its verdict speaks (as its coverage does in ``_judge``: a
        restarted controller keeps the earned headroom and the calibrated floor alike), else 1."""
        s = self.settings
        # as the coverage: an idle minute needed none of any excess
        scores = [(sc.actual, sc.model_median, sc.model_q) for sc in self._coverage_scores(state, now)]
        if (
            len(scores) < scores_needed(quantile, s.min_scored_samples)
            and self._verdict_fresh(state, now)
            and state.verdict_coverage is not None
        ):
            return state.verdict_share
        return calibrated_excess(scores, quantile, s.min_scored_samples)[0]

    def _window_scores(self, state: _ServiceState, now: float) -> list[_Score]:
        """The live scores of the accountability window (by sample time, its edge included): what the verdict, the
        coverage and the calibrated share are all judged on."""
        since = now - self.settings.accountability_window_seconds
        return [sc for sc in state.scores if sc.time >= since]

    def _coverage_scores(self, state: _ServiceState, now: float) -> list[_Score]:
        """The window's scores that judge the quantile's coverage and calibrated excess (demand above 0,
        ``core.headroom.judges_coverage``): any forecast covers an idle minute."""
        return [sc for sc in self._window_scores(state, now) if judges_coverage(sc.actual)]

    def _verdict_fresh(self, state: _ServiceState, now: float) -> bool:
        """Whether the backtest's verdict still speaks: made within the accountability window."""
        return state.verdict is not None and now - state.verdict_at <= self.settings.accountability_window_seconds

    def _used_for_s(self) -> float:
        """How long the tick reads one published forecast: until the next update, else the next refit."""
        if 0 < self.update_interval_s < self.refit_interval_s:
            return self.update_interval_s
        return self.refit_interval_s

    # -- the update job ----------------------------------------------------------------------------------------------

    def update(self, now: float) -> UpdateReport:
        """Re-condition every service's latest fit on the history that arrived since (``model.update``: parameters
        fixed, the cheap step the simulator takes between refits too), score, judge and publish. Reads only the new
        tail of the history. Skipped while a refit runs (that refit publishes fresher fits anyway). Never raises; a
        service whose tail cannot be read or whose update fails keeps its published forecast; one whose series has
        changed (``series_of``) loses its forecast and its state until the next refit."""
        report = UpdateReport(now)
        if not self._refit_lock.acquire(blocking=False):
            report.skipped = True
            return report
        started = time.perf_counter()
        try:
            self._update(now, report)
        except Exception:  # a bug here must not kill the scheduler's job, nor unpublish anything
            log.exception("forecast update failed")
            self.telemetry.error("refit")
        finally:
            self._refit_lock.release()
        report.seconds = time.perf_counter() - started
        for result, keys in (("ok", report.ok), ("failed", report.failed), ("no_data", report.no_data)):
            if keys:
                self.telemetry.forecast_updates.labels(result=result).inc(len(keys))
        if report.failed or report.no_data:
            log.warning("forecast update: %s", {**report.failed, **report.no_data})
        return report

    def _update(self, now: float, report: UpdateReport) -> None:
        s = self.settings
        step = s.step_seconds
        horizon = max(1, math.ceil(s.horizon_seconds / step))
        keep = max(2, int(s.history_seconds // step))
        published = dict(self._published)
        for policy in self.policies():
            key = policy.key
            state = self._state.get(key)
            if policy.forecast is not None and state is not None and state.series != self.series_of(policy):
                # another series under this key (a policy re-created with another query): its fit, history and
                # scores are of the old one; the next refit starts it afresh
                log.info("forecast of %s: its series changed: dropped until the next refit", key)
                del self._state[key]
                published.pop(key, None)
                continue
            previous = published.get(key)
            if policy.forecast is None or state is None or state.fitted is None or state.y is None or previous is None:
                continue
            if policy.forecast.quantile != state.quantile:
                continue  # the next refit starts this service afresh at its new level
            end = math.floor(now / step) * step
            # The sample at T measures [T - step, T): the series' last interval ends at its last sample's time.
            last_sample = state.y_start + state.y.size * step
            if end <= last_sample:
                continue
            tail_start = last_sample - UPDATE_OVERLAP_STEPS * step  # late samples of the last minutes count too
            if end - tail_start > keep * step:
                # the series it knew ended more than a training window ago (this replica took the Lease back after
                # days): reading all that is the refit's job, and its fit replaces this one anyway
                report.no_data[key] = (
                    f"its history ends {end - last_sample:.0f}s ago, more than the {keep * step:.0f}s training "
                    "window: left to the next refit"
                )
                continue
            n = round((end - tail_start) / step) + 1
            try:
                series = self.metrics.history(policy, SIGNAL, tail_start, end, step)
            except Exception as exc:  # an outage: the published forecast ages as it would without updates
                report.no_data[key] = f"history unreadable: {type(exc).__name__}: {exc}"
                continue
            tail = on_grid(series.times, series.values, tail_start, step, n)
            self._score(state, tail, tail_start, step, now)
            # Overlap: a fresh sample replaces the old value; the rest is appended, the oldest dropped.
            # tail[UPDATE_OVERLAP_STEPS] is the sample of y[-1]: the overlap is the samples of y that end there
            # (fewer than UPDATE_OVERLAP_STEPS when the series is shorter: taken from the start of the tail, they
            # shifted the series by a step and dated its forecast a step late).
            overlap = min(UPDATE_OVERLAP_STEPS, state.y.size)
            old_tail = state.y[state.y.size - overlap :]
            fresh = tail[UPDATE_OVERLAP_STEPS + 1 - overlap : UPDATE_OVERLAP_STEPS + 1]
            merged_overlap = np.where(np.isfinite(fresh), fresh, old_tail) if overlap else old_tail
            y = np.concatenate([state.y[: state.y.size - overlap], merged_overlap, tail[UPDATE_OVERLAP_STEPS + 1 :]])
            y_start = state.y_start
            if y.size > keep:
                y_start += (y.size - keep) * step
                y = y[y.size - keep :]
            if not np.isfinite(y[-MAX_HISTORY_LAG_STEPS - 1 :]).any():
                report.no_data[key] = f"no sample in the last {(MAX_HISTORY_LAG_STEPS + 1) * step:.0f}s"
                continue
            # A gap the window's start has moved into: the series starts at its first valid sample, as the refit's
            # does (``_prepare``); held backwards over the gap by the forecaster, it was demand nobody measured.
            first = int(np.flatnonzero(np.isfinite(y))[0])
            if first:
                y, y_start = y[first:], y_start + first * step
            model, baseline = state.fitted
            try:
                forecast = model.update(y, start=y_start).predict(horizon)
                base = baseline.update(y, start=y_start).predict(horizon) if baseline is not model else forecast
            except Exception as exc:  # a forecaster of one's own may raise anything
                report.failed[key] = f"{type(exc).__name__}: {exc}"
                continue
            state.y, state.y_start = y, y_start
            quantile = policy.forecast.quantile
            lead = self._leads.get(key, policy.cold_start_s)
            state.pending.append(_Pending(forecast, base, quantile, now + lead, now + self._used_for_s() + lead))
            # re-conditioned now, but its parameters are as old as the last refit: a refit that keeps failing lets
            # the fit go stale after stale_after_periods, updates or not
            latest = ForecastInput(forecast, fitted_at=now, refitted_at=previous.latest.refit_time)
            reliable, detail, ratio, relative, scored, coverage = self._judge(state, quantile, forecast.model, now)
            latest = replace(latest, reliable=reliable, reliability_detail=detail)
            published[key] = replace(
                previous,
                latest=latest,
                quantile=quantile,
                pinball_ratio=ratio,
                relative_error=relative,
                scored=scored,
                coverage=coverage[0] if coverage is not None else None,
                coverage_samples=coverage[1] if coverage is not None else 0,
                excess_share=self._excess_share(state, quantile, now),
            )
            report.ok.append(key)
        self._published = MappingProxyType(published)  # the hand-off: one atomic swap

    # -- the tick side -----------------------------------------------------------------------------------------------

    def read_config(self) -> ForecastReadConfig:
        """How the tick reads these forecasts (``core.tick.read_forecasts``)."""
        s = self.settings
        return ForecastReadConfig(
            refit_period_s=self.refit_interval_s,
            max_fit_age_periods=s.stale_after_periods,
            node_boot_s=s.node_boot_seconds,
            tick_interval_s=self.tick_interval_s,
            contended_hold_s=s.contended_hold_seconds,
            scale_down_hold_leads=s.scale_down_hold_leads,
            calibrated_excess=s.calibrated_excess,
            # a forecast is LEARNING until it has as many scores as the reliability verdict needs; the window holds
            # one live score per forecast step at most; until the first refit of this leadership term, nothing is judged
            headroom=replace(
                DEFAULT_HEADROOM,
                min_scored=s.min_scored_samples,
                hold_unfitted=self._refitted_term != self._term,
                max_scored=int(s.accountability_window_seconds // s.step_seconds) + 1,
            ),
        )

    def start_term(self) -> None:
        """A new leadership term (the controller calls it as the term's first tick starts): the fits may have gone
        stale while another replica led, and that first tick always runs before the term's first refit, so until
        that refit a service without a usable forecast holds, as in a process that has not refitted yet. A service
        whose fit is still fresh reads it as before."""
        self._term += 1

    def record_leads(self, views: Mapping[str, ServiceForecastView]) -> None:
        """The leads the tick read each forecast at: the refit scores later forecasts on those leads."""
        for key, view in views.items():
            if view.published is not None:
                self._leads[key] = view.lead_s

    def readout(
        self,
        now: float,
        policies: Mapping[str, ServicePolicy],
        snapshot: ClusterSnapshot,
        observation: Observation,
    ) -> ForecastReadout:
        """A floor per forecasting service from the latest published fits, as the tick reads them
        (``core.tick.read_forecasts``). Reads only: no fitting, no I/O."""
        tick = TickInput(now, observation, snapshot, policies, self.published)
        views = read_forecasts(tick, self.read_config())
        self.record_leads(views)
        floors = {k: v.floor for k, v in views.items() if v.floor is not None}
        return ForecastReadout(MappingProxyType(floors), MappingProxyType(views))
