"""``autoscaler backtest``: compare demand forecasters on a trace by rolling-origin backtest.

autoscaler backtest TRACE [--models a,b,...] [--horizon SECONDS] [--step SECONDS] [--origins N]
                          [--origin-every SECONDS] [--refit-every N] [--train-window SECONDS]
                          [--quantiles 0.1,0.5,0.9] [--baseline NAME] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from autoscaler.traces import PACKAGED_TRACES, load_trace, packaged_trace_path
from autoscaler.traces.convert import resolved_path
from autoscaler.traces.formats import RateSeries, write_texts

DEFAULT_HORIZON_S = 3600.0
DEFAULT_ORIGINS = 24


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keep the hand-wrapped description and epilog; each option's help states its own default and unit."""


def register(subparsers: Any) -> None:
    """Add ``backtest`` to the top-level ``autoscaler`` parser."""
    from forecast.registry import BASELINE, available_models

    models = "\n".join(
        textwrap.fill(f"{name}: {text}", width=100, initial_indent="  ", subsequent_indent="      ")
        for name, text in available_models().items()
    )
    parser = subparsers.add_parser(
        "backtest",
        help="compare demand forecasters on a trace (rolling-origin backtest)",
        description=(
            "Rolling-origin backtest of demand forecasters on a request-rate trace: at each origin every model is\n"
            "fitted on the history before it and forecasts the next --horizon seconds; the forecasts are scored\n"
            "against what happened. Prints, per model: MAE of the median (req/s), mean pinball loss divided by the\n"
            "baseline's (below 1 = better than the baseline; the issue's target is <= 0.8), the share of actuals\n"
            "inside the lowest..highest quantile, the share at or below the highest quantile, and the mean seconds\n"
            "per fit. The selected model (lowest pinball, >= 5 % better than the baseline) is marked with '*'."
        ),
        epilog=f"models:\n{models}\n\npackaged traces (usable as TRACE): {', '.join(PACKAGED_TRACES)}",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "trace",
        metavar="TRACE",
        help="a canonical trace file (rate series or request log, see 'autoscaler trace --help'), or the name of a"
        " packaged trace",
    )
    parser.add_argument(
        "--models",
        default=",".join(available_models()),
        help="comma-separated model names to compare (default: all; the baseline is always added; a name given"
        " twice is compared once)",
    )
    parser.add_argument(
        "--horizon",
        type=float,
        default=DEFAULT_HORIZON_S,
        metavar="SECONDS",
        help=f"how far ahead each forecast reaches, in seconds (default: {DEFAULT_HORIZON_S:g})",
    )
    parser.add_argument(
        "--step",
        type=float,
        default=None,
        metavar="SECONDS",
        help="resample the trace to this step, in seconds (default: a rate series keeps its own step; a request log"
        " is binned at 60 s). A request log's last bin, which the log covers only up to its last request, is left"
        " out: scored as a whole step it would look like a drop in demand",
    )
    parser.add_argument(
        "--origins",
        type=int,
        default=DEFAULT_ORIGINS,
        metavar="N",
        help=f"number of forecast origins, the latest N of the trace (default: {DEFAULT_ORIGINS})",
    )
    parser.add_argument(
        "--origin-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between two origins (default: the horizon, so forecasts do not overlap)",
    )
    parser.add_argument(
        "--refit-every",
        type=int,
        default=1,
        metavar="N",
        help="re-estimate parameters at every N-th origin only, and just condition on new data in between"
        " (default: 1 = refit at every origin)",
    )
    parser.add_argument(
        "--train-window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="train on at most this many seconds before each origin (default: all the history before it)",
    )
    parser.add_argument(
        "--quantiles",
        default="0.1,0.5,0.9",
        metavar="LEVELS",
        help="comma-separated quantile levels in (0, 1) to forecast and score (default: 0.1,0.5,0.9)",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="NAME",
        help=f"model every pinball loss is divided by (default: {BASELINE}, the value one day earlier; it falls"
        " back to the last value on traces shorter than a day)",
    )
    parser.add_argument(
        "--json",
        dest="json_out",
        default=None,
        metavar="OUT",
        help="also write the full results as JSON to OUT (its directory is created; checked before the run: not"
        " the trace, not a directory)",
    )
    parser.set_defaults(func=run)


def _resolve_trace(trace: str) -> Path:
    path = Path(trace)
    if not path.exists() and trace in PACKAGED_TRACES:
        return packaged_trace_path(trace)
    return path


