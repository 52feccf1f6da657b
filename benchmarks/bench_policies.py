"""Benchmark: simulated steps per second of every policy on the packaged default scenario (14 days at 15 s).

Prints, per policy, the median wall time of ``--repeats`` runs, steps per second and the figures the run produced
(so that a speed-up that changes the answer shows), then the peak RSS. The baseline in the same run is the ``hpa``
policy: issue 14 asks ``predictive`` to come within 3x of it.

    python -m benchmarks.bench_policies                 # all policies, 3 runs each
    python -m benchmarks.bench_policies --days 1 --repeats 1 --policies hpa,predictive

It only uses ``make_policy`` and ``simulate``, whose signatures predate the one-tick engine (issue 11), so the same
file measures an older checkout too: ``PYTHONPATH=<old tree> python benchmarks/bench_policies.py``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

from autoscaler.sim.engine import simulate
from autoscaler.sim.registry import POLICY_NAMES, make_policy
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated policy names")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy (median reported)")
    parser.add_argument("--days", type=float, default=None, help="simulate only this many days (default: all 14)")
    args = parser.parse_args(argv)

    import autoscaler.sim.run as run_module

    path = Path(run_module.__file__).parent / "scenarios" / "default.yaml"
    scenario, base = load_scenario(path)
    services, start, steps = build_services(scenario, base)
    if args.days is not None:
        steps = min(steps, int(args.days * 86400 / scenario.step_seconds))
    node_boot = max((p.boot_seconds for p in scenario.node_pools if p.burst), default=0.0)
    print(f"default scenario: {steps:,} steps of {scenario.step_seconds:g} s, {len(services)} service(s)")
    print(f"{'policy':<11} {'runs':>4} {'median s':>9} {'steps/s':>9} {'in SLO':>8} {'GPU-h':>8} {'actions':>8}")
    rates: dict[str, float] = {}
    for name in args.policies.split(","):
        walls = []
        for _ in range(args.repeats):
            policy = make_policy(
                name,
                scenario.baselines.hpa_target_utilization,
                scenario.baselines.static_headroom,
                scenario.forecasting.to_config(),
                node_boot_s=node_boot,
                metrics_delay_s=scenario.metrics_delay_seconds,
                hpa_behavior=scenario.baselines.hpa_behavior,
            )
            started = time.perf_counter()
            run = simulate(
                policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
                scenario.metrics_delay_seconds,
            )
            walls.append(time.perf_counter() - started)
        wall = statistics.median(walls)
        rates[name] = steps / wall
        within = run.requests_in_slo_steps / run.requests if run.requests else 1.0
        print(
            f"{name:<11} {args.repeats:>4} {wall:>9.2f} {steps / wall:>9,.0f} {within:>8.2%} "
            f"{run.gpu_seconds / 3600:>8,.1f} {run.scale_actions:>8,d}"
        )
    if "hpa" in rates:
        for name, rate in rates.items():
            if name != "hpa":
                print(f"  {name}: {rates['hpa'] / rate:.2f}x slower than hpa")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
