"""An in-memory ``MetricsSource``: set what each service and GPU shows, simulate outages, record the calls.

Used by tests, the simulator and dry-run. It behaves like the Prometheus adapter at the port: ``observe`` never
raises (an outage makes every service stale with the reason), ``history`` raises ``PortError`` during an outage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import GpuSample, Observation, PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.ports import PortError, Series

NO_DATA = "no metrics for this service"


@dataclass(frozen=True, slots=True)
class ObserveCall:
    keys: tuple[str, ...]
    now: float


class FakeMetricsSource:
    """Settable per service and per GPU. Values are returned as set, so a test controls staleness exactly."""

    def __init__(self) -> None:
        self._services: dict[str, ServiceObservation] = {}
        self._gpus: dict[tuple[str, str], GpuSample] = {}
        self._history: dict[tuple[str, str], Series] = {}
        self._outage: str | None = None
        self.observe_calls: list[ObserveCall] = []
        self.history_calls: list[tuple[str, str, float, float, float]] = []
        self.service_queries: dict[str, Any] = {}  # the latest per-service query overrides (recorded, not applied)

    # -- setting what is seen -------------------------------------------------------------------------------

    def set_service(
        self,
        key: str,
        *,
        spec_replicas: int = 0,
        ready_replicas: int = 0,
        pods: PodMetrics | None = None,
        metric_total: float | None = None,
        latency_s: float | None = None,
        request_rate: float | None = None,
        queue_depth: float | None = None,
        stale_reasons: Sequence[str] = (),
        status_replicas: int | None = None,
    ) -> None:
        """Replace everything the service shows (unset signals become unknown). ``status_replicas``: the
        Deployment's pods created and not terminating (its status.replicas); None: as many as ``spec_replicas``."""
        self._services[key] = ServiceObservation(
            key=key,
            spec_replicas=spec_replicas,
            ready_replicas=ready_replicas,
            pods=pods,
            metric_total=metric_total,
            latency_s=latency_s,
            request_rate=request_rate,
            queue_depth=queue_depth,
            stale_reasons=tuple(stale_reasons),
            status_replicas=status_replicas,
        )

    def update_service(self, key: str, **changes: Any) -> None:
        """Change some signals of a service already set (e.g. ``pods=...`` each simulated tick)."""
        if "stale_reasons" in changes:
            changes["stale_reasons"] = tuple(changes["stale_reasons"])
        self._services[key] = replace(self._services[key], **changes)

    def set_stale(self, key: str, *reasons: str) -> None:
        """Make one service stale: its signals unknown, with these reasons."""
        current = self._services.get(key)
        spec, ready = (current.spec_replicas, current.ready_replicas) if current else (0, 0)
        self.set_service(
            key, spec_replicas=spec, ready_replicas=ready, stale_reasons=reasons or ("stale (fake)",),
            status_replicas=current.status_replicas if current else None,
        )

    def remove_service(self, key: str) -> None:
        self._services.pop(key, None)

    def set_gpu(self, sample: GpuSample) -> None:
        self._gpus[(sample.node, sample.uuid or sample.gpu)] = sample

    def remove_gpu(self, node: str, gpu: str) -> None:
        """Remove by node and UUID (or index when the sample had no UUID)."""
        self._gpus.pop((node, gpu), None)

    def set_history(self, key: str, signal: str, series: Series) -> None:
        self._history[(key, signal)] = series

    def outage(self, reason: str = "Prometheus unreachable (fake outage)") -> None:
        """From now on every service is stale with ``reason`` and ``history`` raises, until :meth:`restore`."""
        self._outage = reason

    def restore(self) -> None:
        self._outage = None

    # -- the port -------------------------------------------------------------------------------------------

    def set_service_queries(self, service_queries: Mapping[str, Any]) -> None:
        """Recorded only: the values this fake returns are set by the test, not queried."""
        self.service_queries = dict(service_queries)

    def observe(
        self, services: Sequence[ServicePolicy], now: float, *, cluster: ClusterSnapshot | None = None
    ) -> Observation:
        """What was set for each service (``cluster`` is ignored: replicas are as set)."""
        keys = tuple(dict.fromkeys(s.key for s in services))
        self.observe_calls.append(ObserveCall(keys, now))
        out: dict[str, ServiceObservation] = {}
        for key in keys:
            current = self._services.get(key)
            if self._outage is not None:
                spec, ready = (current.spec_replicas, current.ready_replicas) if current else (0, 0)
                status = current.status_replicas if current else None
                out[key] = ServiceObservation(key, spec, ready, stale_reasons=(self._outage,), status_replicas=status)
            elif current is None:
                out[key] = ServiceObservation(key, 0, 0, stale_reasons=(NO_DATA,))
            else:
                out[key] = current
        gpus = () if self._outage is not None else tuple(self._gpus.values())
        return Observation(time=now, services=out, gpus=gpus)

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        """The stored series cut to [start, end] (``step_s`` is recorded, not applied); empty when none is set."""
        self.history_calls.append((service.key, signal, start, end, step_s))
        if self._outage is not None:
            raise PortError(self._outage)
        series = self._history.get((service.key, signal))
        if series is None:
            return Series(times=(), values=())
        kept = [(t, v) for t, v in zip(series.times, series.values, strict=True) if start <= t <= end]
        return Series(times=tuple(t for t, _ in kept), values=tuple(v for _, v in kept))
