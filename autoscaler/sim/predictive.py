"""The ``predictive`` policy in the simulator: the reactive core plus a forecast floor ahead of the cold start.

It follows the controller's split: a *refit* job (here every ``refitSeconds`` of simulated time) fits the service's
forecaster on the request-rate history it has observed (``historySeconds``, at ``resolutionSeconds``), a cheap
*update* (every ``updateSeconds``) conditions that fit on the newest data with its parameters fixed, and every tick
only reads the latest forecast through ``autoscaler.core.predictive.forecast_floor``. The forecaster learns online
from the first step: at the start it has no history and the service scales reactively, as a new service would.

Forecast error is measured as the policy runs: each tick's forecast for now + lead is scored against the demand that
then arrives (MAE and pinball loss at the provisioned quantile).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.core.decide import decide_service
from autoscaler.core.model import ServiceObservation
from autoscaler.core.predictive import (
    ForecastInput,
    PredictiveSettings,
    forecast_floor,
    lead_time_s,
    rate_per_replica,
)
from autoscaler.core.reasons import Reason
from autoscaler.sim.policies import CorePolicy, SimService
from forecast.types import Forecast, pinball_loss


@dataclass(frozen=True)
class ForecastingConfig:
    model: str = "last_value"  # a name from forecast.registry (see `autoscaler backtest --help`)
    refit_s: float = 3600.0  # full refit period, seconds
    update_s: float = 300.0  # conditioning on new data with fitted parameters, seconds
    history_s: float = 7 * 86400.0  # training window, seconds
    resolution_s: float = 60.0  # forecast step, seconds
    horizon_s: float = 1800.0  # forecast horizon, seconds (must exceed update period + lead time)
    min_history_s: float = 1800.0  # no forecast before this much history, seconds
    model_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class _ServiceForecasting:
    estimator: Any = None
    latest: ForecastInput | None = None
    last_refit: float = -math.inf
    last_update: float = -math.inf
    history: list[float] = field(default_factory=list)  # mean observed request rate per resolution bucket
    bucket_sum: float = 0.0
    bucket_count: int = 0
    pending_scores: deque[tuple[float, float]] = field(default_factory=deque)  # (target time, predicted value)


class PredictivePolicy(CorePolicy):
    def __init__(
        self, config: ForecastingConfig | None = None, node_boot_s: float = 0.0, metrics_delay_s: float = 0.0
    ) -> None:
        super().__init__("predictive")
        self.config = config or ForecastingConfig()
        self.node_boot_s = node_boot_s
        # The request rate a tick sees is this old; the history is time-stamped with when the demand happened, as
        # Prometheus samples are, so that the forecaster learns the true phase of the demand's changes.
        self.metrics_delay_s = metrics_delay_s
        self.errors: list[float] = []
        self.pinball: list[float] = []
        self.fit_failures = 0

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        initial = super().reset(services, step_s)
        self.per_service = [_ServiceForecasting() for _ in services]
        self.settings = [
            PredictiveSettings(
                rate_per_replica=_rate_per_replica(s),
                quantile=s.forecast_quantile,
                refit_period_s=self.config.refit_s,
                max_fit_age_periods=3.0,
            )
            for s in services
        ]
        self.bucket_steps = max(1, round(self.config.resolution_s / step_s))
        self.errors, self.pinball, self.fit_failures = [], [], 0
        return initial

    def decide(self, index: int, step: int, now: float, obs: ServiceObservation) -> tuple[int, Reason]:
        service = self.services[index]
        state = self.per_service[index]
        self._observe(state, now, obs, self.settings[index].quantile)
        self._maybe_refit(index, state, now)
        lead = lead_time_s(service.policy.cold_start_s, (), self.node_boot_s, needs_new_nodes=False)
        floor = forecast_floor(service.policy, state.latest, self.settings[index], now, lead, self.step_s)
        if floor is not None and floor.usable and state.latest is not None:
            predicted = state.latest.forecast.at(now + lead, self.settings[index].quantile)
            state.pending_scores.append((now + lead, predicted))
        decision, self.states[index] = decide_service(self.policies[index], obs, self.states[index], now, floor)
        return decision.desired_replicas, decision.reason

    def _observe(self, state: _ServiceForecasting, now: float, obs: ServiceObservation, quantile: float) -> None:
        if obs.request_rate is None or not math.isfinite(obs.request_rate):
            return  # a gap: the forecaster's gap filling handles it at the next fit
        state.bucket_sum += obs.request_rate
        state.bucket_count += 1
        if state.bucket_count == self.bucket_steps:
            state.history.append(state.bucket_sum / state.bucket_count)
            state.bucket_sum, state.bucket_count = 0.0, 0
        # Score forecasts whose target time has arrived, against the demand observed for that time.
        while state.pending_scores and state.pending_scores[0][0] <= now - self.metrics_delay_s:
            _, predicted = state.pending_scores.popleft()
            self.errors.append(abs(obs.request_rate - predicted))
            self.pinball.append(pinball_loss(obs.request_rate, predicted, quantile))

    def _maybe_refit(self, index: int, state: _ServiceForecasting, now: float) -> None:
        config = self.config
        history_points = len(state.history)
        if history_points * config.resolution_s < config.min_history_s:
            return
        keep = int(config.history_s / config.resolution_s)
        window = np.asarray(state.history[-keep:], dtype=np.float64)
        # The history ends at the last complete bucket of demand (seen metrics_delay_s late); the forecast starts
        # right after it.
        start = now - self.metrics_delay_s - (state.bucket_count * self.step_s) - len(window) * config.resolution_s
        horizon = math.ceil(config.horizon_s / config.resolution_s)
        try:
            if now - state.last_refit >= config.refit_s or state.estimator is None:
                from forecast.registry import make_model

                # The forecaster must produce the level the service provisions for, plus the usual band.
                levels = tuple(sorted({0.1, 0.5, 0.9, self.settings[index].quantile}))
                state.estimator = make_model(config.model, **{**config.model_params, "quantiles": levels})
                state.estimator.fit(window, start=start, step_s=config.resolution_s)
                state.last_refit = state.last_update = now
            elif now - state.last_update >= config.update_s:
                state.estimator.update(window, start=start)
                state.last_update = now
            else:
                return
            forecast: Forecast = state.estimator.predict(horizon)
        except (ValueError, np.linalg.LinAlgError):
            self.fit_failures += 1  # the previous forecast stays until it is too old, then reactive takes over
            return
        state.latest = ForecastInput(forecast, fitted_at=now)


def _rate_per_replica(service: SimService) -> float:
    """The core's rule (``autoscaler.core.predictive.rate_per_replica``) with the simulated replica's throughput."""
    rate = rate_per_replica(service.policy, service.throughput)
    assert rate is not None  # with a throughput the rule always has an answer
    return rate
