"""The ``predictive`` policy in the simulator: the controller's tick (``core.tick.decide_tick``) with forecasts.

It follows the controller's split: a *refit* job (here every ``refitSeconds`` of simulated time) fits the service's
forecaster on the request-rate history it has observed (``historySeconds``, at ``resolutionSeconds``), a cheap
*update* (every ``updateSeconds``) conditions that fit on the newest data with its parameters fixed, and every tick
only reads the latest published forecast, as the controller's tick does (``core.tick.read_forecasts``: the lead time
includes node boot when free GPUs are short, demand becomes replicas by ``core.predictive.rate_per_replica``). The
forecaster learns online from the first step: at the start it has no history and the service scales reactively, as
a new service would.

Accountability, as the controller's: each tick's forecast for now + lead is scored against the demand that then
arrives, beside the seasonal-naive baseline fitted on the same history at the same times; over the last
``accountabilitySeconds`` a forecast whose pinball loss is above ``reliabilityMaxRatio`` x the baseline's, or that
has fewer than ``minScoredSamples`` scored values, is published as unreliable and the tick scales the service
reactively (``forecast_unreliable``). Unlike the controller, the simulator does not bootstrap the verdict with a
backtest: a new service earns trust from live scores only.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import math
import multiprocessing
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.core.arbitrate import EXPECTED_LEVEL, CapacityConfig
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.headroom import DEFAULT_HEADROOM, calibrated_share, excess_ratio, judges_coverage
from autoscaler.core.model import ForecastMode, ForecastPolicy, Observation, Plan, ServicePolicy
from autoscaler.core.predictive import MEDIAN_LEVEL, ForecastInput
from autoscaler.core.tick import ForecastReadConfig, PublishedForecast, TickConfig
from autoscaler.sim.policies import CorePolicy, SimService, metrics_delay_steps
from forecast.types import Forecast, ForecastQuality, assess_reliability, pinball_loss


@dataclass(frozen=True)
class ForecastingConfig:
    model: str = "phase_naive"  # a forecast.registry name (`autoscaler backtest --help`); the controller's default
    refit_s: float = 3600.0  # full refit period, seconds
    update_s: float = 300.0  # conditioning on new data with fitted parameters, seconds
    history_s: float = 7 * 86400.0  # training window, seconds
    resolution_s: float = 60.0  # forecast step, seconds
    horizon_s: float = 1800.0  # forecast horizon, seconds (must exceed update period + lead time)
    min_history_s: float = 1800.0  # no forecast before this much history, seconds
    model_params: dict[str, Any] = field(default_factory=dict)
    reliability_max_ratio: float = 1.0  # unreliable above this pinball ratio to the seasonal-naive baseline
    min_scored_samples: int = 30  # scored values needed before a forecast is trusted
    accountability_s: float = 21_600.0  # forecast error is judged on values that arrived in this window, seconds
    # while lower-priority GPU work waits, a scale-down keeps what the forecast needs this far past the lead time
    # (the controller's forecast.contended_hold_seconds), seconds
    contended_hold_s: float = 1800.0
    # a scale-down keeps what the forecast needs from now to now + this many lead times (the controller's
    # forecast.scale_down_hold_leads), lead times
    scale_down_hold_leads: float = 2.0
    # the floor provisions the quantile's calibrated share of its excess over the median (the controller's
    # forecast.calibrated_excess; False: the quantile as fitted)
    calibrated_excess: bool = True


@dataclass
class _ServiceForecasting:
    estimator: Any = None
    baseline: Any = None  # the seasonal-naive forecaster the model is judged against
    latest: ForecastInput | None = None
    baseline_forecast: Forecast | None = None
    last_refit: float = -math.inf
    last_update: float = -math.inf
    # mean observed request rate per resolution bucket: history[:history_len] of a buffer that grows by doubling and
    # drops what is older than the training window when full, so a tick's window is a view, never a list conversion
    history: np.ndarray = field(default_factory=lambda: np.empty(256, dtype=np.float64))
    history_len: int = 0
    bucket_sum: float = 0.0
    bucket_count: int = 0  # ticks in the bucket being filled
    bucket_seen: int = 0  # ... of which had a rate (the others are gaps)
    # (target time, model's prediction, baseline's prediction) at the provisioned quantile, and the model's median
    pending_scores: deque[tuple[float, float, float, float]] = field(default_factory=deque)
    # (time, excess ratio) of the values scored in the accountability window, and the same ratios kept sorted: what
    # the quantile's calibrated share of its excess is read from (``core.headroom.calibrated_share``)
    calibration: deque[tuple[float, float]] = field(default_factory=deque)
    calibration_sorted: list[float] = field(default_factory=list)
    excess_share: float = 1.0
    # (time, model's pinball loss, baseline's, |error|, covered, judges the coverage) of the values scored in the
    # accountability window, with their running sums (n, model pinball, baseline pinball, |error|, covered, judged):
    # the verdict costs O(1)
    scores: deque[tuple[float, float, float, float, int, int]] = field(default_factory=deque)
    sums: list[float] = field(default_factory=lambda: [0.0] * 6)
    reliable: bool = False
    reliability_detail: str = "no scored forecasts yet"
    # the verdict's coverage of the provisioned quantile and the values behind it, as of the latest judgement
    coverage: float | None = None
    scored: int = 0  # live values scored (the verdict's)
    coverage_samples: int = 0  # ... of which judge the coverage (demand above 0)
    # what the tick reads, rebuilt only when the refit step publishes (as the controller's hand-off is)
    published: PublishedForecast | None = None
    published_from: ForecastInput | None = None


class PredictivePolicy(CorePolicy):
    def __init__(
        self,
        config: ForecastingConfig | None = None,
        node_boot_s: float = 0.0,
        metrics_delay_s: float = 0.0,
        capacity: CapacityConfig | None = None,
        name: str = "predictive",
        scheduler_preemption: bool = True,
        forecast_workers: int = 0,
    ) -> None:
        super().__init__(name, capacity)
        if forecast_workers < 0:
            raise ValueError("forecast_workers must be >= 0")
        # Worker processes that compute the forecasts ahead of the run (0: in this process). The demand a service's
        # forecaster sees does not depend on the policy's decisions, so its refits, updates and predictions can be
        # computed beside the run; the figures are the same to the last digit either way.
        self.forecast_workers = forecast_workers
        self._pipeline: ForecastPipeline | None = None
        if capacity is None:
            self.scheduler_preemption = scheduler_preemption
        self.config = config or ForecastingConfig()
        self.node_boot_s = node_boot_s
        # The request rate a tick sees is this old; the history is time-stamped with when the demand happened, as
        # Prometheus samples are, so that the forecaster learns the true phase of the demand's changes.
        # Dated by the engine's delay (whole steps, rounded up: ``metrics_delay_steps``; the property below) once the
        # step is known: with 30 s at 60 s steps the demand seen is a whole step old, and stamped 30 s old the
        # history and the scores were half a step off.
        self.metrics_delay_setting_s = metrics_delay_s
        self.errors: list[float] = []
        self.pinball: list[float] = []
        self.fit_failures = 0

    @property
    def metrics_delay_s(self) -> float:
        """How old the demand a tick sees is, seconds: the engine's whole steps (once the step is known)."""
        step_s = getattr(self, "step_s", None)
        if not step_s:
            return self.metrics_delay_setting_s
        return float(metrics_delay_steps(self.metrics_delay_setting_s, step_s) * step_s)

    def policy_for(self, service: SimService) -> ServicePolicy:
        forecast = service.policy.forecast
        if forecast is None:
            forecast = ForecastPolicy(ForecastMode.ACTIVE, service.forecast_quantile)
        elif forecast.mode is not ForecastMode.ACTIVE:  # a shadow spec, made active: its own ratePerReplica and ratio
            forecast = dataclasses.replace(forecast, mode=ForecastMode.ACTIVE)
        return dataclasses.replace(service.policy, forecast=forecast)

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        initial = super().reset(services, step_s)
        self.per_service = [_ServiceForecasting() for _ in services]
        self.quantiles = [self.policies[s.policy.key].forecast.quantile for s in services]  # type: ignore[union-attr]
        self.tick_config = TickConfig(
            ForecastReadConfig(
                refit_period_s=self.config.refit_s,
                max_fit_age_periods=3.0,
                node_boot_s=self.node_boot_s,
                tick_interval_s=step_s,
                contended_hold_s=self.config.contended_hold_s,
                calibrated_excess=self.config.calibrated_excess,
                scale_down_hold_leads=self.config.scale_down_hold_leads,
                # a forecast is LEARNING until it has as many scores as the reliability verdict needs
                headroom=dataclasses.replace(DEFAULT_HEADROOM, min_scored=self.config.min_scored_samples),
            ),
            capacity=self.capacity,
        )
        self.bucket_steps = max(1, round(self.config.resolution_s / step_s))
        self.errors, self.pinball, self.fit_failures = [], [], 0
        self.end()
        return initial

    def begin(self, seen_rates: Sequence[np.ndarray], start: float, steps: int) -> None:
        """The engine's hook before the first step: ``seen_rates[s][i]`` is the request rate service ``s``'s
        observation carries at step ``i`` (decided at ``start + (i + 1) * step_s``). With ``forecast_workers``, the
        forecasts of the whole run are computed from them in worker processes while the run goes on."""
        self.end()
        # a daemonic process (a multiprocessing pool's worker) may not start processes: the same run, in-process
        # Forecasts that learn from the finished requests depend on the run's own replicas: computed in the run
        learns_in_run = any(s.forecast_learns_finished for s in self.services)
        if (
            self.forecast_workers > 0
            and self.services
            and not learns_in_run
            and not multiprocessing.current_process().daemon
        ):
            self._pipeline = ForecastPipeline(self, seen_rates, start, steps, self.forecast_workers)

    def end(self) -> None:
        """The engine's hook after the last step: stop the forecasting workers, if any."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    def forecasts(self, step: int, now: float, observation: Observation) -> dict[str, PublishedForecast]:
        published = {}
        for index, service in enumerate(self.services):
            key = service.policy.key
            state = self.per_service[index]
            seen = observation.services.get(key)
            if seen is not None:
                self._observe(state, now, seen.request_rate, self.quantiles[index])
            if self._pipeline is not None:
                self._take_computed(step, index, state, now)
            else:
                self._maybe_refit(index, state, now)
            if state.latest is not None:
                if state.published_from is not state.latest:
                    latest = dataclasses.replace(
                        state.latest, reliable=state.reliable, reliability_detail=state.reliability_detail
                    )
                    state.published = PublishedForecast(
                        key, latest, self.config.model, self.quantiles[index], scored=state.scored,
                        coverage=state.coverage, coverage_samples=state.coverage_samples,
                        excess_share=state.excess_share,
                    )
                    state.published_from = state.latest
                assert state.published is not None
                published[key] = state.published
        return published

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        plan = super().plan(step, now, observation, snapshot)
        for index, service in enumerate(self.services):
            view = plan.forecasts.get(service.policy.key)
            state = self.per_service[index]
            if view is None or view.floor is None or state.latest is None:
                continue
            # Every tick's forecast at now + lead is scored, used or not: that is how it earns trust.
            target = now + view.lead_s
            try:
                predicted = state.latest.forecast.at(target, self.quantiles[index])
                median = state.latest.forecast.at(target, MEDIAN_LEVEL)
                baseline = state.baseline_forecast
                base = baseline.at(target, self.quantiles[index]) if baseline is not None else math.nan
            except ValueError:
                continue
            _expect(state.pending_scores, (target, predicted, base, median))
        return plan

    def _bucket_s(self) -> float:
        """Seconds of demand one history bucket (one forecast step) holds: ``bucket_steps`` whole ticks, which is
        ``resolution_s`` only when that is a multiple of the tick. Stamped ``resolution_s`` apart, buckets of another
        length would put the demand at the wrong times (25 s ticks: 50 s of demand per "60 s" step)."""
        return self.bucket_steps * self.step_s

    def _observe(self, state: _ServiceForecasting, now: float, rate: float | None, quantile: float) -> None:
        # A tick without a rate still takes its place in the bucket: a bucket with none is a gap (NaN) the
        # forecaster's gap filling handles at the next fit. Skipped, the history before it would be stamped later
        # than its demand happened by the gap's length.
        if rate is not None and math.isfinite(rate):
            state.bucket_sum += rate
            state.bucket_seen += 1
        else:
            rate = None
        state.bucket_count += 1
        if state.bucket_count == self.bucket_steps:
            keep = int(self.config.history_s / self._bucket_s())
            _append(state, state.bucket_sum / state.bucket_seen if state.bucket_seen else math.nan, keep)
            state.bucket_sum, state.bucket_count, state.bucket_seen = 0.0, 0, 0
        if rate is None:
            return  # no evidence either way for the forecasts waiting to be scored
        # Score forecasts whose target's step has been seen, against the demand observed for that step: the seen
        # step ends at now - delay, and a forecast for T (the step starting at T) is scored once T is before that end
        # (``<=`` scored a forecast for T against the step ending at T, one step early: review 40).
        while state.pending_scores and state.pending_scores[0][0] < now - self.metrics_delay_s:
            target, predicted, base, median = state.pending_scores.popleft()
            error = abs(rate - predicted)
            loss = pinball_loss(rate, predicted, quantile)
            self.errors.append(error)
            self.pinball.append(loss)
            if math.isfinite(base):
                # the scores the coverage is judged on are those the calibrated share is (the controller's one
                # window, ``_window_scores``): a forecast without a baseline to judge it against earns neither, and
                # an idle minute (no demand: covered by any forecast) counts for the verdict only
                judged = judges_coverage(rate)
                if judged:
                    ratio = excess_ratio(rate, median, predicted)
                    state.calibration.append((target, ratio))
                    bisect.insort(state.calibration_sorted, ratio)
                covered = int(judged and rate <= predicted)
                entry = (target, loss, pinball_loss(rate, base, quantile), error, covered, int(judged))
                state.scores.append(entry)
                _add(state.sums, entry, 1.0)

    def _judge(self, state: _ServiceForecasting, quantile: float, now: float) -> None:
        """The controller's verdict (``forecast.assess_reliability``) on the last accountability window."""
        from forecast.registry import BASELINE

        config = self.config
        while state.scores and state.scores[0][0] < now - config.accountability_s:
            _add(state.sums, state.scores.popleft(), -1.0)
        count = len(state.scores)
        n = max(count, 1)
        model_sum, base_sum, error_sum, covered, judged_sum = state.sums[1:]
        judged = round(judged_sum)  # the values that judge the coverage (demand above 0)
        levels = (quantile, quantile)
        coverage = covered / judged if judged else math.nan
        model = ForecastQuality(config.model, count, error_sum / n, {quantile: model_sum / n}, math.nan, coverage,
                                levels)
        base = ForecastQuality(BASELINE, count, math.nan, {quantile: base_sum / n}, math.nan, math.nan, levels)
        state.reliable, detail = assess_reliability(
            model, base, max_ratio=config.reliability_max_ratio, min_samples=config.min_scored_samples
        )
        state.reliability_detail = f"live: {detail}"
        state.scored = count
        state.coverage = coverage if judged else None
        state.coverage_samples = judged
        ordered = state.calibration_sorted
        while state.calibration and state.calibration[0][0] < now - config.accountability_s:
            gone = state.calibration.popleft()[1]
            del ordered[bisect.bisect_left(ordered, gone)]
        state.excess_share = calibrated_share(ordered, quantile, config.min_scored_samples)

    def _maybe_refit(self, index: int, state: _ServiceForecasting, now: float) -> None:
        outcome = self._refit_step(index, state, now)
        if outcome is None:
            return
        if outcome is _FAILED:
            self.fit_failures += 1  # the previous forecast stays until it is too old, then reactive takes over
            return
        assert isinstance(outcome, tuple)
        self._publish(index, state, now, *outcome)

    def _publish(
        self, index: int, state: _ServiceForecasting, now: float, forecast: Forecast, baseline: Forecast
    ) -> None:
        state.baseline_forecast = baseline
        self._judge(state, self.quantiles[index], now)
        state.latest = ForecastInput(forecast, fitted_at=now, refitted_at=state.last_refit)

    def _take_computed(self, step: int, index: int, state: _ServiceForecasting, now: float) -> None:
        """``_maybe_refit`` from what a worker computed for this step, if anything was due."""
        assert self._pipeline is not None
        event = self._pipeline.take(step, index)
        if event is None:
            return
        tail = _newest_bucket(state)
        same_tail = event.tail == tail or (math.isnan(event.tail) and math.isnan(tail))  # a gap bucket is NaN
        same = event.history_len == state.history_len and (state.history_len == 0 or same_tail)
        if not same:
            raise RuntimeError(
                f"forecast worker diverged at step {step} (service {index}): it saw {event.history_len} buckets "
                f"ending {event.tail!r}, the run {state.history_len} ending {tail!r}"
            )
        state.last_refit, state.last_update = event.last_refit, event.last_update
        if event.forecast is None or event.baseline is None:
            self.fit_failures += 1
            return
        self._publish(index, state, now, _unwire(event.forecast), _unwire(event.baseline))

    def _refit_step(
        self, index: int, state: _ServiceForecasting, now: float
    ) -> tuple[Forecast, Forecast] | object | None:
        """The refit job's step at ``now``: None when nothing is due, ``_FAILED`` when the fit or update failed,
        else the model's and the baseline's forecasts (not yet published)."""
        config = self.config
        history_points = state.history_len
        bucket_s = self._bucket_s()
        if history_points * bucket_s < config.min_history_s:
            return None
        refit = now - state.last_refit >= config.refit_s or state.estimator is None
        if not refit and now - state.last_update < config.update_s:
            return None  # nothing due: the published forecast stands (decided before any work on the history)
        keep = int(config.history_s / bucket_s)
        first = history_points - keep if 0 < keep < history_points else 0
        window = state.history[first:history_points]  # a view: the models copy what they keep
        # The history ends at the last complete bucket of demand (seen metrics_delay_s late); the forecast starts
        # right after it.
        start = now - self.metrics_delay_s - (state.bucket_count * self.step_s) - len(window) * bucket_s
        horizon = math.ceil(config.horizon_s / bucket_s)
        quantile = self.quantiles[index]
        try:
            if refit:
                from forecast.base import carry_order_hints
                from forecast.registry import BAND_LEVELS, BASELINE, make_model

                # The controller fits the level the service provisions for plus the usual band; the tick reads only
                # that level and the median (EXPECTED_LEVEL), so the simulator fits those two where the band cannot
                # change them (the same values, about a sixth less time per step on the default scenario).
                levels = tuple(sorted({*BAND_LEVELS, quantile}))
                previous, previous_baseline = state.estimator, state.baseline
                state.estimator = make_model(config.model, **{**config.model_params, "quantiles": levels})
                if state.estimator.levels_independent:
                    state.estimator.set_params(quantiles=tuple(sorted({EXPECTED_LEVEL, quantile})))
                carry_order_hints(previous, state.estimator)  # only makes the refit cheaper, same forecasts
                state.estimator.fit(window, start=start, step_s=bucket_s)
                state.baseline = make_model(BASELINE, quantiles=levels)
                if state.baseline.levels_independent:
                    state.baseline.set_params(quantiles=(quantile,))  # scored at the service's level only
                carry_order_hints(previous_baseline, state.baseline)
                state.baseline.fit(window, start=start, step_s=bucket_s)
                state.last_refit = state.last_update = now
            else:
                state.estimator.update(window, start=start)
                state.baseline.update(window, start=start)
                state.last_update = now
            forecast: Forecast = state.estimator.predict(horizon)
            baseline: Forecast = state.baseline.predict(horizon)
        except (ValueError, np.linalg.LinAlgError):
            return _FAILED
        return forecast, baseline

    def _run_ahead(
        self, conn: Any, seen_rates: Sequence[np.ndarray], start: float, steps: int, indices: Sequence[int]
    ) -> None:
        """A forecasting worker (a forked process): the refit job of services ``indices`` over the whole run, sent
        to the run in chunks of ``_CHUNK_STEPS`` steps as (last step covered, events)."""
        try:
            batch: list[_Computed] = []
            for i in range(steps):
                now = start + (i + 1) * self.step_s
                for index in indices:
                    state = self.per_service[index]
                    self._observe(state, now, float(seen_rates[index][i]), self.quantiles[index])
                    outcome = self._refit_step(index, state, now)
                    if outcome is None:
                        continue
                    computed = outcome if isinstance(outcome, tuple) else (None, None)
                    batch.append(
                        _Computed(
                            i, index, state.history_len, _newest_bucket(state), state.last_refit, state.last_update,
                            _wire(computed[0]), _wire(computed[1]),
                        )
                    )
                if (i + 1) % _CHUNK_STEPS == 0 or i == steps - 1:
                    conn.send((i, batch))
                    batch = []
        except BaseException as exc:  # the run raises it: a worker must not fail silently
            with contextlib.suppress(Exception):
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            conn.close()


