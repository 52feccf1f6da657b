"""Benchmark: the controller's refit job (``autoscaler.forecasting.ForecastService.refit``) for 1,000 series.

Every series is 7 days of request rate at 60 s (10,080 samples) cut from the packaged ServeGen language m-large trace
(``autoscaler/data/servegen-m-large-14d-60s.csv.gz``, 14 days at 60 s), each with its own circular time shift and
scale, served by an in-memory metrics source. One refit round = for every series: read the history, score the
previous round's forecasts, fit the model and the seasonal-naive baseline, forecast one hour, publish. Rounds are
``refit_interval`` (900 s) of simulated time apart, so the window moves and the accountability scores accrue as in
production. For each model the same run measures 2 worker processes (the default) and 1 (in-process fits), after a
warm-up job per worker (process start and imports are paid once per controller, not per round).

Prints per model and worker count: median seconds per refit round over ``--rounds`` rounds, ms per series, the
speed-up of 2 workers over 1, failures, and peak RSS of the controller process and of the largest worker.

    python -m benchmarks.bench_refit                    # 1,000 series, 4 models, 3 rounds (about an hour on 2 cores)
    python -m benchmarks.bench_refit --models holt_winters --rounds 1
    python -m benchmarks.bench_refit --quick            # smoke run: 12 series, cheap models, 1 round
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, Observation, ServicePolicy
from autoscaler.forecasting import FitJob, FitRunner, ForecastService
from autoscaler.ports import Series
from autoscaler.settings import ForecastSettings
from autoscaler.telemetry import Telemetry
from autoscaler.traces import load_trace

TRACE = Path(__file__).resolve().parents[1] / "autoscaler" / "data" / "servegen-m-large-14d-60s.csv.gz"
STEP_S = 60.0
HISTORY_S = 7 * 86_400.0
REFIT_S = 900.0
T_END = 1_800_000_000.0  # a multiple of 60 s: the last round's "now"
MODELS = ("last_value", "seasonal_naive", "holt_winters", "quantile_gbm")
QUICK_MODELS = ("last_value", "seasonal_naive", "holt_winters")


class ArrayHistory:
    """The ``MetricsSource`` port over in-memory arrays, with a cheap range cut (the shared fake filters point by
    point in Python, which would dominate the parent's share of a 1,000-series round)."""

    def __init__(self, start: float, step_s: float, series: dict[str, np.ndarray]) -> None:
        self.start = start
        self.step_s = step_s
        self.series = series
        self.times = [start + i * step_s for i in range(max(len(v) for v in series.values()))]

    def observe(self, services: Sequence[ServicePolicy], now: float) -> Observation:
        return Observation(now, {})

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        values = self.series[service.key]
        lo = bisect.bisect_left(self.times, start)
        hi = min(bisect.bisect_right(self.times, end), values.size)
        return Series(tuple(self.times[lo:hi]), tuple(values[lo:hi].tolist()))


def make_series(count: int, seed: int = 5) -> tuple[float, dict[str, np.ndarray]]:
    """``count`` 14-day series from the packaged trace: random circular shift and scale (0.02x-2x, i.e. about 4 to
    400 req/s), ending at ``T_END``."""
    rates = np.asarray(load_trace(TRACE).rates, dtype=np.float64)
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        shifted = np.roll(rates, int(rng.integers(rates.size)))
        out[f"bench/svc{i}"] = shifted * float(rng.uniform(0.02, 2.0))
    start = T_END - (rates.size - 1) * STEP_S
    return start, out


def policies(keys: Sequence[str]) -> list[ServicePolicy]:
    return [
        ServicePolicy(
            "bench",
            key.split("/")[1],
            metric=MetricKind.REQUEST_RATE,
            target=5.0,
            max_replicas=100,
            forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.9),
        )
        for key in keys
    ]


