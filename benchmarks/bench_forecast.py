"""Benchmark: forecast quality by rolling-origin backtest on real traces, and the cost of refitting 1,000 series.

(a) Backtest table per model on
    * ServeGen ``language/m-large``: the ``rate`` column of every client's ``chunk-*-trace.csv.gz`` summed per 600 s
      window (14 days, 2,016 steps). Baseline: seasonal naive, daily (also shown: weekly);
    * Azure LLM inference 2023 ``conv`` and ``code``: one row per request over ~1 hour, binned to 10 s rates. An
      hour holds no daily season, so the daily seasonal-naive baseline falls back to the naive forecast (the last
      value): that is the baseline the ratio is divided by on these traces.
    Reported per model: MAE of the median (req/s), mean pinball loss / baseline (target <= 0.8), P10-P90 coverage,
    P90 coverage (target 85-95 %), median seconds per refit and per update, milliseconds per predict.
(b) Refit cost: every model refitted on 1,000 series (resampled real series: the 162 ServeGen m-large per-client
    series, last 7 days at 600 s, each randomly scaled and time-shifted) in a process pool of 2 workers, one
    OpenMP/BLAS thread each. Prints wall seconds per refit round for each model and for all models, median over
    ``--repeats`` rounds, and peak RSS of the parent and of the largest worker.

    python -m benchmarks.bench_forecast                 # full: (a) and (b), ~10 minutes (each part ~5)
    python -m benchmarks.bench_forecast --part refit    # only (b)
    python -m benchmarks.bench_forecast --quick         # smoke run, well under a minute
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

TRACES = Path(os.environ.get("AUTOSCALER_TRACES", "/work/shared/traces"))
SERVEGEN_GLOB = "alibaba-servegen/language/m-large/chunk-*-trace.csv.gz"
AZURE = "azure-llm-inference-2023/AzureLLMInferenceTrace_{name}.csv"
SERVEGEN_STEP_S = 600.0
AZURE_STEP_S = 10.0
PINBALL_TARGET = 0.8
COVERAGE_TARGET = (0.85, 0.95)
MODELS = (
    "seasonal_naive",
    "seasonal_naive_weekly",
    "last_value",
    "holt_winters",
    "fourier_arima",
    "quantile_gbm",
    "count_level",
    "phase_naive",
)


# -- data -------------------------------------------------------------------------------------------------------------
def servegen_clients(root: Path = TRACES) -> list[np.ndarray]:
    """Per-client request rate (req/s) per 600 s window, aligned on the common window grid (missing = 0)."""
    files = sorted(glob.glob(str(root / SERVEGEN_GLOB)))
    if not files:
        raise FileNotFoundError(f"no ServeGen chunks under {root / SERVEGEN_GLOB}")
    frames = [pd.read_csv(f, header=None, usecols=[0, 1], names=["t", "rate"]) for f in files]
    grid = np.unique(np.concatenate([f["t"].to_numpy() for f in frames]))
    out = []
    for frame in frames:
        series = frame.groupby("t")["rate"].sum().reindex(grid, fill_value=0.0)
        out.append(series.to_numpy(dtype=np.float64))
    return out


def servegen_total(root: Path = TRACES) -> tuple[np.ndarray, float]:
    return np.sum(servegen_clients(root), axis=0), 0.0


def azure_rates(name: str, step_s: float = AZURE_STEP_S, root: Path = TRACES) -> tuple[np.ndarray, float]:
    """Requests per second in ``step_s`` bins from the first request (start = its Unix time, floored to the bin)."""
    frame = pd.read_csv(root / AZURE.format(name=name), usecols=["TIMESTAMP"])
    times = pd.to_datetime(frame["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    start = math.floor(times.min() / step_s) * step_s
    counts = np.bincount(((times - start) // step_s).astype(np.int64))
    return counts / step_s, float(start)


# -- (a) backtests ----------------------------------------------------------------------------------------------------
@dataclass
class BacktestPlan:
    name: str
    y: np.ndarray
    start: float
    step_s: float
    horizon_steps: int
    n_origins: int
    origin_every: int
    refit_every: int
    baseline: str
    baseline_note: str


def backtest_plans(quick: bool) -> list[BacktestPlan]:
    servegen, sg_start = servegen_total()
    plans = []
    if quick:
        servegen = servegen[-4 * 144 :]
        sg_start = SERVEGEN_STEP_S * (2016 - servegen.size)
    plans.append(
        BacktestPlan(
            name="ServeGen m-large (sum of clients, 600 s)",
            y=servegen,
            start=sg_start,
            step_s=SERVEGEN_STEP_S,
            horizon_steps=6,  # 1 h: a refit period (the forecast is re-read each tick) plus the longest cold start
            n_origins=4 if quick else 500,  # the last ~7 days, every 20 min
            origin_every=2,
            refit_every=1 if quick else 6,  # refit every 2 h, conditioned on new data every 20 min in between
            baseline="seasonal_naive",
            baseline_note="seasonal naive, daily (value one day earlier)",
        )
    )
    for trace in ("conv", "code"):
        y, start = azure_rates(trace)
        plans.append(
            BacktestPlan(
                name=f"Azure LLM 2023 {trace} (10 s bins)",
                y=y,
                start=start,
                step_s=AZURE_STEP_S,
                horizon_steps=30,  # 300 s: the longest cold start in the issue
                n_origins=3 if quick else 200,  # every 10 s over the last ~38 min (20+ min of history each)
                origin_every=1,
                refit_every=1 if quick else 3,  # refit every 30 s, update every 10 s
                baseline="seasonal_naive",
                baseline_note="seasonal naive, which on a 1-hour trace falls back to naive (the last value)",
            )
        )
    return plans


def run_backtests(plans: Sequence[BacktestPlan], models: Sequence[str]) -> list[dict[str, Any]]:
    from forecast.registry import make_model
    from forecast.selection import select_model

    reports = []
    for plan in plans:
        names = list(dict.fromkeys([plan.baseline, *models]))
        candidates = {n: make_model(n, horizon_steps=plan.horizon_steps) for n in names}
        # The first origin must leave at least 20 min (Azure) or a week (ServeGen, for the weekly baseline) of history.
        min_train = plan.y.size - plan.horizon_steps - plan.origin_every * (plan.n_origins - 1)
        started = time.perf_counter()
        selection = select_model(
            plan.y,
            candidates,
            baseline=plan.baseline,
            step_s=plan.step_s,
            start=plan.start,
            horizon_steps=plan.horizon_steps,
            n_origins=plan.n_origins,
            origin_every=plan.origin_every,
            min_train_steps=max(1, min_train),
            refit_every=plan.refit_every,
        )
        rows: list[dict[str, Any]] = []
        for name in names:
            if name in selection.errors:
                rows.append({"model": name, "error": selection.errors[name]})
                continue
            result = selection.results[name]
            quality = result.quality
            rows.append(
                {
                    "model": name,
                    "label": result.model,
                    "n": quality.n,
                    "mae": quality.mae,
                    "pinball": quality.mean_pinball,
                    "pinball_ratio": selection.ratios[name],
                    "interval_coverage": quality.interval_coverage,
                    "upper_coverage": quality.upper_coverage,
                    "fit_s_median": statistics.median(result.fit_seconds) if result.fit_seconds else math.nan,
                    "update_s_median": statistics.median(result.update_seconds) if result.update_seconds else 0.0,
                    "predict_ms_median": 1000 * statistics.median(result.predict_seconds),
                    "fits": len(result.fit_seconds),
                }
            )
        first = next(iter(selection.results.values()))
        reports.append(
            {
                "trace": plan.name,
                "steps": int(plan.y.size),
                "step_s": plan.step_s,
                "horizon_s": plan.horizon_steps * plan.step_s,
                "origins": int(first.origins.size),
                "origin_every_s": plan.origin_every * plan.step_s,
                "refit_every": plan.refit_every,
                "baseline": plan.baseline,
                "baseline_label": selection.results[plan.baseline].model,
                "baseline_note": plan.baseline_note,
                "best": selection.best,
                "reliable": selection.reliable,
                "reason": selection.reason,
                "seconds": time.perf_counter() - started,
                "rows": rows,
            }
        )
        print_backtest(reports[-1])
    return reports


def _flag(ok: bool) -> str:
    return "ok" if ok else "MISS"


def print_backtest(report: dict[str, Any]) -> None:
    print(
        f"\n## {report['trace']}: {report['steps']} steps, horizon {report['horizon_s']:g} s, {report['origins']}"
        f" origins every {report['origin_every_s']:g} s, refit every {report['refit_every']} origin(s)"
    )
    print(f"baseline: {report['baseline_label']} = {report['baseline_note']}")
    header = (
        f"| {'model':<22} | {'MAE req/s':>9} | {'pinball/base':>12} | {'P10-P90 cov':>11} | {'P90 cov':>9} |"
        f" {'fit s':>7} | {'update s':>8} | {'predict ms':>10} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for row in report["rows"]:
        if "error" in row:
            print(f"| {row['model']:<22} | failed: {row['error']} |")
            continue
        ratio_ok = row["pinball_ratio"] <= PINBALL_TARGET
        cov_ok = COVERAGE_TARGET[0] <= row["upper_coverage"] <= COVERAGE_TARGET[1]
        mark = "*" if row["model"] == report["best"] else ""
        print(
            f"| {row['model'] + mark:<22} | {row['mae']:9.3f} | {row['pinball_ratio']:7.3f} {_flag(ratio_ok):>4} |"
            f" {100 * row['interval_coverage']:10.1f}% | {100 * row['upper_coverage']:5.1f}% {_flag(cov_ok):>2} |"
            f" {row['fit_s_median']:7.3f} | {row['update_s_median']:8.3f} | {row['predict_ms_median']:10.2f} |"
        )
    print(f"selected: {report['best']} ({'reliable' if report['reliable'] else 'NOT reliable'}: {report['reason']})")
    print(f"[{report['seconds']:.0f} s]")


# -- (b) refit cost ---------------------------------------------------------------------------------------------------
def refit_series(count: int, days: float, seed: int = 11) -> list[np.ndarray]:
    """``count`` series resampled from the real ServeGen clients: random client, scale and circular time shift."""
    clients = [c for c in servegen_clients() if c.sum() > 0]
    steps = int(days * 86_400 / SERVEGEN_STEP_S)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        client = clients[int(rng.integers(len(clients)))]
        shifted = np.roll(client, int(rng.integers(client.size)))
        out.append(shifted[-steps:] * float(rng.uniform(0.5, 5.0)))
    return out


def _init_worker() -> None:
    # One thread per worker: two workers already use both cores, and BLAS/OpenMP threads would only contend.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    import forecast.registry

    # Pay the imports once per worker, outside the timed rounds.
    for name in MODELS:
        forecast.registry.make_model(name)


def _fit_batch(name: str, batch: list[np.ndarray], step_s: float, horizon_steps: int) -> tuple[list[float], int]:
    from forecast.registry import make_model

    seconds, failures = [], 0
    for y in batch:
        t0 = time.perf_counter()
        try:
            make_model(name, horizon_steps=horizon_steps).fit(y, start=0.0, step_s=step_s).predict(horizon_steps)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError):
            failures += 1
        seconds.append(time.perf_counter() - t0)
    return seconds, failures


def _worker_rss(_: int = 0) -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_refit(series: list[np.ndarray], models: Sequence[str], workers: int, repeats: int) -> dict[str, Any]:
    horizon = 6
    batch_size = max(1, math.ceil(len(series) / (workers * 8)))
    batches = [series[i : i + batch_size] for i in range(0, len(series), batch_size)]
    per_model: dict[str, dict[str, float]] = {}
    print(
        f"\n## Refit cost: {len(series)} series x {series[0].size} steps of {SERVEGEN_STEP_S:g} s,"
        f" {workers} worker processes, horizon {horizon} steps, median of {repeats} round(s)"
    )
    print(f"| {'model':<22} | {'s per round':>11} | {'fit s median':>12} | {'fit s p95':>9} | {'failures':>8} |")
    print(f"|{'-' * 24}|{'-' * 13}|{'-' * 14}|{'-' * 11}|{'-' * 10}|")
    started = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=workers, initializer=_init_worker) as pool:
        list(pool.map(_worker_rss, range(workers)))  # start and warm every worker before timing
        for name in models:
            rounds, fit_times, failures = [], [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                results = list(
                    pool.map(
                        _fit_batch,
                        [name] * len(batches),
                        batches,
                        [SERVEGEN_STEP_S] * len(batches),
                        [horizon] * len(batches),
                    )
                )
                rounds.append(time.perf_counter() - t0)
                fit_times = [s for secs, _ in results for s in secs]
                failures = sum(f for _, f in results)
            per_model[name] = {
                "round_s": statistics.median(rounds),
                "fit_s_median": statistics.median(fit_times),
                "fit_s_p95": float(np.percentile(fit_times, 95)),
                "failures": failures,
            }
            row = per_model[name]
            print(
                f"| {name:<22} | {row['round_s']:11.1f} | {row['fit_s_median']:12.4f} | {row['fit_s_p95']:9.4f} |"
                f" {failures:8d} |"
            )
        worker_rss = max(pool.map(_worker_rss, range(workers * 4)))
    total = sum(row["round_s"] for row in per_model.values())
    parent_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"| {'all models':<22} | {total:11.1f} | {'':>12} | {'':>9} | {'':>8} |")
    print(
        f"peak RSS: parent {parent_rss / 1024:.0f} MB, largest worker {worker_rss / 1024:.0f} MB;"
        f" {total / len(series) * 1000:.0f} ms of wall time per series per round (all models);"
        f" [{time.perf_counter() - started:.0f} s]"
    )
    return {
        "series": len(series),
        "steps": int(series[0].size),
        "workers": workers,
        "repeats": repeats,
        "models": per_model,
        "all_models_round_s": total,
        "parent_rss_mb": parent_rss / 1024,
        "worker_rss_mb": worker_rss / 1024,
    }


# -- main -------------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (a few origins, 6 series)")
    parser.add_argument("--part", choices=("all", "backtest", "refit"), default="all", help="which part to run")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--series", type=int, default=None, help="series in the refit round (default 1000)")
    parser.add_argument("--days", type=float, default=7.0, help="days of 600 s history per refit series")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the refit round")
    parser.add_argument("--repeats", type=int, default=1, help="refit rounds per model (the median is printed)")
    parser.add_argument("--json", dest="json_out", default=None, help="write all figures as JSON to this file")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]

    load = os.getloadavg()[0]
    print(
        f"# bench_forecast: {os.cpu_count()} CPUs, load average {load:.2f} at start{' (quick)' if args.quick else ''}"
    )
    if load > 1.0:
        print("note: other processes are using the CPU; seconds below are inflated accordingly")
    out: dict[str, Any] = {"quick": args.quick, "load_average_start": load}
    if args.part in ("all", "backtest"):
        out["backtests"] = run_backtests(backtest_plans(args.quick), models)
    if args.part in ("all", "refit"):
        count = args.series if args.series is not None else (6 if args.quick else 1000)
        days = 3.0 if args.quick else args.days
        out["refit"] = run_refit(refit_series(count, days), models, args.workers, args.repeats)
    out["load_average_end"] = os.getloadavg()[0]
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
