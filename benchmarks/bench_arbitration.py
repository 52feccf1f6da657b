"""Benchmark: capacity arbitration on the packaged mixed scenario (inference + training on a full cluster).

For this project's controller (``predictive``: forecasts + capacity arbitration) and the two baselines beside it --
``kube-preemption`` (the same replica scaling, the kube-scheduler's pod-by-pod DefaultPreemption and a
Cluster-Autoscaler-like node loop) and ``burst-only`` (no preemption, the node loop alone) -- over several training
seeds (the jobs drawn from the Philly runtimes), it prints: share of requests within the SLO, training GPU-hours
done and lost, gangs stopped, burst GPU-hours and money, the total cost in one currency (burst money + lost training
GPU-hours x their value + requests outside the SLO), then the means, the ratio of lost work against
``kube-preemption``, the median wall time per run and the peak RSS.

    python -m benchmarks.bench_arbitration                  # 3 seeds, 3 days each (about 4 minutes here)
    python -m benchmarks.bench_arbitration --seeds 12 --days 1
    python -m benchmarks.bench_arbitration --quick          # one seed, 6 hours (what the tests run)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import SCENARIO_DIR, load_scenario

POLICIES = ("predictive", "kube-preemption", "burst-only")
FIELDS = (
    ("slo_attainment", "in SLO", "{:.2%}"),
    ("training_gpu_hours", "train done", "{:,.0f}"),
    ("lost_training_gpu_hours", "train lost", "{:,.1f}"),
    ("preemptions", "stopped", "{:,d}"),
    ("burst_gpu_hours", "burst GPU-h", "{:,.1f}"),
    ("burst_cost", "burst $", "{:,.0f}"),
    ("total_cost", "total $", "{:,.0f}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="12,13,14", help="comma-separated training seeds")
    parser.add_argument("--days", type=float, default=3.0, help="simulated days per run")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--quick", action="store_true", help="one seed, 6 hours (the test suite's smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.days = "12", 0.25
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    policies = [p for p in args.policies.split(",") if p.strip()]

    base_scenario, base_dir = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    assert base_scenario.training is not None and base_scenario.training.generate is not None
    print(f"mixed-training: {args.days:g} days at {base_scenario.step_seconds:g} s, seeds {seeds}")
    header = f"{'seed':>4} {'policy':<16}" + "".join(f" {label:>12}" for _, label, _ in FIELDS) + f" {'wall s':>7}"
    print(header)
    results: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    walls: list[float] = []
    for seed in seeds:
        generate = base_scenario.training.generate.model_copy(update={"seed": seed})
        training = base_scenario.training.model_copy(update={"generate": generate})
        scenario = base_scenario.model_copy(
            update={"training": training, "duration_seconds": args.days * 86400.0}
        )
        for name in policies:
            started = time.perf_counter()
            result = run_scenario(scenario, Path(base_dir), (name,))
            wall = time.perf_counter() - started
            walls.append(wall)
            figures = result.report["policies"][name]
            results[name].append(figures)
            cells = "".join(f" {fmt.format(figures[key]):>12}" for key, _, fmt in FIELDS)
            print(f"{seed:>4} {name:<16}{cells} {wall:>7.1f}", flush=True)
    print("mean")
    means: dict[str, dict[str, float]] = {}
    for name in policies:
        means[name] = {key: statistics.fmean(float(r[key]) for r in results[name]) for key, _, _ in FIELDS}
        cells = "".join(
            f" {(fmt.format(round(means[name][key])) if key == 'preemptions' else fmt.format(means[name][key])):>12}"
            for key, _, fmt in FIELDS
        )
        print(f"{'':>4} {name:<16}{cells}")
    if "predictive" in means and "kube-preemption" in means:
        ours, kube = means["predictive"], means["kube-preemption"]
        kube_lost = kube["lost_training_gpu_hours"]
        ratio = ours["lost_training_gpu_hours"] / kube_lost if kube_lost else 0.0
        print(
            f"lost training GPU-hours, predictive / kube-preemption: {ratio:.2f} (target <= 0.5); "
            f"SLO {ours['slo_attainment']:.2%} vs {kube['slo_attainment']:.2%}"
        )
        cheapest = min(means, key=lambda n: means[n]["total_cost"])
        print(f"lowest mean total cost: {cheapest} ({means[cheapest]['total_cost']:,.0f} $)")
    print(f"median wall per run {statistics.median(walls):.1f} s over {len(walls)} runs")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
