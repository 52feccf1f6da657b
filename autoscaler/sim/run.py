"""Run a scenario: load traces, replay every requested policy through the simulator, build the report."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.policy import to_service_policy
from autoscaler.sim.engine import PolicyRun, simulate
from autoscaler.sim.policies import POLICY_NAMES, SimService, make_policy
from autoscaler.sim.report import build_report, figures, forecast_figures
from autoscaler.sim.scenario import BUILTIN_PREFIX, Scenario, ScenarioError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass
class SimulationResult:
    scenario: Scenario
    services: list[SimService]
    runs: dict[str, PolicyRun]
    start: float
    step_s: float
    steps: int
    report: dict[str, Any]


def resolve_trace(reference: str, base_dir: Path) -> Path:
    """A scenario's trace reference as a file: ``builtin:NAME`` is a trace packaged in ``autoscaler/data``."""
    if reference.startswith(BUILTIN_PREFIX):
        name = reference.removeprefix(BUILTIN_PREFIX)
        matches = sorted(DATA_DIR.glob(f"{name}*.csv*"))
        if len(matches) != 1:
            known = sorted({p.name.split(".")[0] for p in DATA_DIR.glob("*.csv*")})
            raise ScenarioError(f"trace {reference!r}: no packaged trace of that name (packaged: {', '.join(known)})")
        return matches[0]
    path = Path(reference)
    return path if path.is_absolute() else base_dir / path


def build_services(scenario: Scenario, base_dir: Path) -> tuple[list[SimService], float, int]:
    """SimServices with their demand at the scenario's step; returns (services, start, steps)."""
    from autoscaler.traces import load_trace, resample  # numpy-heavy; only the simulator needs it

    step_s = scenario.step_seconds
    services: list[SimService] = []
    starts: list[float] = []
    lengths: list[int] = []
    for index, entry in enumerate(scenario.services):
        path = resolve_trace(entry.simulation.trace, base_dir)
        if not path.exists():
            raise ScenarioError(f"services.{index}.simulation.trace: file not found: {path}")
        series = resample(load_trace(path, step_s=entry.simulation.bin_seconds), step_s)
        rates = np.asarray(series.rates, dtype=np.float64) * entry.simulation.trace_scale
        latency = entry.spec.latency
        assert latency is not None  # the scenario model requires it
        services.append(
            SimService(
                policy=to_service_policy(entry.metadata.namespace, entry.metadata.name, entry.spec),
                rates=rates,
                throughput=entry.simulation.throughput_per_replica,
                base_latency_s=entry.simulation.base_latency_seconds,
                slo_s=latency.slo_seconds,
                quantile=latency.quantile,
                forecast_quantile=entry.spec.forecast.quantile,
            )
        )
        starts.append(series.start)
        lengths.append(len(rates))
    steps = min(lengths)
    if scenario.duration_seconds is not None:
        wanted = math.ceil(scenario.duration_seconds / step_s)
        if wanted > steps:
            raise ScenarioError(
                f"durationSeconds: {scenario.duration_seconds:g} s is longer than the shortest trace "
                f"({steps * step_s:g} s at a {step_s:g} s step)"
            )
        steps = wanted
    services = [
        dataclasses.replace(s, rates=s.rates[:steps])
        for s in services
    ]
    return services, starts[0], steps


def run_scenario(
    scenario: Scenario,
    base_dir: Path,
    policy_names: Sequence[str] = POLICY_NAMES,
    progress: Callable[[int], None] | None = None,
    scenario_source: str = "",
    on_total_steps: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Replay ``policy_names`` over the scenario. ``on_total_steps`` learns the number of steps that ``progress``
    will count to, once the traces are loaded."""
    unknown = [name for name in policy_names if name not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICY_NAMES)})")
    services, start, steps = build_services(scenario, base_dir)
    if on_total_steps is not None:
        on_total_steps(steps * len(policy_names))
    # The oracle runs first: the others are reported relative to its GPU-hours.
    ordered = sorted(policy_names, key=lambda name: name != "oracle")
    runs: dict[str, PolicyRun] = {}
    for name in ordered:
        started = time.perf_counter()
        policy = make_policy(
            name,
            scenario.baselines.hpa_target_utilization,
            scenario.baselines.static_headroom,
            scenario.forecasting.to_config(),
            metrics_delay_s=scenario.metrics_delay_seconds,
        )
        runs[name] = simulate(
            policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
            scenario.metrics_delay_seconds, progress,
        )
        runs[name].wall_seconds = time.perf_counter() - started
        runs[name].policy_object = policy
    oracle_hours = runs["oracle"].gpu_seconds / 3600.0 if "oracle" in runs else None
    policies = {name: figures(runs[name], oracle_hours) for name in policy_names}
    for name in policy_names:
        policies[name].update(forecast_figures(runs[name]))
    summary = {
        "name": scenario.name,
        "source": scenario_source,
        "step_seconds": scenario.step_seconds,
        "steps": steps,
        "simulated_days": steps * scenario.step_seconds / 86400.0,
        "services": [
            {
                "service": s.policy.key,
                "mean_rate": float(s.rates.mean()),
                "peak_rate": float(s.rates.max()),
                "slo_seconds": s.slo_s,
                "cold_start_seconds": s.policy.cold_start_s,
            }
            for s in services
        ],
    }
    return SimulationResult(
        scenario, services, runs, start, scenario.step_seconds, steps, build_report(summary, policies)
    )
