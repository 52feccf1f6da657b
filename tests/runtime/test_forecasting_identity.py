"""The refit job's per-service memory (``autoscaler/forecasting.py``) follows what the service's series *is*, not
only its namespace/Deployment key.

``ForecastService`` keeps per service the history it last fitted, the fitted model, the forecasts waiting to be
scored, the live scores, the bootstrap verdict and its coverage: the earned headroom (``core/headroom.py``) comes
from them. A GPUScalingPolicy deleted and re-created for the same Deployment with another ``spec.queries.requestRate``
(say tokens/s instead of requests/s) has another series under the same key: the old fit forecast another quantity,
its scores and its earned trust say nothing about the new one, and scoring the old forecasts against the new
series' actuals mixes the two. It kept all of that until the next refit, and its scores for the accountability
window (6 h) after it. A change that does not change the series (max/min replicas, target, metric: the forecast is
always the request rate) keeps it all.

Time is an argument everywhere: no sleeps, no timing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from runtime_fakes import FakePolicies, FakeStatus

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.controller import Controller
from autoscaler.core.cluster import NodeInfo
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.forecasting import FitJob, ForecastService
from autoscaler.policy import QueriesSpec
from autoscaler.ports import PolicyObject, Series
from autoscaler.settings import ForecastSettings
from autoscaler.telemetry import Telemetry

STEP = 60.0
DAY = 86_400.0
DAY0 = 20_833 * DAY  # midnight UTC
JUMP = DAY0 + 2 * DAY + 9 * 3600  # 09:00 on the third day
REFIT = 900.0
TICK = 15.0
KEY = "ml/chat"
DEFAULT_QUERY = "default request rate"
TOKENS = 'sum(rate(tokens_total{namespace="{namespace}"}[2m]))'


def queries(request_rate: str) -> QueriesSpec:
    """``spec.queries`` overriding the request-rate query."""
    return QueriesSpec.model_validate({"requestRate": request_rate})


def office_hours(t: float) -> float:
    return 25.0 if 9 * 3600 <= (t - DAY0) % DAY < 17 * 3600 else 10.0


def series(demand: Callable[[float], float], scale: float = 1.0) -> Series:
    times = np.arange(DAY0, DAY0 + 4 * DAY + STEP / 2, STEP)
    values = np.array([scale * demand(t - STEP) for t in times])
    return Series(tuple(float(t) for t in times), tuple(float(v) for v in values))


class QueryMetrics(FakeMetricsSource):
    """The fake, with the Prometheus adapter's ``history_query``: the series a service's history comes from is the
    one its ``spec.queries.requestRate`` override names (else the default query)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_query: dict[str, Series] = {}

    def history_query(self, service: ServicePolicy, signal: str) -> str:
        spec = self.service_queries.get(service.key)
        override = getattr(spec, "request_rate", None) if spec is not None else None
        return override or DEFAULT_QUERY

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        self.set_history(service.key, signal, self.by_query[self.history_query(service, signal)])
        return super().history(service, signal, start, end, step_s)


def policy(**changes: Any) -> ServicePolicy:
    base = ServicePolicy(
        "ml", "chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=5.0, cold_start_s=90.0,
        forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.9),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


class World:
    """A controller and its ForecastService on in-memory ports; the request-rate series depends on the query."""

    def __init__(self, update_interval_s: float = 0.0) -> None:
        self.policy = policy()
        self.cluster = FakeCluster()
        self.cluster.add_node(NodeInfo("gpu-0", 64, "A100", None, True))
        self.cluster.add_deployment("ml", "chat", 2)
        self.metrics = QueryMetrics()
        self.metrics.by_query[DEFAULT_QUERY] = series(office_hours)
        self.metrics.by_query[TOKENS] = series(office_hours, scale=40.0)  # tokens/s: another quantity
        self.telemetry = Telemetry()
        settings = ForecastSettings(model="seasonal_naive", history_seconds=3 * DAY, workers=1, node_boot_seconds=0.0)
        self.service = ForecastService(
            settings, self.metrics, lambda: [self.policy], refit_interval_s=REFIT, tick_interval_s=TICK,
            telemetry=self.telemetry, update_interval_s=update_interval_s,
        )  # fmt: skip
        self.policies = FakePolicies([self.policy_object()])
        self.controller = Controller(
            metrics=self.metrics, cluster=self.cluster, writer=self.cluster, policies=self.policies,
            status_writer=FakeStatus(), telemetry=self.telemetry, forecasts=self.service,
        )  # fmt: skip
        self.controller.acting_since = DAY0
        self.jobs: list[FitJob] = []
        run = self.service.runner.run

        def spy(jobs: Any) -> Any:
            taken = list(jobs)
            self.jobs += taken
            return run(taken)

        self.service.runner.run = spy  # type: ignore[method-assign]

    def policy_object(self, queries: QueriesSpec | None = None, uid: str = "uid-1") -> PolicyObject:
        return PolicyObject("ml", "chat-policy", self.policy, generation=1, queries=queries, uid=uid)

    def recreate(self, queries: QueriesSpec | None = None, **changes: Any) -> None:
        """The policy deleted and created again (a new uid) with ``queries`` and the spec ``changes``."""
        self.policy = policy(**changes)
        self.policies.objects = [self.policy_object(queries, uid="uid-2")]

    def tick(self, now: float) -> Any:
        spec = self.cluster.deployments[KEY].spec_replicas
        rate = office_hours(now)
        self.metrics.set_service(KEY, spec_replicas=spec, ready_replicas=spec, metric_total=rate, request_rate=rate)
        self.controller.run_once(now)
        report = self.controller.last_report
        assert report is not None
        return report.forecasts[KEY]

    def warm(self) -> Any:
        """Fitted, scored and trusted on the default series: the state a re-created policy inherits."""
        self.service.refit(JUMP - 3 * REFIT)
        now = JUMP - 3 * REFIT
        while now < JUMP - REFIT:
            now += TICK
            if now % REFIT == 0:
                self.service.refit(now)
            if self.service.update_interval_s and now % self.service.update_interval_s == 0:
                self.service.update(now)
            self.tick(now)
        seen = self.tick(now)
        assert seen.floor.usable and seen.headroom.state is HeadroomState.EARNED, seen.headroom
        assert self.service._state[KEY].scores, "warm-up left no live scores"
        return seen


