"""Helpers shared by the Prometheus tests (imported by name: this folder is on sys.path under pytest)."""

from __future__ import annotations

from typing import Any

from genai_dataset import NAMESPACE, RATE_WINDOW_S, SERVICES

from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.model import ServicePolicy


def genai_settings(url: str, **changes: Any) -> PrometheusSettings:
    """Settings for the trace data: its 57 s grid needs a 228 s rate window (4 samples)."""
    values: dict[str, Any] = {"url": url, "rate_window_seconds": RATE_WINDOW_S, "retries": 0, "timeout_seconds": 5}
    values.update(changes)
    return PrometheusSettings(**values)


def genai_services(**changes: Any) -> list[ServicePolicy]:
    return [ServicePolicy(namespace=NAMESPACE, name=name, **changes) for name in SERVICES]