def _newest_bucket(state: _ServiceForecasting) -> float:
    """The newest bucket of the history (NaN: none yet): with its length, what identifies the history a forecast
    was computed on."""
    return float(state.history[state.history_len - 1]) if state.history_len else math.nan


def _append(state: _ServiceForecasting, value: float, keep: int) -> None:
    """Append one bucket to ``state.history``. A full buffer of at least twice ``keep`` buckets keeps only the newest
    ``keep`` (all a window reads); a smaller one doubles. Amortised O(1) per bucket."""
    size = state.history_len
    if size == state.history.size:
        if keep > 0 and 2 * keep <= size:
            state.history[:keep] = state.history[size - keep : size]
            size = keep
        else:
            grown = np.empty(max(2 * state.history.size, 256), dtype=np.float64)
            grown[:size] = state.history[:size]
            state.history = grown
    state.history[size] = value
    state.history_len = size + 1


def _expect(pending: deque[tuple[float, float, float, float]], entry: tuple[float, float, float, float]) -> None:
    """Queue a forecast for scoring in target-time order. The lead grows by a node boot while free GPUs are short
    and falls back when they are not: a tick's target can come before an earlier tick's, and ``_observe`` scores
    from the front only, so appended behind it the forecast would wait and be scored on a later time's demand."""
    target = entry[0]
    if not pending or pending[-1][0] <= target:
        pending.append(entry)  # the usual case: targets ascend
        return
    index = len(pending) - 1
    while index > 0 and pending[index - 1][0] > target:
        index -= 1
    pending.insert(index, entry)