def _parse_levels(text: str) -> tuple[float, ...]:
    try:
        levels = tuple(sorted(float(v) for v in text.split(",") if v.strip()))
    except ValueError:
        raise ValueError(f"--quantiles must be comma-separated numbers, got {text!r}") from None
    if not levels or any(not 0 < q < 1 for q in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"--quantiles must be distinct levels in (0, 1), got {text!r}")
    return levels


def _fmt(value: float, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``-`` when it is undefined (nan, inf), padded to the spec's width so that
    the table's columns stay under their headers."""
    if math.isfinite(value):
        return format(value, spec)
    width = re.match(r"\d*", spec)
    return "-".rjust(int(width.group()) if width and width.group() else 0)


def _pct(value: float, width: int) -> str:
    """A share as a percentage in ``width`` characters (the ``%`` included), or ``-`` when it is undefined."""
    return f"{value * 100:{width - 1}.1f}%" if math.isfinite(value) else "-".rjust(width)


def _check_json_out(json_out: str, trace: Path) -> str | None:
    """Why ``--json OUT`` cannot be written, or None; checked before the run, which can take minutes."""
    out = Path(json_out)
    if resolved_path(out) == resolved_path(trace) or (out.exists() and trace.exists() and os.path.samefile(out, trace)):
        return f"--json {json_out} is the trace {trace}: give --json another file (the trace would be overwritten)"
    if out.is_dir():
        return f"--json {json_out} is a directory: give a file name, e.g. {out / 'backtest.json'}"
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"--json {json_out}: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--json {json_out}: cannot write in {existing} (permission denied)"
    return None


def run(args: argparse.Namespace) -> int:
    from forecast.registry import available_models, make_model
    from forecast.selection import select_model

    try:
        levels = _parse_levels(args.quantiles)
        # each model once, in the order given: a model named twice would be printed (and written) twice
        names = list(dict.fromkeys(n.strip() for n in args.models.split(",") if n.strip()))
        unknown = [n for n in [*names, args.baseline] if n not in available_models()]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(available_models())}")
        if not names:
            raise ValueError("--models names no model")
        for option in ("horizon", "origin_every", "train_window", "step"):
            value = getattr(args, option)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{option.replace('_', '-')} must be a positive number of seconds, got {value}")
        if args.origins < 1 or args.refit_every < 1:
            raise ValueError("--origins and --refit-every must be >= 1")
        trace_path = _resolve_trace(args.trace)
        if args.json_out:
            problem = _check_json_out(args.json_out, trace_path)
            if problem:
                raise ValueError(problem)
        # A request log's last bin holds requests up to the last one only, divided by the whole step: scored, it
        # looks like a drop in demand (1 req/s ending 11 s into a 60 s bin: 0.18 req/s). Only complete bins are scored.
        series = load_trace(trace_path, step_s=args.step, complete_bins=True)
    except (OSError, ValueError) as exc:
        print(f"autoscaler backtest: error: {exc}", file=sys.stderr)
        return 2

    step = float(series.step_s)
    horizon_steps = max(1, math.ceil(args.horizon / step - 1e-9))
    if series.rates.size <= horizon_steps:
        # Bad input, not a failed run: without this the baseline's backtest raised and it was reported as exit 1.
        print(
            f"autoscaler backtest: error: {args.trace}: {series.rates.size} steps of {step:g} s is too short for a"
            f" {horizon_steps * step:g} s horizon (--horizon) plus at least one step of history",
            file=sys.stderr,
        )
        return 2
    every_steps = max(1, round((args.origin_every or horizon_steps * step) / step))
    window_steps = None if args.train_window is None else max(1, round(args.train_window / step))
    if args.baseline not in names:
        names.insert(0, args.baseline)
    candidates = {n: make_model(n, horizon_steps=horizon_steps, quantiles=levels) for n in names}
    min_train = _min_train_steps(series, horizon_steps, every_steps, args.origins)

    started = time.perf_counter()
    try:
        selection = select_model(
            series.rates,
            candidates,
            baseline=args.baseline,
            step_s=step,
            start=float(series.start),
            horizon_steps=horizon_steps,
            n_origins=args.origins,
            origin_every=every_steps,
            min_train_steps=min_train,
            max_train_steps=window_steps,
            refit_every=args.refit_every,
        )
    except ValueError as exc:
        print(f"autoscaler backtest: error: baseline {args.baseline} failed: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started

    first = next(iter(selection.results.values()))
    lo, hi = levels[0], levels[-1]
    print(
        f"trace {series.source or args.trace}: {series.rates.size} steps of {step:g} s;"
        f" horizon {horizon_steps} steps ({horizon_steps * step:g} s), {first.origins.size} origins every"
        f" {every_steps * step:g} s, refit every {args.refit_every}; baseline {selection.results[args.baseline].model}"
    )
    header = (
        f"{'model':<24} {'MAE':>10} {'pinball/base':>12} {f'P{lo * 100:g}-P{hi * 100:g} cov':>13}"
        f" {f'P{hi * 100:g} cov':>8} {'fit s':>8}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        if name in selection.errors:
            print(f"{name:<24} failed: {selection.errors[name]}")
            continue
        result = selection.results[name]
        quality = result.quality
        mark = "*" if name == selection.best else " "
        print(
            f"{name + mark:<24} {_fmt(quality.mae, '10.4g')} {_fmt(selection.ratios[name], '12.3f')}"
            f" {_pct(quality.interval_coverage, 13)} {_pct(quality.upper_coverage, 8)}"
            f" {_fmt(result.mean_fit_seconds, '8.3f')}"
        )
    verdict = "reliable" if selection.reliable else "NOT reliable (reactive scaling only)"
    print(f"selected: {selection.best}, {verdict}: {selection.reason}  [{elapsed:.1f} s]")

    if args.json_out:
        payload = _to_json(args, series, selection, names, levels, horizon_steps, every_steps, elapsed)
        try:
            # its directory made, written beside it and renamed into place (never half-written), as trace convert
            write_texts([(args.json_out, json.dumps(payload, indent=2) + "\n")])
        except OSError as exc:  # the path was checked before the run: a full disk, a directory removed meanwhile
            print(f"autoscaler backtest: error: {exc}", file=sys.stderr)
            return 1
    return 0


def _min_train_steps(series: RateSeries, horizon_steps: int, every_steps: int, origins: int) -> int:
    """Train on at least half the trace, or less when that is what it takes to fit the requested origins."""
    n = int(series.rates.size)
    needed = n - horizon_steps - every_steps * (origins - 1)
    return max(min(n // 2, needed), min(n - horizon_steps, 20), 1)


def _to_json(
    args: argparse.Namespace,
    series: RateSeries,
    selection: Any,
    names: list[str],
    levels: tuple[float, ...],
    horizon_steps: int,
    every_steps: int,
    elapsed: float,
) -> dict[str, Any]:
    def clean(value: float) -> float | None:
        return value if math.isfinite(value) else None

    models: list[dict[str, Any]] = []
    for name in names:
        if name in selection.errors:
            models.append({"name": name, "error": selection.errors[name]})
            continue
        result = selection.results[name]
        quality = result.quality.to_dict()
        models.append(
            {
                "name": name,
                "label": result.model,
                "mae": clean(quality["mae"]),
                "mean_pinball": clean(quality["mean_pinball"]),
                "pinball": {k: clean(v) for k, v in quality["pinball"].items()},
                "pinball_ratio": clean(selection.ratios[name]),
                "interval_coverage": clean(quality["interval_coverage"]),
                "upper_coverage": clean(quality["upper_coverage"]),
                "n": quality["n"],
                "fits": len(result.fit_seconds),
                "fit_seconds_mean": clean(result.mean_fit_seconds),
                "fit_seconds_total": sum(result.fit_seconds),
                "update_seconds_total": sum(result.update_seconds),
                "predict_seconds_mean": clean(sum(result.predict_seconds) / max(1, len(result.predict_seconds))),
            }
        )
    first = next(iter(selection.results.values()))
    return {
        "trace": str(args.trace),
        "source": series.source,
        "start": float(series.start),
        "step_s": float(series.step_s),
        "steps": int(series.rates.size),
        "horizon_steps": horizon_steps,
        "horizon_s": horizon_steps * float(series.step_s),
        "origin_every_s": every_steps * float(series.step_s),
        "origin_times": [float(t) for t in first.origin_times],
        "refit_every": args.refit_every,
        "quantiles": list(levels),
        "baseline": selection.baseline,
        "best": selection.best,
        "reliable": selection.reliable,
        "reason": selection.reason,
        "seconds": elapsed,
        "models": models,
    }
