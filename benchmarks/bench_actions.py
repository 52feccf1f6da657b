"""Benchmark: scaling actions against GPU-hours and the SLO on the packaged default scenario (issue 14).

Issue 14 asks for scaling actions on the default scenario at most 1.5 x the HPA's, at equal or better SLO and
GPU-hours than today. This prints what that budget costs, bracketed from both sides:

1. the policies as they run (oracle, predictive, hpa): requests within the SLO, GPU-hours / the oracle's, actions;
2. **clairvoyant**: the cheapest replica schedule that never holds fewer replicas than the oracle asks for, with at
   most B changes (``bounds.change_budget``: a schedule found, and a Lagrangian lower bound no schedule beats);
3. **the predictive policy's own replicas, smoothed in hindsight**: the same, above the replicas the predictive
   policy asked for (what fewer changes of *its* decisions cost, knowing when they would come);
4. **hindsight-tuned causal family** (``bounds.tuned_observed_policy``) with a scale-down hold of 0-20 minutes:
   the cheapest member reaching the SLO within the budget (a causal policy, but tuned on the trace itself);
5. with ``--windows``: the predictive policy itself, its spec's scale-down stabilisation window (and forecast
   quantile) changed -- what an operator can set today.

    python -m benchmarks.bench_actions                              # parts 1-4, about 1 minute
    python -m benchmarks.bench_actions --windows 60:0.99,600:0.95   # ... and part 5, about 1 minute a setting
    python -m benchmarks.bench_actions --days 1 --quick             # smoke run (tests/sim/test_benchmark_smoke.py)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from autoscaler.sim.bounds import change_budget, tuned_observed_policy
from autoscaler.sim.run import SimulationResult, run_scenario
from autoscaler.sim.scenario import default_scenario_path, parse_scenario
from forecast.phase import detect_change_period

BUDGET_VS_HPA = 1.5  # the budget: actions at most this many times the HPA's
# Penalties per change, replica-steps: a geometric grid dense enough to bracket each budget within about 1 %
PENALTIES = tuple(0.25 * 1.25**k for k in range(48))
HOLD_STEPS = (0, 4, 8, 20, 40, 80)  # scale-down holds tried for the causal family, steps (15 s: 0-20 minutes)
SLO_FLOOR = 0.995  # the ">= 99.5 % within SLO"


def _scenario_data(days: float | None) -> dict[str, Any]:
    data = yaml.safe_load(default_scenario_path().read_text(encoding="utf-8"))
    if days is not None:
        data["durationSeconds"] = days * 86400.0
    return data


def _with_window(data: dict[str, Any], window_s: int, quantile: float) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    spec = changed["services"][0]["spec"]
    spec.setdefault("behavior", {}).setdefault("scaleDown", {})["stabilizationWindowSeconds"] = window_s
    spec["forecast"]["quantile"] = quantile
    return changed


def _run(data: dict[str, Any], policies: list[str]) -> SimulationResult:
    path = default_scenario_path()
    return run_scenario(parse_scenario(data, str(path)), path.parent, policies)


def _figures(result: SimulationResult, name: str) -> dict[str, Any]:
    run = result.runs[name]
    oracle = result.runs["oracle"].gpu_seconds
    return {
        "slo_attainment": run.requests_in_slo_steps / run.requests if run.requests else 1.0,
        "gpu_hours_vs_oracle": run.gpu_seconds / oracle if oracle else math.nan,
        "actions": run.scale_actions,
    }


def _spec_series(result: SimulationResult, name: str) -> np.ndarray:
    return np.asarray(result.runs[name].timelines[0].spec, dtype=np.int64)


def _row(label: str, slo: float | None, gpu: float | str, actions: int | str) -> str:
    slo_cell = "" if slo is None else f"{slo:.2%}"
    gpu_cell = gpu if isinstance(gpu, str) else f"{gpu:.3f}x"
    actions_cell = actions if isinstance(actions, str) else f"{actions:,d}"
    return f"| {label} | {slo_cell} | {gpu_cell} | {actions_cell} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, help="run the first N days only (default: the whole 14)")
    parser.add_argument("--quick", action="store_true", help="fewer penalties and holds (smoke run)")
    parser.add_argument(
        "--windows", default="",
        help="comma-separated WINDOW_S:QUANTILE settings of the predictive policy's spec to run too (part 5)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    penalties = PENALTIES[::6] if args.quick else PENALTIES
    holds = (0, 40) if args.quick else HOLD_STEPS

    began = time.perf_counter()
    data = _scenario_data(args.days)
    result = _run(data, ["oracle", "predictive", "hpa"])
    figures = {name: _figures(result, name) for name in ("oracle", "predictive", "hpa")}
    predictive, hpa = figures["predictive"], figures["hpa"]
    budget = math.floor(BUDGET_VS_HPA * hpa["actions"])
    out: dict[str, Any] = {"policies": figures, "budget": budget}
    print(f"Default scenario{'' if args.days is None else f', first {args.days:g} days'}; budget: "
          f"{BUDGET_VS_HPA:g} x the HPA's {hpa['actions']:,d} actions = {budget:,d}\n")
    print("| policy | within SLO | GPU-h / oracle | scaling actions |")
    print("|---|---|---|---|")
    for name in ("oracle", "predictive", "hpa"):
        print(_row(name, figures[name]["slo_attainment"], figures[name]["gpu_hours_vs_oracle"],
                   figures[name]["actions"]))

    # 2 and 3: the oracle's and the predictive policy's replicas as lower bounds, at the budget.
    oracle_spec = _spec_series(result, "oracle")
    predictive_spec = _spec_series(result, "predictive")
    oracle_steps = float(oracle_spec.sum())
    # The oracle's GPU-hours are its spec's replica-steps (1 GPU a replica, pods from their request): the same unit.
    budgets = sorted({budget, hpa["actions"], figures["oracle"]["actions"]})
    smoothing: dict[str, Any] = {}
    for label, series, scale in (
        ("clairvoyant, >= the oracle's replicas", oracle_spec, 1.0 / oracle_steps),
        # the predictive policy's GPU-hours scaled by the schedule's replica-steps over its own
        ("predictive's replicas smoothed in hindsight", predictive_spec,
         predictive["gpu_hours_vs_oracle"] / float(predictive_spec.sum())),
    ):  # fmt: skip
        rows = change_budget(series, budgets, penalties)
        smoothing[label] = [
            {"changes_allowed": r.changes_allowed, "changes": r.upper_changes,
             "gpu_hours_vs_oracle": [r.lower * scale, r.upper * scale]}
            for r in rows
        ]  # fmt: skip
        for r in rows:
            print(_row(f"{label}, <= {r.changes_allowed:,d} changes", None,
                       f"{r.lower * scale:.3f}-{r.upper * scale:.3f}x", r.upper_changes))
    out["smoothing"] = smoothing

    # 4: the hindsight-tuned causal family, held, at the predictive policy's SLO and at 99.5 %, within the budget.
    service = result.services[0]
    step_s = result.step_s
    period = detect_change_period(service.rates[:: max(1, round(60.0 / step_s))], 60.0)
    tuned_rows = []
    if period is not None:
        delay = result.scenario.metrics_delay_seconds
        for target in sorted({SLO_FLOOR, predictive["slo_attainment"]}):
            for allowed in (None, budget):
                point = tuned_observed_policy(
                    service, result.start, step_s, delay, period, target, hold_steps=holds, max_changes=allowed
                )
                label = f"tuned causal at >= {target:.2%}" + ("" if allowed is None else f", <= {allowed:,d} changes")
                if point is None:
                    print(_row(label, None, "unreachable", "-"))
                    continue
                hold_s = point.params["hold_steps"] * step_s
                print(_row(f"{label} (hold {hold_s:g} s)", point.slo_attainment, point.gpu_hours_vs_oracle,
                           point.changes))
                tuned_rows.append({"target": target, "changes_allowed": allowed, "slo": point.slo_attainment,
                                   "gpu_hours_vs_oracle": point.gpu_hours_vs_oracle, "changes": point.changes,
                                   "params": point.params})
    out["tuned"] = tuned_rows

    # 5: the predictive policy with another scale-down window (and quantile), as an operator would set it.
    windows = []
    for setting in filter(None, args.windows.split(",")):
        window_text, quantile_text = setting.split(":")
        run = _run(_with_window(data, int(window_text), float(quantile_text)), ["oracle", "predictive"])
        got = _figures(run, "predictive")
        windows.append({"window_s": int(window_text), "quantile": float(quantile_text), **got})
        print(_row(f"predictive, window {window_text} s, P{float(quantile_text) * 100:g}", got["slo_attainment"],
                   got["gpu_hours_vs_oracle"], got["actions"]))
    out["windows"] = windows
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"\nwall time {time.perf_counter() - began:.0f} s, peak RSS {peak_mib:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