def _add(sums: list[float], entry: tuple[float, float, float, float, int, int], sign: float) -> None:
    sums[0] += sign
    for k in range(1, 6):
        sums[k] += sign * entry[k]


_FAILED = object()  # ``_refit_step``: the fit or update raised; the previous forecast stays
_CHUNK_STEPS = 240  # steps a forecasting worker computes before it sends them (an hour at 15 s)

_Wired = tuple[float, float, tuple[float, ...], tuple[tuple[float, ...], ...], str]


def _wire(forecast: Forecast | None) -> _Wired | None:
    """A forecast as plain tuples for the pipe (its quantiles are a read-only mapping, which does not pickle)."""
    if forecast is None:
        return None
    levels = forecast.levels
    return forecast.start, forecast.step_s, levels, tuple(forecast.quantiles[q] for q in levels), forecast.model


def _unwire(wired: _Wired) -> Forecast:
    start, step_s, levels, rows, model = wired
    return Forecast._checked(start, step_s, levels, rows, model)  # as predict built it: already checked


@dataclass(frozen=True, slots=True)
class _Computed:
    """One refit-job step a worker computed: what the run checks (the history it was computed on) and publishes."""

    step: int
    index: int
    history_len: int
    tail: float  # the newest bucket of that history
    last_refit: float
    last_update: float
    forecast: _Wired | None  # None (with baseline None): the fit or update failed
    baseline: _Wired | None


