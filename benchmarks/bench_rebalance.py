"""Benchmark: the rebalancer on the packaged mixed scenario (inference + training on a full cluster, issue 15).

For this project's controller (``predictive``: forecasts + capacity arbitration), without and with the rebalancer
(the scenario's ``rebalance`` block, defaults unless the scenario sets them: a pass every 300 s, at most 2 pods per
pass and 8 per hour, 2 GPUs made usable per pod moved), under three GPU scorings of the simulated scheduler
(``MostAllocated``: bin-packing; the default ``LeastAllocated``; and ``Fragmentation``: ``LeastAllocated`` plus this
project's scheduler extender at its shipped weight, FGD for the live pods' task mix), over several training seeds
(the jobs drawn from the Philly runtimes), it prints: share of requests within the SLO, GPU-hours of inference, burst
GPU-hours and money, GPUs stranded by fragmentation (free, on nodes where none of the waiting pods fits: mean and
GPU-hours), training GPU-hours done and lost, gangs stopped, rebalance moves (pods evicted by the rebalancer) and the
most in any hour (never above the bound), the total cost (burst money + lost training GPU-hours x their value +
requests outside the SLO, as ``bench_arbitration``), then the means per configuration, the median wall time per run
and the peak RSS of the process.

    python -m benchmarks.bench_rebalance                  # 3 seeds, 3 days each, 6 configurations (~10 min)
    python -m benchmarks.bench_rebalance --seeds 12 --days 1 --scorings MostAllocated
    python -m benchmarks.bench_rebalance --scorings MostAllocated --rebalance burstEmptyBelow=0.75
    python -m benchmarks.bench_rebalance --capacity chooseScaleDownReplicas=true   # a scale-down's replicas chosen
    python -m benchmarks.bench_rebalance --quick          # one seed, 6 hours (what the tests run)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import SCENARIO_DIR, load_scenario

FIELDS = (
    ("slo_attainment", "in SLO", "{:.2%}"),
    ("gpu_hours", "GPU-h", "{:,.0f}"),
    ("burst_gpu_hours", "burst GPU-h", "{:,.1f}"),
    ("burst_cost", "burst $", "{:,.0f}"),
    ("stranded_gpus_mean", "stranded", "{:,.2f}"),
    ("stranded_gpu_hours", "stranded GPU-h", "{:,.0f}"),
    ("training_gpu_hours", "train done", "{:,.0f}"),
    ("lost_training_gpu_hours", "train lost", "{:,.1f}"),
    ("preemptions", "stopped", "{:,.0f}"),
    ("rebalance_moves", "moves", "{:,.0f}"),
    ("rebalance_moves_max_per_hour", "moves/h max", "{:,.0f}"),
    ("total_cost", "total $", "{:,.0f}"),
)


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="12,13,14", help="comma-separated training seeds")
    parser.add_argument("--days", type=float, default=3.0, help="simulated days per run")
    parser.add_argument(
        "--scorings", default="MostAllocated,LeastAllocated,Fragmentation",
        help="GPU scorings of the simulated scheduler (Fragmentation: LeastAllocated + the project's extender)",
    )
    parser.add_argument("--policy", default="predictive", help="the controller's policy (predictive or reactive)")
    parser.add_argument(
        "--rebalance", default="", metavar="FIELD=VALUE,...",
        help="override fields of the scenario's rebalance block, e.g. burstEmptyBelow=0.75,maxMovesPerHour=4",
    )
    parser.add_argument(
        "--capacity", default="", metavar="FIELD=VALUE,...",
        help="override fields of the scenario's capacity block in every run, e.g. chooseScaleDownReplicas=true",
    )
    parser.add_argument("--quick", action="store_true", help="one seed, 6 hours (the test suite's smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.days = "12", 0.25
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    scorings = [s for s in args.scorings.split(",") if s.strip()]

    base_scenario, base_dir = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    assert base_scenario.training is not None and base_scenario.training.generate is not None
    overrides: dict[str, Any] = dict(base_scenario.rebalance.model_dump(by_alias=True))
    for item in (part for part in args.rebalance.split(",") if part.strip()):
        key, _, value = item.partition("=")
        overrides[key.strip()] = value.strip()
    block = type(base_scenario.rebalance).model_validate(overrides)
    capacity_fields: dict[str, Any] = dict(base_scenario.capacity.model_dump(by_alias=True))
    for item in (part for part in args.capacity.split(",") if part.strip()):
        key, _, value = item.partition("=")
        capacity_fields[key.strip()] = value.strip()
    capacity = type(base_scenario.capacity).model_validate(capacity_fields)
    bound = block.max_moves_per_hour
    print(
        f"mixed-training: {args.days:g} days at {base_scenario.step_seconds:g} s, seeds {seeds}, policy {args.policy}; "
        f"rebalancer: a pass every {block.interval_seconds:g} s, <= {block.max_moves_per_pass} pods/pass, "
        f"<= {bound} pods/hour, >= {block.min_gain_per_move:g} GPUs per pod moved"
        + (f"; capacity: {args.capacity}" if args.capacity.strip() else "")
    )
    configs = [(scoring, on) for scoring in scorings for on in (False, True)]
    label = {c: f"{c[0]}{' +rebalance' if c[1] else ''}" for c in configs}
    width = max(len(v) for v in label.values())
    cols = [max(len(h), 7) for _, h, _ in FIELDS]
    heads = "".join(f" {h:>{w}}" for (_, h, _), w in zip(FIELDS, cols, strict=True))
    print(f"{'seed':>4} {'configuration':<{width}}{heads} {'wall s':>7}")
    results: dict[tuple[str, bool], list[dict[str, Any]]] = {c: [] for c in configs}
    walls: dict[tuple[str, bool], list[float]] = {c: [] for c in configs}
    for seed in seeds:
        generate = base_scenario.training.generate.model_copy(update={"seed": seed})
        training = base_scenario.training.model_copy(update={"generate": generate})
        for config in configs:
            scoring, on = config
            scenario = base_scenario.model_copy(
                update={
                    "training": training,
                    "duration_seconds": args.days * 86400.0,
                    "gpu_scoring": scoring,
                    "rebalance": block.model_copy(update={"enabled": on}),
                    "capacity": capacity,
                }
            )
            started = time.perf_counter()
            result = run_scenario(scenario, Path(base_dir), (args.policy,))
            wall = time.perf_counter() - started
            walls[config].append(wall)
            figures = result.report["policies"][args.policy]
            results[config].append(figures)
            cells = "".join(
                f" {_cell(figures[key], fmt):>{w}}" for (key, _, fmt), w in zip(FIELDS, cols, strict=True)
            )
            print(f"{seed:>4} {label[config]:<{width}}{cells} {wall:>7.1f}", flush=True)
    print(f"mean over {len(seeds)} seed(s)")
    for config in configs:
        cells = ""
        for (key, _, fmt), w in zip(FIELDS, cols, strict=True):
            values = [r[key] for r in results[config] if r[key] is not None]
            cells += f" {_cell(statistics.fmean(values) if values else None, fmt):>{w}}"
        print(f"{'':>4} {label[config]:<{width}}{cells} {statistics.median(walls[config]):>7.1f}")
    most = max((int(r["rebalance_moves_max_per_hour"] or 0) for c in configs for r in results[c]), default=0)
    print(f"most rebalance moves in any hour: {most} (bound {bound}: {'held' if most <= bound else 'BROKEN'})")
    every = [w for c in configs for w in walls[c]]
    print(f"median wall per run {statistics.median(every):.1f} s over {len(every)} runs")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    return 0 if most <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