def test_a_policy_recreated_with_another_request_rate_query_starts_learning_again() -> None:
    world = World()
    world.warm()
    now = JUMP - REFIT
    world.recreate(queries(TOKENS))
    # The very next tick: the published fit is of the old series (req/s, not tokens/s): no floor, no trust from it.
    seen = world.tick(now + TICK)
    assert seen.published is None, seen.published
    assert not seen.floor.usable
    assert seen.headroom.state is not HeadroomState.EARNED and seen.headroom.ratio == pytest.approx(0.75)
    # The next refit forgets the old fit and its scores: the old forecasts are not scored against the new series'
    # actuals, the verdict is made again (bootstrap backtest) on the new series, the fit is of tokens/s.
    world.jobs.clear()
    assert world.service.refit(now + REFIT).ok == [KEY]
    (job,) = world.jobs
    assert job.backtest_origins > 0, "the old series' verdict was kept"
    pub = world.service.published[KEY]
    assert pub.scored == 0, f"{pub.scored} values scored the old series' forecasts against the new one"
    state = world.service._state[KEY]
    assert not state.scores and len(state.pending) == 1
    assert pub.latest.forecast.at(JUMP + 60, 0.9) == pytest.approx(40.0 * 25.0)


def test_the_update_job_does_not_condition_the_old_fit_on_the_new_series() -> None:
    world = World(update_interval_s=60.0)
    world.warm()
    now = JUMP - REFIT
    world.recreate(queries(TOKENS))
    world.tick(now + TICK)  # hands the override to the metrics source, as the controller's tick does
    report = world.service.update(now + 60.0)
    assert KEY not in report.ok, "the old model was re-conditioned on the new series"
    assert KEY not in world.service.published
    assert KEY not in world.service._state  # the next refit starts it afresh
    assert world.service.refit(now + REFIT).ok == [KEY]
    assert world.service.published[KEY].scored == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"max_replicas": 20},
        {"min_replicas": 3},
        {"target": 4.0},
        {"metric": MetricKind.GPU_UTILIZATION, "target": 60.0,
         "forecast": ForecastPolicy(ForecastMode.ACTIVE, 0.9, rate_per_replica=5.0)},
        {"cold_start_s": 120.0},
    ],
)  # fmt: skip
def test_a_change_that_keeps_the_series_keeps_the_state(changes: dict[str, Any]) -> None:
    """The forecast is of the service's request rate whatever it scales on: bounds, target, metric and cold start
    change what the floor does with it, not what the history, the scores or the coverage are of."""
    world = World()
    world.warm()
    now = JUMP - REFIT
    state = world.service._state[KEY]
    scores = len(state.scores)
    world.recreate(**changes)
    seen = world.tick(now + TICK)
    assert seen.published is not None and seen.headroom.state is HeadroomState.EARNED, seen.headroom
    world.jobs.clear()
    assert world.service.refit(now + REFIT).ok == [KEY]
    assert world.service._state[KEY] is state and len(state.scores) >= scores
    assert world.jobs[0].backtest_origins == 0  # the verdict stands: no new bootstrap
    assert world.service.published[KEY].scored > 0


def test_the_same_query_recreated_keeps_the_state() -> None:
    """Re-applied unchanged (a new uid, the same override): the same series, the same trust."""
    world = World()
    world.recreate(queries(TOKENS))
    world.warm()
    state = world.service._state[KEY]
    world.recreate(queries(TOKENS))
    seen = world.tick(JUMP - REFIT + TICK)
    assert seen.published is not None and seen.headroom.state is HeadroomState.EARNED
    assert world.service.refit(JUMP).ok == [KEY]
    assert world.service._state[KEY] is state


def test_with_the_prometheus_adapter_the_series_is_the_history_query() -> None:
    """The identity is what the Prometheus adapter would query (``history_query``): an override set through
    ``set_service_queries`` (as the controller's tick does) withdraws the fit of the series before it."""
    source = PrometheusMetricsSource(PrometheusSettings(url="http://127.0.0.1:9"))
    histories = {"default": series(office_hours), "tokens": series(office_hours, scale=40.0)}

    def history(service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        name = "tokens" if "tokens_total" in source.history_query(service, signal) else "default"
        full = histories[name]
        kept = [(t, v) for t, v in zip(full.times, full.values, strict=True) if start <= t <= end]
        return Series(tuple(t for t, _ in kept), tuple(v for _, v in kept))

    source.history = history  # type: ignore[method-assign]
    policies: Sequence[ServicePolicy] = [policy()]
    settings = ForecastSettings(model="seasonal_naive", history_seconds=3 * DAY, workers=1, node_boot_seconds=0.0)
    service = ForecastService(settings, source, lambda: policies, refit_interval_s=REFIT)
    assert service.refit(JUMP - REFIT).ok == [KEY]
    assert KEY in service.published
    source.set_service_queries({KEY: queries(TOKENS)})
    assert KEY not in service.published
    assert service.refit(JUMP).ok == [KEY]
    assert service.published[KEY].latest.forecast.at(JUMP + 60, 0.9) == pytest.approx(40.0 * 25.0)
    source.set_service_queries({})
    assert KEY not in service.published
