"""The Grafana dashboard: the committed JSON is a fresh build, its layout and metadata are sound, and every panel's
query (variables substituted) runs on a real Prometheus that holds synthetic history and evaluates the project's
rules, where it returns data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.observability.common import DASHBOARDS_DIR, RULE_FILE, alerts, load_rules, require_grafana_sdk
from tests.observability.live_prometheus import (
    CHAT_PODS,
    EMBED_POD,
    EXPECTED_ACTIVE_ALERTS,
    HISTORY_S,
    Prometheus,
    backfill,
    history,
    write_openmetrics,
)

DASHBOARD_JSON = DASHBOARDS_DIR / "gpu-autoscaler.json"
BUILTIN_VALUES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600"}
PANEL_TYPES = {"row", "timeseries", "stat", "state-timeline"}


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_JSON.read_text())
    return loaded


def all_panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level panels and the panels inside (collapsed) rows."""
    out = []
    for panel in d["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def targets(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in all_panels(d) if p["type"] != "row" for t in p.get("targets", [])]


def substitute(expr: str, d: dict[str, Any]) -> str:
    """The query Grafana sends with every variable at "All" (its allValue), built-ins at typical values."""
    values = dict(BUILTIN_VALUES)
    for variable in d["templating"]["list"]:
        if variable["type"] == "query":
            values[variable["name"]] = variable["allValue"]

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"unknown variable ${name} in {expr}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


# ---- the committed file -----------------------------------------------------------------------------------------


def test_committed_dashboard_is_a_fresh_build() -> None:
    require_grafana_sdk()
    build = load_build()
    build.check_sdk_version()
    assert DASHBOARD_JSON.read_text() == build.render(), "run: python dashboards/build.py"
    assert build.main(["--check"]) == 0


def test_build_check_fails_when_out_of_date(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_grafana_sdk()
    build = load_build()
    stale = tmp_path / "gpu-autoscaler.json"
    stale.write_text(DASHBOARD_JSON.read_text().replace('"GPU Autoscaler"', '"GPU Autoscaler (old)"'))
    monkeypatch.setattr(build, "OUTPUT", stale)
    assert build.main(["--check"]) == 1


# ---- structure --------------------------------------------------------------------------------------------------


def test_panel_ids_are_unique_and_types_known() -> None:
    panels = all_panels(dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    assert {p["type"] for p in panels} <= PANEL_TYPES


def test_grid_positions_fit_24_columns_without_overlap() -> None:
    placed = []
    for p in all_panels(dashboard()):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["y"] >= 0 and g["w"] > 0 and g["h"] > 0, p["title"]
        assert g["x"] + g["w"] <= 24, f"{p['title']}: x {g['x']} + w {g['w']} > 24"
        placed.append((p["title"], g))
    for i, (a, ga) in enumerate(placed):
        for b, gb in placed[i + 1 :]:
            overlap_x = ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
            overlap_y = ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]
            assert not (overlap_x and overlap_y), f"{a} overlaps {b}"


def test_every_panel_and_target_has_the_datasource_variable_and_a_unit() -> None:
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for p in all_panels(dashboard()):
        if p["type"] == "row":
            continue
        assert p.get("title") and p.get("description"), p
        assert p["datasource"] == ref, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ref and t["expr"].strip() and t["refId"], p["title"]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit, f"{p['title']} has no unit"
    ref_ids = [[t["refId"] for t in p["targets"]] for p in all_panels(dashboard()) if p["type"] != "row"]
    assert all(len(r) == len(set(r)) for r in ref_ids)


def test_template_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert {"datasource", "namespace", "service"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "service"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
    assert "$namespace" in variables["service"]["query"], "services follow the selected namespaces"
    # the per-service panels follow the variables
    for title, t in targets(dashboard()):
        if "namespace_service" in t["expr"]:
            assert '=~"$namespace"' in t["expr"] and '=~"$service"' in t["expr"], title


def test_panels_read_recording_rules_that_exist() -> None:
    recorded = {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}
    queries = [t["expr"] for _, t in targets(dashboard())]
    queries += [v["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    used = {m for q in queries for m in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", q)}
    assert used and used <= recorded, f"not recorded by {RULE_FILE.name}: {used - recorded}"


def test_dashboard_covers_the_controller_services_gpus_forecast_and_capacity() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == [
        "Controller", "Decisions and actions", "Services", "GPUs", "Forecast", "Capacity arbitration", "Rebalancing"
    ]
    exprs = " ".join(t["expr"] for _, t in targets(dashboard()))
    for needed in (
        "gpu_autoscaler_ticks_total",
        "gpu_autoscaler_tick_duration_seconds_bucket",
        "gpu_autoscaler_leader",
        "gpu_autoscaler_errors_total",
        "gpu_autoscaler_decisions_total",
        "gpu_autoscaler_actions_total",
        "namespace_service:gpu_autoscaler_current_replicas:leader",
        "namespace_service:gpu_autoscaler_desired_replicas:leader",
        "namespace_service_reason:gpu_autoscaler_stale_services:leader",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "namespace_service_pod:dcgm_gpu_util:avg",
        "gpu_autoscaler_training_gangs_stopped_total",
        "gpu_autoscaler_training_gpu_hours_lost_total",
        "namespace_job:gpu_autoscaler_capacity_shortfall_gpus:leader",
        "namespace_job_pool:gpu_autoscaler_burst_nodes:leader",
        "namespace_job:gpu_autoscaler_burst_spend_per_hour:leader",
        "gpu_autoscaler_stranded_gpus",
        "gpu_autoscaler_rebalance_passes_total",
    ):
        assert needed in exprs, needed


def panel_exprs(title: str) -> list[str]:
    found = [t["expr"] for panel_title, t in targets(dashboard()) if panel_title == title]
    assert found, f"no panel {title!r}"
    return found


def test_capacity_panels() -> None:
    """The capacity row counts applied actions only, and draws the spend alert's threshold from the one recording
    rule that sets it (no second copy of the number in the dashboard)."""
    (actions,) = panel_exprs("Preemptions, resumes and burst scaling (applied, per hour)")
    assert 'result="applied"' in actions
    (reasons,) = re.findall(r'reason=~"([^"]+)"', actions)
    assert set(reasons.split("|")) == {
        "preempt_for_inference", "resume_training", "burst_scale_up", "burst_scale_down", "burst_node_not_registered",
        "burst_node_not_ready",
    }
    spend, threshold = panel_exprs("Burst spend per hour")
    assert "namespace_job:gpu_autoscaler_burst_spend_per_hour:leader" in spend
    recorded = "cluster:gpu_autoscaler_burst_spend_per_hour:alert_threshold"
    assert threshold == f"max({recorded})"
    assert recorded in alerts()["GPUAutoscalerBurstSpendHigh"]["expr"]


def test_capacity_panels_show_the_leaders_values(prometheus: Prometheus) -> None:
    d = dashboard()
    values = {}
    for title in ("Capacity shortfall", "Burst spend per hour", "Burst nodes by pool"):
        for expr in panel_exprs(title):
            status, body = prometheus.query(substitute(expr, d))
            assert status == 200
            series = "threshold" if "alert_threshold" in expr else ""
            for r in body["data"]["result"]:
                values[(title, r["metric"].get("pool", ""), series)] = float(r["value"][1])
    assert values == {
        ("Capacity shortfall", "", ""): 2.0,  # the follower's leftover 6 is ignored
        ("Burst spend per hour", "", ""): 56.0,
        ("Burst spend per hour", "", "threshold"): 100.0,
        ("Burst nodes by pool", "cloud-a100", ""): 2.0,
        ("Burst nodes by pool", "cloud-h100", ""): 0.0,
    }


# ---- against a real Prometheus ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(promtool: str, prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("prometheus")
    end = int(time.time()) - 5  # the newest sample is within the 5 min lookback of "now" queries
    start = end - HISTORY_S
    openmetrics = workdir / "history.om"
    write_openmetrics(openmetrics, history(start), start, end)
    backfill(promtool, openmetrics, workdir / "data")
    server = Prometheus(prometheus_binary, workdir, RULE_FILE).start()
    try:
        # Recording rules run every second; the inference-pod series need the per-service ones of the same pass.
        server.wait_for("namespace_service_pod:dcgm_gpu_util:avg")
        # The capacity, forecast and controller rules are other groups, evaluated on their own schedules: their
        # first passes may come later.
        server.wait_for("namespace_job_pool:gpu_autoscaler_burst_nodes:leader")
        server.wait_for("namespace_service_reason:gpu_autoscaler_forecast_fallback:leader")
        server.wait_for("namespace_job:gpu_autoscaler_last_successful_tick_timestamp_seconds:max")
        yield server
    finally:
        server.stop()


def load_build_constants() -> dict[str, Any]:
    # Read the constants from the source so this test needs no SDK.
    source = (DASHBOARDS_DIR / "build.py").read_text()
    series = re.findall(r'^FORECAST_\w+_SERIES = "([\w:]+)"', source, flags=re.M)
    assert len(series) == 2
    return {"forecast_series": series}


def test_rebalance_panels_show_the_leaders_values(prometheus: Prometheus) -> None:
    d = dashboard()
    [stranded, moved] = [substitute(e, d) for e in panel_exprs("GPUs stranded by fragmentation")]
    prometheus.wait_for(stranded)
    for expr, want in ((stranded, 5.0), (moved, 2.0)):
        status, body = prometheus.query(expr)
        assert status == 200
        assert [float(r["value"][1]) for r in body["data"]["result"]] == [want], expr


def test_a_broken_query_is_rejected(prometheus: Prometheus) -> None:
    """The check below can fail: Prometheus answers 400 to a parse error."""
    status, body = prometheus.query("sum by (result) (rate(gpu_autoscaler_ticks_total[5m])")
    assert status == 400 and body["errorType"] == "bad_data"


def test_every_panel_query_runs_and_returns_data(prometheus: Prometheus) -> None:
    d = dashboard()
    build_constants = load_build_constants()
    errors, empty = [], set()
    for title, target in targets(d):
        expr = substitute(target["expr"], d)
        status, body = prometheus.query(expr)
        if status != 200:
            errors.append(f"{title}: HTTP {status} {body.get('error')} for {expr}")
        elif not body["data"]["result"]:
            empty.add(title)
    assert not errors, "\n".join(errors)
    forecast_panels = {
        title for title, t in targets(d) if any(m in t["expr"] for m in build_constants["forecast_series"])
    }
    assert len(forecast_panels) == 2  # the forecast metrics the controller exports are on the dashboard
    assert empty == set(), f"panels without data: {sorted(empty)}"


def test_inference_pod_panels_show_only_pods_of_managed_services(prometheus: Prometheus) -> None:
    d = dashboard()
    pod_panels = [(title, t) for title, t in targets(d) if title.endswith("per inference pod")]
    assert len(pod_panels) == 3
    for title, target in pod_panels:
        status, body = prometheus.query(substitute(target["expr"], d))
        assert status == 200
        pods = {r["metric"]["pod"] for r in body["data"]["result"]}
        assert pods == {*CHAT_PODS, EMBED_POD}, f"{title}: {pods} (training pods are not inference)"


def test_variables_list_the_managed_services(prometheus: Prometheus) -> None:
    d = dashboard()
    found: dict[str, set[str]] = {}
    for variable in d["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
        assert match, variable["query"]
        selector, label = substitute(match.group(1), d), match.group(2)
        status, body = prometheus.get("/api/v1/series", **{"match[]": selector})
        assert status == 200, body
        found[variable["name"]] = {s[label] for s in body["data"] if label in s}
    assert found["namespace"] == {"ml"}
    assert found["service"] == {"chat", "embed"}, "embed has exported_* labels: the rules normalise them"
    assert found["job"] == {"gpu-autoscaler"}


def test_per_service_series_come_from_the_leader(prometheus: Prometheus) -> None:
    status, body = prometheus.query("namespace_service:gpu_autoscaler_current_replicas:leader")
    assert status == 200
    values = {r["metric"]["service"]: float(r["value"][1]) for r in body["data"]["result"]}
    assert values == {"chat": 2.0, "embed": 4.0}, "the follower's leftover 9 replicas of chat are ignored"


def test_rules_evaluate_without_errors_and_the_expected_alerts_are_active(prometheus: Prometheus) -> None:
    deadline = time.monotonic() + 60  # rules evaluate every second: met within a few, unless the machine is loaded
    while True:
        status, body = prometheus.get("/api/v1/rules")
        assert status == 200
        rules = [r for g in body["data"]["groups"] for r in g["rules"]]
        evaluated = all(r.get("lastEvaluation", "").split("T")[0] not in ("", "0001-01-01") for r in rules)
        status, alerts_body = prometheus.get("/api/v1/alerts")
        active = {
            (
                a["labels"]["alertname"],
                tuple(sorted((k, v) for k, v in a["labels"].items() if k not in ("alertname", "severity"))),
            )
            for a in alerts_body["data"]["alerts"]
        }
        if (evaluated and active == EXPECTED_ACTIVE_ALERTS) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert len(rules) == sum(len(g["rules"]) for g in load_rules()["groups"])
    broken = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not broken, broken
    assert active == EXPECTED_ACTIVE_ALERTS
