"""One small Protocol per external system. Each has a real adapter (``autoscaler/adapters``) and an in-memory fake
(``autoscaler/fakes.py``); the simulator is one more implementation of them.

Errors: an adapter raises ``PortError`` (or a subclass) for an outage it could not recover from; callers turn that
into stale data / a hold, never into a scale-down or a preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import Observation, ServicePolicy


class PortError(Exception):
    """An external system failed in a way the adapter could not hide (outage, auth, timeout after retries)."""


@dataclass(frozen=True, slots=True)
class Series:
    """A regular or irregular time series: ``times`` in Unix seconds ascending, ``values`` of the same length."""

    times: tuple[float, ...]
    values: tuple[float, ...]


class MetricsSource(Protocol):
    """Observes DCGM and application metrics (Prometheus in production)."""

    def observe(self, services: Sequence[ServicePolicy], now: float) -> Observation:
        """One observation of every service and GPU at ``now``. Never raises for an outage: returns stale data."""
        ...

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        """History of one service's signal (``request_rate``, ``gpu_utilization``...) for forecasting."""
        ...


class EvictionOutcome(StrEnum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget says not now
    GONE = "gone"  # 404: already gone, which is what we wanted


class ClusterReader(Protocol):
    def snapshot(self, now: float) -> ClusterSnapshot: ...


class ClusterWriter(Protocol):
    """Idempotent writes: applying the same action twice leaves the cluster as applying it once."""

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None: ...

    def evict_pod(self, namespace: str, name: str) -> EvictionOutcome: ...

    def suspend_workload(self, kind: str, namespace: str, name: str) -> None: ...

    def emit_event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, event_type: str = "Normal"
    ) -> None: ...


class NodePoolScaler(Protocol):
    """A node pool that can be resized (Cluster API MachineDeployment, a cloud provider plug-in...)."""

    def node_count(self, pool: str) -> int: ...

    def scale(self, pool: str, nodes: int) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
