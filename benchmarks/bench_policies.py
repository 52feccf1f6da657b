"""Benchmark: simulated steps per second of every policy on the packaged default scenario (14 days at 15 s).

Prints, per policy, the median wall time of ``--repeats`` runs, steps per second, its ratio to the ``hpa`` baseline
(issue 14 asks ``predictive`` to come within 3x of it), the peak RSS of the process that ran it and the figures the
run produced (so that a speed-up that changes the answer shows).

    python -m benchmarks.bench_policies                         # all policies, 3 runs each, 14 days
    python -m benchmarks.bench_policies --days 1 --repeats 1 --policies hpa,predictive
    python -m benchmarks.bench_policies --case gaps             # the same trace with gap windows (rate 0)

Cases: ``default`` the packaged scenario as it is; ``gaps`` the same scenario whose demand is 0 for the first 3 hours
of every 12 (a service drained at night, a trace with holes: the forecaster sees long runs of equal values).
``--services N``: a fleet of N copies of the service, the k-th with its demand shifted by k x 7 hours (so their
window edges and peaks do not coincide), on N times the on-prem nodes and burst limit: what replaying a fleet's
history before enabling the controller costs (steps/s are then fleet steps, every service ticked at each).

Each policy runs in its own child process (forked), so that the peak RSS is that policy's. It only uses
``make_policy``, ``simulate`` and ``build_services``, whose signatures predate the one-tick engine (issue 11), so the
same file measures an older checkout too: ``PYTHONPATH=<old tree> python benchmarks/bench_policies.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.sim.engine import simulate
from autoscaler.sim.registry import POLICY_NAMES, make_policy
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario

CASES = ("default", "gaps")
GAP_EVERY_S = 12 * 3600.0
GAP_LENGTH_S = 3 * 3600.0


FLEET_SHIFT_S = 7 * 3600.0


def _setup(case: str, days: float | None, fleet: int = 1) -> tuple[Any, list[Any], float, int]:
    import autoscaler.sim.run as run_module

    path = Path(run_module.__file__).parent / "scenarios" / "default.yaml"
    scenario, base = load_scenario(path)
    services, start, steps = build_services(scenario, base)
    if days is not None:
        steps = min(steps, int(days * 86400 / scenario.step_seconds))
    if case == "gaps":
        gapped = []
        for service in services:
            rates = np.array(service.rates, dtype=np.float64)
            offset = np.arange(rates.size) * scenario.step_seconds
            rates[(offset % GAP_EVERY_S) < GAP_LENGTH_S] = 0.0
            gapped.append(dataclasses.replace(service, rates=rates))
        services = gapped
    if fleet > 1:
        copies = []
        for k in range(fleet):
            for service in services:
                shift = round(k * FLEET_SHIFT_S / scenario.step_seconds) % len(service.rates)
                policy = dataclasses.replace(service.policy, name=f"{service.policy.name}-{k}")
                rates = np.roll(np.asarray(service.rates, dtype=np.float64), -shift)
                copies.append(dataclasses.replace(service, policy=policy, rates=rates))
        services = copies
        pools = [
            pool.model_copy(update={"nodes": pool.nodes * fleet, "max_nodes": (pool.max_nodes or 0) * fleet or None})
            for pool in scenario.node_pools
        ]
        scenario = scenario.model_copy(update={"node_pools": pools})
    return scenario, services, start, steps


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the forecasting workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run_policy(
    case: str, days: float | None, name: str, repeats: int, fleet: int = 1, workers: int = 0
) -> dict[str, Any]:
    scenario, services, start, steps = _setup(case, days, fleet)
    node_boot = max((p.boot_seconds for p in scenario.node_pools if p.burst), default=0.0)
    walls, cpus = [], []
    # only when asked: an older checkout's make_policy has no forecast_workers
    extra = {"forecast_workers": workers} if workers else {}
    for _ in range(repeats):
        policy = make_policy(
            name,
            scenario.baselines.hpa_target_utilization,
            scenario.baselines.static_headroom,
            scenario.forecasting.to_config(),
            node_boot_s=node_boot,
            metrics_delay_s=scenario.metrics_delay_seconds,
            hpa_behavior=scenario.baselines.hpa_behavior,
            **extra,
        )
        cpu = _cpu_seconds()
        started = time.perf_counter()
        run = simulate(
            policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
            scenario.metrics_delay_seconds,
        )  # fmt: skip
        walls.append(time.perf_counter() - started)
        cpus.append(_cpu_seconds() - cpu)
    return {
        "walls": walls,
        "cpus": cpus,
        "steps": steps,
        "within": run.requests_in_slo_steps / run.requests if run.requests else 1.0,
        "gpu_hours": run.gpu_seconds / 3600,
        "actions": run.scale_actions,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _child(conn: Any, policy_args: tuple[Any, ...]) -> None:
    conn.send(_run_policy(*policy_args))
    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated policy names")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy (median reported)")
    parser.add_argument("--days", type=float, default=None, help="simulate only this many days (default: all 14)")
    parser.add_argument("--case", choices=CASES, default="default", help="the scenario as packaged, or with gaps")
    parser.add_argument("--services", type=int, default=1, help="a fleet: this many copies of the service")
    parser.add_argument("--in-process", action="store_true", help="run every policy in this process (no fork)")
    parser.add_argument(
        "--forecast-workers",
        type=int,
        default=0,
        help="processes computing the forecasting policies' forecasts beside the run (0: in the run's process)",
    )
    args = parser.parse_args(argv)
    if args.services < 1:
        parser.error("--services must be at least 1")

    scenario, services, _, steps = _setup(args.case, args.days, args.services)
    load = os.getloadavg()[0]
    print(
        f"{args.case} case: {steps:,} steps of {scenario.step_seconds:g} s, {len(services)} service(s); "
        f"load average {load:.2f} on {os.cpu_count()} CPUs at the start"
    )
    header = f"{'policy':<16} {'runs':>4} {'median s':>9} {'steps/s':>9} {'x hpa':>6} {'CPU s':>7} {'x hpa':>6}"
    print(f"{header} {'RSS MiB':>8} {'in SLO':>8} {'GPU-h':>8} {'actions':>8}")
    results: dict[str, dict[str, Any]] = {}
    names = args.policies.split(",")
    context = multiprocessing.get_context("fork")
    run_args = (args.case, args.days)
    for name in names:
        policy_args = (*run_args, name, args.repeats, args.services, args.forecast_workers)
        if args.in_process:
            results[name] = _run_policy(*policy_args)
        else:
            # a plain (non-daemon) child, so that it may start forecasting workers of its own
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(send, policy_args))
            child.start()
            send.close()
            results[name] = receive.recv()
            child.join()
    hpa = results.get("hpa")
    hpa_rate = hpa["steps"] / statistics.median(hpa["walls"]) if hpa else None
    hpa_cpu = statistics.median(hpa["cpus"]) if hpa else None
    for name in names:
        r = results[name]
        wall, cpu = statistics.median(r["walls"]), statistics.median(r["cpus"])
        rate = r["steps"] / wall
        ratio = f"{hpa_rate / rate:>6.2f}" if hpa_rate else f"{'-':>6}"
        cpu_ratio = f"{cpu / hpa_cpu:>6.2f}" if hpa_cpu else f"{'-':>6}"
        print(
            f"{name:<16} {args.repeats:>4} {wall:>9.2f} {rate:>9,.0f} {ratio} {cpu:>7.2f} {cpu_ratio} "
            f"{r['rss_mib']:>8,.0f} {r['within']:>8.2%} {r['gpu_hours']:>8,.1f} {r['actions']:>8,d}"
        )
    print(
        f"x hpa: how many times slower than hpa (wall clock; CPU: seconds of CPU, forecasting workers included); "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this (parent) process {peak:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
