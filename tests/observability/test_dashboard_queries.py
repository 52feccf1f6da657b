"""The dashboard's queries evaluated by promtool with the project's rules, on series scraped the way deploy/base
scrapes them (ServiceMonitor without honorLabels: the service's labels are exported_namespace/exported_service) and
with a former leader still exporting what it saw when it lost the Lease.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.observability.common import RULE_FILE
from tests.observability.test_dashboard import dashboard, substitute, targets

CONTROLLER = 'job="gpu-autoscaler", namespace="gpu-autoscaler", service="gpu-autoscaler"'


def panel_query(title: str, **variables: str) -> str:
    d = dashboard()
    [expr] = [t["expr"] for panel_title, t in targets(d) if panel_title == title]
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return substitute(expr, d)


def series(name: str, instance: str, labels: str, values: str) -> dict[str, str]:
    return {
        "series": f'{name}{{{CONTROLLER}, instance="{instance}"{", " + labels if labels else ""}}}',
        "values": values,
    }


def run_promtool(promtool: str, tmp_path: Path, test: dict[str, Any]) -> None:
    path = tmp_path / "dashboard_test.yml"
    path.write_text(
        yaml.safe_dump({"rule_files": [str(RULE_FILE)], "evaluation_interval": "1m", "tests": [test]}, sort_keys=False)
    )
    proc = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def nameless(expr: str) -> str:
    # The recorded series keep their name; compare label sets only.
    return f"sum without () ({expr})"


def test_forecast_panels_show_the_leaders_values_by_service(promtool: str, tmp_path: Path) -> None:
    chat, search = (
        'exported_namespace="ml", exported_service="chat"',
        'exported_namespace="ml", exported_service="search"',
    )
    test = {
        "interval": "1m",
        "input_series": [
            series("gpu_autoscaler_leader", "a", 'identity="a"', "1x10"),
            series("gpu_autoscaler_leader", "b", 'identity="b"', "0x10"),
            series("gpu_autoscaler_current_replicas", "a", chat, "3x10"),
            series("gpu_autoscaler_current_replicas", "a", search, "3x10"),
            series("gpu_autoscaler_forecast_pinball_ratio", "a", chat, "0.5x10"),
            series("gpu_autoscaler_forecast_pinball_ratio", "a", search, "1.4x10"),
            series("gpu_autoscaler_headroom_target_ratio", "a", chat, "1x10"),
            series("gpu_autoscaler_headroom_target_ratio", "a", search, "0.75x10"),
            series("gpu_autoscaler_forecast_fallback", "a", f'{search}, reason="forecast_unreliable"', "1x10"),
            # the former leader's leftovers: chat fell back and had a bad forecast when b led
            series("gpu_autoscaler_forecast_fallback", "b", f'{chat}, reason="forecast_stale"', "1x10"),
            series("gpu_autoscaler_forecast_pinball_ratio", "b", chat, "3x10"),
            series("gpu_autoscaler_headroom_target_ratio", "b", chat, "0.5x10"),
            series("gpu_autoscaler_forecast_excess_share", "a", chat, "0.6x10"),
            series("gpu_autoscaler_forecast_excess_share", "a", search, "1x10"),
            series("gpu_autoscaler_forecast_excess_share", "b", chat, "1x10"),
        ],
        "promql_expr_test": [],
    }
    by_service = [
        {"labels": '{namespace="ml", service="chat"}', "value": None},
        {"labels": '{namespace="ml", service="search"}', "value": None},
    ]
    for title, values in (
        ("Forecast error by service (pinball / seasonal naive)", (0.5, 1.4)),
        ("Earned headroom by service (share of the target)", (1, 0.75)),
        ("Forecast floor: share of its quantile's excess provisioned", (0.6, 1)),
    ):
        for variables in ({}, {"namespace": "ml"}):
            test["promql_expr_test"].append(
                {
                    "expr": nameless(panel_query(title, **variables)),
                    "eval_time": "5m",
                    "exp_samples": [dict(s, value=v) for s, v in zip(by_service, values, strict=True)],
                }
            )
    test["promql_expr_test"].append(
        {
            "expr": panel_query("Services on reactive fall-back"),
            "eval_time": "5m",
            "exp_samples": [{"labels": '{reason="forecast_unreliable"}', "value": 1}],
        }
    )
    run_promtool(promtool, tmp_path, test)


def test_since_last_successful_tick_survives_a_leader_replacement(promtool: str, tmp_path: Path) -> None:
    """The old leader succeeded until 9m and its pod is gone; the new leader exported 0 until then and holds."""
    test = {
        "interval": "1m",
        "input_series": [
            series("gpu_autoscaler_last_successful_tick_timestamp_seconds", "a", "", "0+60x9 _x20"),
            series("gpu_autoscaler_last_successful_tick_timestamp_seconds", "b", "", "0x30"),
        ],
        "promql_expr_test": [
            {
                "expr": panel_query("Since last successful tick"),
                "eval_time": "16m",
                "exp_samples": [{"labels": "{}", "value": 420}],
            }
        ],
    }
    run_promtool(promtool, tmp_path, test)
