"""Figures per policy, the side-by-side table and the JSON report."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoscaler.sim.engine import PolicyRun

# Order and labels of the table's rows; JSON keys are the first element.
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("slo_attainment", "requests within SLO", "{:.2%}"),
    ("slo_minutes_attainment", "minutes within SLO", "{:.2%}"),
    ("requests_within_latency", "requests under SLO latency (tail)", "{:.2%}"),
    ("gpu_hours", "GPU-hours", "{:,.1f}"),
    ("gpu_hours_vs_oracle", "GPU-hours / oracle", "{:.3f}"),
    ("scale_actions", "scaling actions", "{:,d}"),
    ("scale_downs_undone", "scale-downs undone within a cold start", "{:,d}"),
    ("burst_gpu_hours", "burst GPU-hours", "{:,.1f}"),
    ("burst_cost", "burst cost ($)", "{:,.2f}"),
    ("stranded_gpus_mean", "GPUs stranded by fragmentation (mean)", "{:,.2f}"),
    ("stranded_gpu_hours", "GPU-hours stranded by fragmentation", "{:,.1f}"),
    ("rebalance_moves", "rebalance moves (pods evicted)", "{:,d}"),
    ("rebalance_moves_max_per_hour", "rebalance moves in an hour, most", "{:,d}"),
    ("preemptions", "training gangs stopped", "{:,d}"),
    ("training_gpu_hours", "training GPU-hours done", "{:,.1f}"),
    ("lost_training_gpu_hours", "training GPU-hours lost", "{:,.1f}"),
    ("training_jobs_finished", "training jobs finished", "{:,d}"),
    ("total_cost", "total cost ($)", "{:,.2f}"),
    ("forecast_mae", "forecast MAE at lead (req/s)", "{:,.2f}"),
    ("forecast_pinball", "forecast pinball at lead", "{:,.3f}"),
)
# Rows left out of the table when no policy has a value (a scenario without training or a rebalance block measures
# no stranded GPUs, and prints what it printed before they were measured).
OPTIONAL_FIGURES = frozenset(
    {"stranded_gpus_mean", "stranded_gpu_hours", "rebalance_moves", "rebalance_moves_max_per_hour"}
)


def forecast_figures(run: PolicyRun) -> dict[str, Any]:
    """Forecast error of a predictive run (None for policies that do not forecast)."""
    errors = getattr(run.policy_object, "errors", None)
    pinball = getattr(run.policy_object, "pinball", None)
    if not errors or not pinball:
        return {"forecast_mae": None, "forecast_pinball": None}
    return {"forecast_mae": sum(errors) / len(errors), "forecast_pinball": sum(pinball) / len(pinball)}


def figures(
    run: PolicyRun, oracle_gpu_hours: float | None, costs: tuple[float, float] = (2.0, 1.0)
) -> dict[str, Any]:
    """``costs``: (value of a training GPU-hour, cost of 1,000 requests outside the SLO); the total cost is burst
    money + lost training GPU-hours x the first + requests outside the SLO / 1,000 x the second."""
    gpu_hours = run.gpu_seconds / 3600.0
    lost_hours = run.lost_training_gpu_seconds / 3600.0
    missed = max(0.0, run.requests - run.requests_in_slo_steps)
    measured = run.stranded_gpu_seconds is not None
    stranded_s = run.stranded_gpu_seconds or 0.0
    rebalanced = run.rebalance_passes > 0
    return {
        "slo_attainment": run.requests_in_slo_steps / run.requests if run.requests else 1.0,
        "slo_minutes_attainment": run.minutes_within_slo / run.minutes if run.minutes else 1.0,
        "requests_within_latency": run.requests_within_latency / run.requests if run.requests else 1.0,
        "gpu_hours": gpu_hours,
        "gpu_hours_vs_oracle": gpu_hours / oracle_gpu_hours if oracle_gpu_hours else None,
        "scale_actions": run.scale_actions,
        "scale_downs": run.scale_downs,
        "scale_downs_undone": run.scale_downs_undone,
        "burst_gpu_hours": run.burst_gpu_seconds / 3600.0,
        "burst_cost": run.burst_cost,
        "stranded_gpus_mean": stranded_s / run.simulated_seconds if measured and run.simulated_seconds else None,
        "stranded_gpu_hours": stranded_s / 3600.0 if measured else None,
        "rebalance_moves": run.rebalance_moves if rebalanced else None,
        "rebalance_moves_max_per_hour": run.max_moves_in_an_hour() if rebalanced else None,
        "rebalance_blocked": run.rebalance_blocked if rebalanced else None,
        "rebalance_passes": run.rebalance_passes if rebalanced else None,
        "preemptions": run.preemptions,
        "lost_training_gpu_hours": lost_hours,
        "training_gpu_hours": run.training_gpu_seconds / 3600.0 if run.jobs else None,
        "training_jobs_finished": run.jobs_finished if run.jobs else None,
        "total_cost": run.burst_cost + lost_hours * costs[0] + missed / 1000.0 * costs[1],
        "decisions_by_reason": dict(sorted(run.reasons.items())),
    }


def build_report(scenario: Mapping[str, Any], policies: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    return {"scenario": dict(scenario), "policies": dict(policies)}


def format_table(report: Mapping[str, Any]) -> str:
    names: Sequence[str] = list(report["policies"])
    rows = [["", *names]]
    for key, label, fmt in FIGURES:
        if key in OPTIONAL_FIGURES and all(report["policies"][name].get(key) is None for name in names):
            continue
        row = [label]
        for name in names:
            value = report["policies"][name].get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                row.append("-")
            else:
                row.append(fmt.format(value))
        rows.append(row)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(widths[c + 1]) for c, cell in enumerate(row[1:])]
        lines.append("  ".join(cells))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
