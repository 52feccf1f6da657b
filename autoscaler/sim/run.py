"""Run a scenario: load traces, replay every requested policy through the simulator, build the report."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.policy import to_service_policy
from autoscaler.sim.cluster import Scoring
from autoscaler.sim.engine import PolicyRun, simulate
from autoscaler.sim.policies import SimService
from autoscaler.sim.registry import POLICY_NAMES, default_policies, make_policy
from autoscaler.sim.report import build_report, figures, forecast_figures
from autoscaler.sim.scenario import (
    BUILTIN_PREFIX,
    MAX_RATE,
    MAX_STEPS,
    MAX_TRACE_BINS,
    Scenario,
    ScenarioError,
    ServiceEntry,
)
from autoscaler.sim.training import build_jobs, capacity_config, rebalance_config
from autoscaler.traces.formats import RateSeries, TraceFormatError

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


_BUILTIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def resolve_trace(reference: str, base_dir: Path) -> Path:
    """A scenario's trace reference as a file: ``builtin:NAME`` is a trace packaged in ``autoscaler/data``."""
    if reference.startswith(BUILTIN_PREFIX):
        name = reference.removeprefix(BUILTIN_PREFIX)
        # a packaged trace's whole name, with or without its span-and-step suffix (servegen-m-large or
        # servegen-m-large-14d-60s): a prefix ("builtin:s") must not pick a trace by chance
        files = sorted(DATA_DIR.glob("*.csv*"))
        matches = [p for p in files if name in _builtin_names(p)] if _BUILTIN_NAME.fullmatch(name) else []
        if len(matches) != 1:
            known = sorted({min(_builtin_names(p), key=len) for p in files})
            raise ScenarioError(f"trace {reference!r}: no packaged trace of that name (packaged: {', '.join(known)})")
        return matches[0]
    path = Path(reference)
    return path if path.is_absolute() else base_dir / path


_SPAN_AND_STEP = re.compile(r"-(\d+d-\d+s|\d+)$")  # "-14d-60s" (span and step), "-2000" (rows)


def _builtin_names(path: Path) -> set[str]:
    """The names ``builtin:`` accepts for a packaged trace file: its stem, and its stem without the span-and-step
    or row-count suffix (``servegen-m-large-14d-60s.csv.gz``: ``servegen-m-large-14d-60s``, ``servegen-m-large``)."""
    stem = path.name.split(".")[0]
    return {stem, _SPAN_AND_STEP.sub("", stem)}


def _shown(path: Path) -> str:
    text = str(path)
    if len(text) > 200:
        text = text[:197] + "..."
    return text if text.isprintable() else repr(text)


def _trace_file(field: str, reference: str, base_dir: Path) -> Path:
    """The trace file of ``field``, checked to be a readable regular file (not a directory, FIFO or device)."""
    try:
        path = resolve_trace(reference, base_dir)
    except ScenarioError as error:
        raise ScenarioError(f"{field}: {error}") from None
    problem = None
    try:
        if not path.exists():
            problem = f"file not found: {_shown(path)}"
        elif path.is_dir():
            problem = f"{_shown(path)} is a directory, not a trace file"
        elif not path.is_file():
            problem = f"{_shown(path)} is not a regular file"
    except OSError as error:  # a name too long, ...
        problem = f"cannot read {_shown(path)}: {error.strerror or error}"
    except ValueError as error:
        problem = f"cannot read {_shown(path)}: {error}"
    if problem is not None:
        raise ScenarioError(f"{field}: {problem}")
    return path


def _check_bins(index: int, span_s: float, bin_s: float, used: int, path: Path) -> int:
    """Bins of demand this trace adds at ``bin_s``; refuses to go over MAX_TRACE_BINS for the whole scenario."""
    bins = math.ceil(span_s / bin_s)
    if used + bins > MAX_TRACE_BINS:
        raise ScenarioError(
            f"services.{index}.simulation.binSeconds: {path.name} spans {span_s:,.0f} s, {bins:,} bins of "
            f"{bin_s:g} s ({used + bins:,} with the traces before it), more than the maximum of {MAX_TRACE_BINS:,}: "
            "use a longer binSeconds or a shorter trace"
        )
    return bins


