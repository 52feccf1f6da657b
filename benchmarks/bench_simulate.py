"""Benchmark: simulated steps per second for a 14-day trace at 15 s steps with 50 services.

Prints the median wall time of several runs of this project's ``reactive`` policy, the same figure for the ``hpa``
baseline and the ``oracle`` (same run, same machine), service-steps per second, and peak RSS. Target (issue 2):
the whole 14-day, 50-service run within 60 s on 2 cores.

    python -m benchmarks.bench_simulate            # full size
    python -m benchmarks.bench_simulate --quick    # 1 day, 5 services (smoke run)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.sim.engine import simulate
from autoscaler.sim.registry import make_policy
from autoscaler.sim.run import build_services, resolve_trace
from autoscaler.sim.scenario import parse_scenario
from autoscaler.traces import load_trace, write_rate_series


def make_scenario(services: int, days: float, trace_dir: Path) -> dict[str, Any]:
    """``services`` services on the packaged ServeGen trace, each with its own scale and a time shift, so that
    their peaks do not coincide (as in a real cluster)."""
    base = load_trace(resolve_trace("builtin:servegen-m-large", Path(".")), step_s=60.0)
    rng = np.random.default_rng(7)
    entries = []
    for index in range(services):
        shift = int(rng.integers(0, len(base.rates)))
        rates = np.roll(base.rates, shift)
        path = trace_dir / f"svc{index}.csv"
        write_rate_series(type(base)(base.start, base.step_s, rates, f"shifted {shift}"), path)
        entries.append(
            {
                "metadata": {"name": f"svc{index}", "namespace": "bench"},
                "spec": {
                    "targetRef": {"name": f"svc{index}"},
                    "minReplicas": 1,
                    "maxReplicas": 64,
                    "metric": {"type": "request_rate", "target": 2.5},
                    "latency": {"sloSeconds": 4.0},
                    "coldStartSeconds": float(rng.choice([30, 90, 300])),
                    "priority": int(rng.integers(0, 1000)),
                },
                "simulation": {
                    "trace": str(path),
                    "traceScale": float(rng.uniform(0.02, 0.1)),
                    "throughputPerReplica": 3.5,
                    "baseLatencySeconds": 2.0,
                },
            }
        )
    return {
        "name": f"bench-{services}x{days:g}d",
        "stepSeconds": 15,
        "durationSeconds": days * 86400,
        "nodePools": [
            {"name": "onprem", "gpusPerNode": 8, "nodes": services * 2},
            {"name": "burst", "gpusPerNode": 8, "nodes": 0, "burst": True, "maxNodes": services, "bootSeconds": 300,
             "pricePerGpuHour": 4.1},
        ],
        "services": entries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 day, 5 services, 1 repeat")
    parser.add_argument("--services", type=int, default=50, help="number of services")
    parser.add_argument("--days", type=float, default=14.0, help="simulated days")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the project's policy (median reported)")
    args = parser.parse_args(argv)
    if args.quick:
        args.services, args.days, args.repeat = 5, 1.0, 1
    with tempfile.TemporaryDirectory() as tmp:
        scenario = parse_scenario(make_scenario(args.services, args.days, Path(tmp)))
        started = time.perf_counter()
        services, start, steps = build_services(scenario, Path(tmp))
        load_s = time.perf_counter() - started
    service_steps = steps * len(services)
    print(f"scenario: {len(services)} services x {steps:,} steps of {scenario.step_seconds:g} s "
          f"({args.days:g} days) = {service_steps:,} service-steps; traces loaded in {load_s:.2f} s")
    rows = []
    for name, repeat in (("reactive", args.repeat), ("hpa", 1), ("oracle", 1)):
        times = []
        for _ in range(repeat):
            policy = make_policy(name)
            began = time.perf_counter()
            run = simulate(policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
                           scenario.metrics_delay_seconds)
            times.append(time.perf_counter() - began)
        median = statistics.median(times)
        rows.append((name, repeat, median, steps / median, service_steps / median, run.gpu_seconds / 3600))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'policy':<10} {'runs':>4} {'median s':>9} {'steps/s':>9} {'service-steps/s':>16} {'GPU-hours':>10}")
    for name, repeat, median, per_step, per_service_step, gpu_hours in rows:
        print(f"{name:<10} {repeat:>4} {median:>9.2f} {per_step:>9,.0f} {per_service_step:>16,.0f} {gpu_hours:>10,.0f}")
    print(f"peak RSS: {peak_mib:,.0f} MiB")
    target = rows[0][2]
    verdict = "within" if target <= 60 else "OVER"
    print(f"reactive policy, whole run: {target:.1f} s ({verdict} the 60 s target on this machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
