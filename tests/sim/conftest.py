from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml


def write_rate_trace(path: Path, rates: list[float], step_s: float = 60.0) -> Path:
    lines = ["timestamp,rate"] + [f"{i * step_s:g},{rate:g}" for i, rate in enumerate(rates)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def scenario_dict(trace: str, **overrides: Any) -> dict[str, Any]:
    """A small valid scenario: one service on a 2-node pool plus a burst pool."""
    data: dict[str, Any] = {
        "name": "tiny",
        "stepSeconds": 15,
        "metricsDelaySeconds": 0,
        "nodePools": [
            {"name": "fixed", "gpusPerNode": 8, "nodes": 2},
            {"name": "burst", "gpusPerNode": 8, "nodes": 0, "burst": True, "maxNodes": 2, "bootSeconds": 120,
             "pricePerGpuHour": 2.0},
        ],
        "services": [
            {
                "metadata": {"name": "chat", "namespace": "ml"},
                "spec": {
                    "targetRef": {"name": "chat"},
                    "minReplicas": 1,
                    "maxReplicas": 30,
                    "metric": {"type": "request_rate", "target": 8.0},
                    "latency": {"sloSeconds": 1.5},
                    "coldStartSeconds": 60,
                },
                "simulation": {"trace": trace, "throughputPerReplica": 10.0, "baseLatencySeconds": 1.0},
            }
        ],
    }
    data.update(overrides)
    return data


@pytest.fixture
def make_scenario(tmp_path: Path) -> Callable[..., Path]:
    def make(rates: list[float], step_s: float = 60.0, **overrides: Any) -> Path:
        trace = write_rate_trace(tmp_path / "trace.csv", rates, step_s)
        path = tmp_path / "scenario.yaml"
        path.write_text(yaml.safe_dump(scenario_dict(trace.name, **overrides)), encoding="utf-8")
        return path

    return make