def _load_demand(
    index: int, entry: ServiceEntry, base_dir: Path, used_bins: int
) -> tuple[RateSeries, int, float]:
    """The service's demand at its ``binSeconds`` (what ``load_trace(path, step_s=binSeconds)`` gives), sized before
    anything is allocated; returns it with the bins it takes and the span of the trace itself, seconds (a rate
    series' last bin may run past its end when ``binSeconds`` does not divide it: the run stops at the trace's)."""
    from autoscaler.traces import bin_requests, load_request_log, load_trace, resample
    from autoscaler.traces.formats import sniff_format

    field = f"services.{index}.simulation.trace"
    path = _trace_file(field, entry.simulation.trace, base_dir)
    bin_s = entry.simulation.bin_seconds
    try:
        if sniff_format(path) == "rate series":
            series = load_trace(path)  # at its own step: as many values as the file has rows
            span = series.duration_s
            bins = _check_bins(index, series.duration_s, bin_s, used_bins, path)
            if not math.isclose(bin_s, series.step_s, rel_tol=1e-12):
                series = resample(series, bin_s)
        else:
            log = load_request_log(path)
            span = float(log.times.max() - log.times.min()) + bin_s if len(log) else bin_s
            bins = _check_bins(index, span, bin_s, used_bins, path)
            series = bin_requests(log.times, bin_s, source=f"{path.name} (request log, {len(log)} requests)")
            span = series.duration_s
    except (TraceFormatError, ScenarioError):
        raise  # they name the file, line and column, or the field
    except OSError as error:
        raise ScenarioError(f"{field}: cannot read {_shown(path)}: {error.strerror or error}") from None
    except ValueError as error:
        raise ScenarioError(f"{field}: {_shown(path)}: {error}") from None
    return series, bins, span


def build_services(scenario: Scenario, base_dir: Path) -> tuple[list[SimService], float, int]:
    """SimServices with their demand at the scenario's step; returns (services, start, steps).

    The run is sized from the traces before they are resampled to the step (``Scenario.check_run_size``: at most
    MAX_STEPS steps, MAX_SERVICE_STEPS service-steps, MAX_REPLICA_STEPS replica-steps), so no input allocates or
    computes more than that."""
    from autoscaler.traces import resample

    step_s = scenario.step_seconds
    demand: list[RateSeries] = []
    spans: list[float] = []
    used_bins = 0
    for index, entry in enumerate(scenario.services):
        series, bins, trace_span = _load_demand(index, entry, base_dir, used_bins)
        demand.append(series)
        spans.append(trace_span)
        used_bins += bins
    if scenario.duration_seconds is not None:
        span, over = scenario.duration_seconds, "durationSeconds"
        most_steps = math.ceil(span / step_s)
    else:
        span = min(spans)
        over = "the shortest trace" if len(demand) > 1 else "the trace"
        most_steps = max(math.ceil(span / step_s - 1e-9), 1)
    try:
        scenario.check_run_size(most_steps, over, span)
    except ValueError as error:
        raise ScenarioError(str(error)) from None
    keep_steps = most_steps + 1  # every series is at least as long as the run (or the run is refused below)

    services: list[SimService] = []
    starts: list[float] = []
    lengths: list[int] = []
    for index, (entry, series) in enumerate(zip(scenario.services, demand, strict=True)):
        if series.duration_s / step_s > MAX_STEPS + 2:
            # Far longer than any run: resample only the part the run reads.
            keep = min(len(series), math.ceil((keep_steps + 1) * step_s / series.step_s) + 1)
            series = RateSeries(series.start, series.step_s, series.rates[:keep], series.source)
        try:
            resampled = resample(series, step_s)
        except ValueError as error:  # e.g. rates too large to resample: the trace's values are at fault
            raise ScenarioError(f"services.{index}.simulation.trace: {error}") from None
        rates = np.asarray(resampled.rates[:keep_steps], dtype=np.float64) * entry.simulation.trace_scale
        peak = float(rates.max()) if rates.size else 0.0
        if not peak <= MAX_RATE:
            raise ScenarioError(
                f"services.{index}.simulation.traceScale: the trace's peak times traceScale is {peak:g} req/s, more "
                f"than the maximum of {MAX_RATE:g}"
            )
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
                rate_counts_finished=entry.simulation.request_rate_counts == "finished",
                forecast_learns_finished=entry.simulation.forecast_learns_from == "finished",
            )
        )
        starts.append(resampled.start)
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
    else:
        steps = min(steps, most_steps)  # the traces' own span, not a last bin running past it
    services = [
        dataclasses.replace(s, rates=s.rates[:steps])
        for s in services
    ]
    return services, starts[0], steps