def _rss_mb(pid: int | str = "self") -> float:
    """Peak resident set (VmHWM) of a live process, MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _warm(runner: FitRunner, model: str, workers: int) -> None:
    """Start every worker and import the model there, outside the timed rounds."""
    y = np.ones(4 * 1440)
    job = FitJob("warm", model, {}, y, 0.0, STEP_S, 60, (0.1, 0.5, 0.9), 0.9, 600.0)
    runner.run([job] * max(1, workers * 2))


def measure(model: str, workers: int, source: ArrayHistory, rounds: int) -> dict[str, Any]:
    settings = ForecastSettings(
        model=model,
        history_seconds=HISTORY_S,
        step_seconds=STEP_S,
        horizon_seconds=3600.0,
        workers=workers,
        fit_timeout_seconds=600.0,
        bootstrap_origins=0,  # steady state: the one-off bootstrap backtest of a new service is not a refit
    )
    runner = FitRunner(workers, settings.fit_timeout_seconds)
    service = ForecastService(
        settings,
        source,
        lambda: policies(list(source.series)),
        refit_interval_s=REFIT_S,
        telemetry=Telemetry(),
        runner=runner,
    )
    try:
        _warm(runner, model, workers)
        seconds, failures, fitted = [], 0, 0
        for i in range(rounds):
            now = T_END - (rounds - 1 - i) * REFIT_S
            t0 = time.perf_counter()
            report = service.refit(now)
            seconds.append(time.perf_counter() - t0)
            failures += len(report.failed) + len(report.no_data)
            fitted = len(report.ok)
        pool = runner._pool
        worker_pids = list((getattr(pool, "_processes", None) or {}).keys()) if pool is not None else []
        worker_rss = max((_rss_mb(pid) for pid in worker_pids), default=float("nan"))
    finally:
        runner.close()
    median = statistics.median(seconds)
    return {
        "model": model,
        "workers": workers,
        "series": len(source.series),
        "rounds": seconds,
        "round_s": median,
        "ms_per_series": 1000 * median / max(1, len(source.series)),
        "fitted": fitted,
        "failures": failures,
        "worker_rss_mb": worker_rss,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 12 series, cheap models, 1 round")
    parser.add_argument("--series", type=int, default=None, help="series per refit round (default 1000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed refit rounds per configuration (default 3)")
    parser.add_argument("--models", nargs="+", default=None, help=f"models (default: {' '.join(MODELS)})")
    parser.add_argument("--workers", type=int, default=2, help="worker processes compared with 1 (default 2)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    count = args.series or (12 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    start, data = make_series(count)
    source = ArrayHistory(start, STEP_S, data)
    print(
        f"## Refit rounds: {count} series x {int(HISTORY_S / STEP_S)} samples of {STEP_S:g} s, horizon 60 steps,"
        f" model + seasonal-naive baseline per series, median of {rounds} round(s), {os.cpu_count()} CPUs"
    )
    print(
        f"| {'model':<15} | {'workers':>7} | {'s per round':>11} | {'ms/series':>9} | {'speed-up':>8} |"
        f" {'failures':>8} | {'worker RSS MB':>13} |"
    )
    print(f"|{'-' * 17}|{'-' * 9}|{'-' * 13}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 15}|")
    rows = []
    started = time.perf_counter()
    for model in models:
        single = measure(model, 1, source, rounds)
        for row in (single, measure(model, args.workers, source, rounds)):  # each row printed as soon as measured
            speedup = single["round_s"] / row["round_s"] if row["round_s"] > 0 else float("nan")
            row["speedup_vs_1"] = speedup
            rss = "in-process" if row["workers"] == 1 else f"{row['worker_rss_mb']:.0f}"
            print(
                f"| {model:<15} | {row['workers']:>7} | {row['round_s']:11.2f} | {row['ms_per_series']:9.1f} |"
                f" {speedup:7.2f}x | {row['failures']:>8} | {rss:>13} |",
                flush=True,
            )
            rows.append(row)
    parent_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: controller process {parent_rss:.0f} MB; [{time.perf_counter() - started:.0f} s]")
    if args.json is not None:
        args.json.write_text(json.dumps({"series": count, "rounds": rounds, "rows": rows}, indent=2))
    failed = sum(r["failures"] for r in rows)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