class ForecastPipeline:
    """Forked worker processes computing the forecasting of a run ahead of it, services spread over the workers
    round-robin. The run takes each step's result with ``take``; ``close`` stops the workers (also when the
    pipeline is garbage-collected after a run that raised)."""

    def __init__(
        self, policy: PredictivePolicy, seen_rates: Sequence[np.ndarray], start: float, steps: int, workers: int
    ) -> None:
        context = multiprocessing.get_context("fork")
        count = len(policy.services)
        workers = max(1, min(workers, count))
        self._worker_of = [index % workers for index in range(count)]
        self._conns: list[Any] = []
        self._covered = [-1] * workers  # the last step each worker's received chunks cover
        self._done = [False] * workers
        self._pending: dict[tuple[int, int], _Computed] = {}
        processes = []
        for worker in range(workers):
            receive, send = context.Pipe(duplex=False)
            indices = [index for index in range(count) if index % workers == worker]
            process = context.Process(
                target=policy._run_ahead, args=(send, seen_rates, start, steps, indices), daemon=True,
                name=f"forecast-worker-{worker}",
            )
            process.start()
            send.close()
            self._conns.append(receive)
            processes.append(process)
        self._finalizer = weakref.finalize(self, _stop, processes, list(self._conns))

    def take(self, step: int, index: int) -> _Computed | None:
        worker = self._worker_of[index]
        while self._covered[worker] < step and not self._done[worker]:
            try:
                message = self._conns[worker].recv()
            except EOFError:
                self._done[worker] = True
                break
            last, payload = message
            if last == "error":
                raise RuntimeError(f"forecast worker {worker} failed: {payload}")
            for event in payload:
                self._pending[(event.step, event.index)] = event
            self._covered[worker] = last
        if self._covered[worker] < step:
            raise RuntimeError(f"forecast worker {worker} stopped before step {step}")
        return self._pending.pop((step, index), None)

    def close(self) -> None:
        self._finalizer()


def _stop(processes: list[Any], conns: list[Any]) -> None:
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()
    for process in processes:
        if process.is_alive():
            process.terminate()
        process.join(timeout=5)