def run_scenario(
    scenario: Scenario,
    base_dir: Path,
    policy_names: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
    scenario_source: str = "",
    on_total_steps: Callable[[int], None] | None = None,
    forecast_workers: int = 0,
) -> SimulationResult:
    """Replay ``policy_names`` over the scenario. ``on_total_steps`` learns the number of steps that ``progress``
    will count to, once the traces are loaded. ``forecast_workers``: processes computing the forecasts beside the
    run (0: in this process; the same figures either way)."""
    if policy_names is None:
        policy_names = default_policies(scenario.training is not None)
    unknown = [name for name in policy_names if name not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICY_NAMES)})")
    services, start, steps = build_services(scenario, base_dir)
    runtimes = None
    if scenario.training is not None and scenario.training.generate is not None:
        runtimes = _trace_file("training.generate.runtimes", scenario.training.generate.runtimes, base_dir)
    jobs = build_jobs(scenario, base_dir, start, runtimes)
    capacity = capacity_config(scenario)
    # The rebalancer runs beside the controller's policies when enabled; stranded GPUs are measured for every policy
    # when the scenario has training or a rebalance block (the default scenario's report stays as it was).
    rebalance = rebalance_config(scenario)
    rebalancing = scenario.rebalance.enabled
    measuring = rebalancing or scenario.training is not None or "rebalance" in scenario.model_fields_set
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
            # The controller's lead time includes node boot when free GPUs are short: the burst pool's boot here.
            node_boot_s=max((p.boot_seconds for p in scenario.node_pools if p.burst), default=0.0),
            metrics_delay_s=scenario.metrics_delay_seconds,
            hpa_behavior=scenario.baselines.hpa_behavior,
            capacity=capacity,
            forecast_workers=forecast_workers,
        )
        runs[name] = simulate(
            policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
            scenario.metrics_delay_seconds, progress, Scoring(scenario.gpu_scoring), jobs,
            rebalance if rebalancing else None, rebalance if measuring else None,
        )
        runs[name].wall_seconds = time.perf_counter() - started
        runs[name].policy_object = policy
    oracle_hours = runs["oracle"].gpu_seconds / 3600.0 if "oracle" in runs else None
    costs = (scenario.capacity.training_gpu_hour_value, scenario.capacity.slo_miss_per_1k_requests)
    policies = {name: figures(runs[name], oracle_hours, costs) for name in policy_names}
    for name in policy_names:
        policies[name].update(forecast_figures(runs[name]))
    summary = {
        "name": scenario.name,
        "source": scenario_source,
        "step_seconds": scenario.step_seconds,
        "steps": steps,
        "simulated_days": steps * scenario.step_seconds / 86400.0,
        "training_source": scenario.training.source if scenario.training is not None else None,
        "training_jobs": len(jobs),
        "training_gpu_hours_asked": sum(job.work_s * job.gpus for job in jobs) / 3600.0,
        "gpu_scoring": scenario.gpu_scoring,
        "rebalance": scenario.rebalance.model_dump(by_alias=True) if measuring else None,
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
