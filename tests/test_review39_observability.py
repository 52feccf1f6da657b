"""Review 39: the controller's metrics (autoscaler/telemetry.py), the alert and recording rules (deploy/rules/), their
runbooks (deploy/runbooks/) and the Grafana dashboard (dashboards/), checked against each other and against what the
controller really exports.

Defects (each test was ``xfail(strict=True)`` and failed on the files as they were; all six fixed in the same stop,
their tests say "Fixed"):

1. ``test_dashboard_leaders_stat_reads_one_for_each_healthy_installation``: the "Leaders" stat
   (dashboards/build.py ``controller_row``) is ``sum(gpu_autoscaler_leader{job=~"$job"})`` over every installation
   scraped under the job. The rules judge each installation (namespace, job) alone, because an acting install and a
   dry-run install in another namespace both get job="gpu-autoscaler" from the shipped ServiceMonitor, each with its
   own leader. The stat then reads 2, which its thresholds show in red as "multiple leaders".
2. ``test_dashboard_mode_stat_shows_the_acting_installation_as_acting``: the "Mode" stat is
   ``max(gpu_autoscaler_dry_run{job=~"$job"})``. With a dry-run install beside the acting one it reads 1, so the
   dashboard says "dry-run" for the installation that is writing to the cluster.
3. ``test_forecast_decisions_panel_promises_only_reasons_that_decisions_carry``: the "Forecast decisions" panel says it
   shows decisions where the forecast "could not be used". No decision ever has such a reason: an unusable forecast
   (forecast_stale / forecast_unreliable / forecast_missing) only goes into the decision's detail, and the reason stays
   the reactive one. Those reasons are in ``gpu_autoscaler_forecast_fallback`` (the "Services on reactive fall-back"
   panel).
4. ``test_extender_alert_unit_tests_notice_refused_bad_request_and_error_calls``: GPUAutoscalerExtenderNotAdvising
   counts ``result!="ok"`` (fail_open, refused, bad_request, error), but its promtool unit tests only feed
   ``fail_open``. A rule that counts ``result="fail_open"`` alone passes every unit test.
5. ``test_slo_breach_unit_tests_notice_standby_ticks_in_the_denominator``: GPUAutoscalerSLOBreachPersistent divides by
   the acting ticks (``result!="standby"``); no unit test has a follower, so dropping the filter passes every test.
   A follower's standby ticks then halve the ratio of a two-replica install, and the alert goes quiet.
6. ``test_no_successful_tick_unit_tests_notice_a_crash_loop``: GPUAutoscalerNoSuccessfulTick reads the earliest
   process start over the last hour (``min_over_time(...[1h])``) so that a crash loop fires. No unit test has a
   restarting process, so the plain gauge (whose start time moves to each restart, and never gets 10 minutes old)
   passes every test.

Passing pins (right behaviour that no other test pins): every ``gpu_autoscaler_*`` name in the rules, the dashboard and
the runbooks is exported by a real ``Telemetry``; the README documents every exported metric under its exposition name;
the dashboard's selectors and ``by`` clauses use labels and label values the controller emits; every runbook PromQL
line parses; label cardinality is bounded (no per-object label on counters or histograms); a deleted policy's
per-service series go at the next tick; counters, gauges and histograms follow the Prometheus naming rules; and the
histogram buckets resolve the thresholds that matter (TickSlow's 10 s, the scheduler's 1 s httpTimeout, the fit
timeout).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.actuator import RESULTS
from autoscaler.core import model
from autoscaler.core.decide import ReplicaFloor, ServiceState, decide_service
from autoscaler.core.extender import FailOpen
from autoscaler.core.headroom import HeadroomState
from autoscaler.core.model import PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.reporting import STALE_CATEGORY_NAMES
from autoscaler.settings import ForecastSettings, Settings
from autoscaler.telemetry import (
    ERROR_COMPONENTS,
    EXTENDER_BUCKETS,
    EXTENDER_RESULTS,
    EXTENDER_VERBS,
    FIT_BUCKETS,
    FIT_RESULTS,
    TICK_BUCKETS,
    TICK_RESULTS,
    ForecastGauges,
    ServiceGauges,
    Telemetry,
)

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "deploy" / "rules"
RULE_FILE = RULES_DIR / "gpu-autoscaler.rules.yml"
RUNBOOKS_DIR = ROOT / "deploy" / "runbooks"
DASHBOARD = ROOT / "dashboards" / "gpu-autoscaler.json"
README = ROOT / "README.md"
SCHEDULER_CONFIG = ROOT / "deploy" / "overlays" / "scheduler-extender" / "kube-scheduler-config.yaml"

# Labels the scrape adds (Prometheus Operator ServiceMonitor targets), and the renamed ones without honorLabels.
TARGET_LABELS = {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}
ACTION_KINDS = {
    cls.__name__
    for cls in (model.ScaleDeployment, model.EvictPod, model.SuspendWorkload, model.ResumeWorkload, model.ScaleNodePool)
}


# ---- helpers ----------------------------------------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    return path


def full_telemetry() -> Telemetry:
    """A controller's registry with every family holding at least one sample (collectors and lazy children filled)."""
    t = Telemetry(identity="a")
    t.services.update([ServiceGauges("ml", "chat", 2, 3, ("no_data",))])
    t.forecasts.update(
        [ForecastGauges("ml", "chat", 0.8, True, 60.0, 3, "forecast_stale", 0.75, HeadroomState.LEARNING.value, 0.6)]
    )
    t.burst_nodes.labels(pool="cloud-a100").set(1)
    t.forecast_updates.labels(result="ok").inc()
    t.extender_duration.labels(verb="filter").observe(0.001)
    return t


def exported() -> dict[str, tuple[str, set[str]]]:
    """Exposition name -> (family type, label names), from a real registry."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family in full_telemetry().registry.collect():
        for s in family.samples:
            _, labels = out.setdefault(s.name, (family.type, set()))
            labels.update(s.labels)
    return out


def dashboard_exprs() -> list[tuple[str, str, str]]:
    """(panel title, description, expr) for every target of the committed dashboard."""
    d = json.loads(DASHBOARD.read_text())
    panels = []
    for p in d["panels"]:
        panels.append(p)
        panels += p.get("panels", [])
    return [(p["title"], p.get("description", ""), t["expr"]) for p in panels for t in p.get("targets", [])]


def dashboard_panel(title: str) -> list[str]:
    found = [expr for t, _, expr in dashboard_exprs() if t == title]
    assert found, f"no panel {title!r}"
    return found


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULE_FILE.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def runbook_promql_lines() -> list[tuple[str, str]]:
    """(runbook, query) for every line of every ```promql block, trailing comments cut."""
    out = []
    for path in sorted(RUNBOOKS_DIR.glob("*.md")):
        for block in re.findall(r"```promql\n(.*?)```", path.read_text(), flags=re.S):
            for line in block.splitlines():
                query = re.sub(r"\s+#.*$", "", line).strip()
                if query and not query.startswith("#"):
                    out.append((path.stem, query))
    return out


def with_variables(expr: str) -> str:
    """The query Grafana sends with every variable at "All" (.*) and a typical rate interval."""
    return (
        expr.replace("$__rate_interval", "5m")
        .replace("$job", ".*")
        .replace("$namespace", ".*")
        .replace("$service", ".*")
    )


LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
GOT = re.compile(r"(\{[^}]*\}) (\S+?)(?:,|$)")


def evaluate(series: list[tuple[str, str]], exprs: list[str], at: str, tmp: Path) -> dict[str, list[Any]]:
    """Each expression's result at ``at`` over ``series`` [(series, values)], evaluated by promtool: every expression is
    given an empty expectation, and the samples promtool reports having got instead are parsed back."""
    (tmp / "empty.yml").write_text("groups: []\n")
    test = {
        "rule_files": ["empty.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [{"expr": e, "eval_time": at, "exp_samples": []} for e in exprs],
            }
        ],
    }
    (tmp / "eval_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        [promtool(), "test", "rules", "eval_test.yml"], cwd=tmp, capture_output=True, text=True, timeout=60, check=False
    )
    text = proc.stdout + proc.stderr
    out: dict[str, list[Any]] = {e: [] for e in exprs}
    for quoted, got in re.findall(r'expr: ("(?:[^"\\]|\\.)*"), time: \S+\n\s+exp: .*\n\s+got: (.*)', text):
        expr = json.loads(quoted)
        assert expr in out, f"promtool reported an unknown expression: {expr}\n{text}"
        out[expr] = [(dict(LABEL.findall(labels)), float(value)) for labels, value in GOT.findall(got)]
    assert not re.search(r"parse error|could not|unknown function", text), text
    return out


def mutated_unit_tests_pass(tmp: Path, old: str, new: str, test_file: str) -> tuple[bool, str]:
    """Whether ``test_file``'s promtool unit tests still pass with ``old`` replaced by ``new`` in the rule file."""
    source = RULE_FILE.read_text()
    assert source.count(old) == 1, f"the rule text to mutate is not in {RULE_FILE.name} once: {old!r}"
    (tmp / RULE_FILE.name).write_text(source.replace(old, new))
    shutil.copy(RULES_DIR / test_file, tmp / test_file)
    proc = subprocess.run(
        [promtool(), "test", "rules", test_file], cwd=tmp, capture_output=True, text=True, timeout=120, check=False
    )
    return proc.returncode == 0, proc.stdout + proc.stderr


def unit_tests_pass_unmutated(tmp: Path, test_file: str) -> None:
    (tmp / RULE_FILE.name).write_text(RULE_FILE.read_text())
    shutil.copy(RULES_DIR / test_file, tmp / test_file)
    proc = subprocess.run(
        [promtool(), "test", "rules", test_file], cwd=tmp, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Two installations under the shipped ServiceMonitor's job: an acting one (leader a, follower b) and a dry-run one in
# another namespace (its own Lease, leader c). Both healthy.
TWO_INSTALLATIONS = [
    ('gpu_autoscaler_leader{job="gpu-autoscaler", namespace="gpu-autoscaler", instance="a", identity="a"}', "1x20"),
    ('gpu_autoscaler_leader{job="gpu-autoscaler", namespace="gpu-autoscaler", instance="b", identity="b"}', "0x20"),
    ('gpu_autoscaler_leader{job="gpu-autoscaler", namespace="gpu-autoscaler-dry", instance="c", identity="c"}', "1x20"),
    ('gpu_autoscaler_dry_run{job="gpu-autoscaler", namespace="gpu-autoscaler", instance="a"}', "0x20"),
    ('gpu_autoscaler_dry_run{job="gpu-autoscaler", namespace="gpu-autoscaler", instance="b"}', "0x20"),
    ('gpu_autoscaler_dry_run{job="gpu-autoscaler", namespace="gpu-autoscaler-dry", instance="c"}', "1x20"),
]


# ---- defects ----------------------------------------------------------------------------------------------------


def test_dashboard_leaders_stat_reads_one_for_each_healthy_installation(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: "Leaders" is ``sum(gpu_autoscaler_leader{job=~"$job"})``: an acting install and a dry-run install in
    another namespace (both job="gpu-autoscaler" under the shipped ServiceMonitor, each electing its own leader on its
    own Lease) read 2, shown red as "multiple leaders", while GPUAutoscalerNoLeader / MultipleLeaders (``sum by
    (namespace, job)``) rightly stay quiet.
    RIGHT: per installation, as the alerts: ``sum by (namespace, job) (gpu_autoscaler_leader{job=~"$job"})`` (legend
    ``{{namespace}}``), so every healthy installation reads 1."""
    (leaders,) = dashboard_panel("Leaders")
    expr = with_variables(leaders)
    got = evaluate(TWO_INSTALLATIONS, [expr], "10m", tmp_path)[expr]
    assert got, "the expression returns data"
    assert [value for _, value in got] == [1.0] * len(got), f"Leaders reads {got} for two healthy installations"


def test_dashboard_mode_stat_shows_the_acting_installation_as_acting(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: "Mode" is ``max(gpu_autoscaler_dry_run{job=~"$job"})``: with a dry-run install beside the acting one
    it reads 1 ("dry-run") although one installation writes to the cluster.
    RIGHT: ``max by (namespace, job) (gpu_autoscaler_dry_run{job=~"$job"})`` (one value per installation), so the
    acting installation reads 0 ("acting")."""
    (mode,) = dashboard_panel("Mode")
    expr = with_variables(mode)
    got = evaluate(TWO_INSTALLATIONS, [expr], "10m", tmp_path)[expr]
    assert got, "the expression returns data"
    assert 0.0 in [value for _, value in got], f"Mode reads {got}: the acting installation is not shown as acting"


def test_forecast_decisions_panel_promises_only_reasons_that_decisions_carry() -> None:
    """Fixed (was a strict xfail).

    WRONG: the "Forecast decisions" panel (``decisions_total{reason=~"forecast_.*"}``) says it shows decisions
    where the forecast "could not be used", but a decision with a stale, unreliable or missing forecast keeps its
    reactive reason (metric_above_target, within_tolerance, ...): only forecast_floor and forecast_hold ever reach
    ``gpu_autoscaler_decisions_total``, and the panel can never show a fall-back.
    RIGHT: the description says forecast_floor / forecast_hold only and points at "Services on reactive fall-back"
    (``gpu_autoscaler_forecast_fallback``) for the forecasts that could not be used."""
    descriptions = [d for t, d, _ in dashboard_exprs() if t == "Forecast decisions"]
    assert descriptions
    policy = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)
    reasons = set()
    for why in (Reason.FORECAST_STALE, Reason.FORECAST_UNRELIABLE, Reason.FORECAST_MISSING):
        for util in (140.0, 70.0, 10.0):
            obs = ServiceObservation("ml/chat", 4, 4, pods=PodMetrics(4, util * 4))
            decision, _ = decide_service(policy, obs, ServiceState(), 1000.0, ReplicaFloor(0, why, "x", usable=False))
            reasons.add(decision.reason.value)
    promised_fallback = "could not be used" in descriptions[0]
    carried = {r for r in reasons if r.startswith("forecast_")}
    assert not promised_fallback or carried, (
        f"the panel promises decisions for unusable forecasts; their reasons are {sorted(reasons)}"
    )


def test_extender_alert_unit_tests_notice_refused_bad_request_and_error_calls(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: GPUAutoscalerExtenderNotAdvising counts every call without advice (``result!="ok"``: fail_open,
    refused, bad_request, error; its description and runbook say so), but controller_test.yml only feeds fail_open:
    the rule narrowed to ``result="fail_open"`` passes every unit test, so an extender refusing every call (413, 408,
    503) or answering 500 could lose its alert unnoticed.
    RIGHT: a unit test group where most calls are refused or error (no fail_open) and the alert fires."""
    unit_tests_pass_unmutated(tmp_path, "controller_test.yml")
    passed, _ = mutated_unit_tests_pass(
        tmp_path,
        'gpu_autoscaler_extender_requests_total{result!="ok"}',
        'gpu_autoscaler_extender_requests_total{result="fail_open"}',
        "controller_test.yml",
    )
    assert not passed, "the unit tests pass with refused/bad_request/error calls no longer counted"


def test_slo_breach_unit_tests_notice_standby_ticks_in_the_denominator(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: GPUAutoscalerSLOBreachPersistent divides by the acting ticks (``ticks_total{result!="standby"}``), but
    scaling_test.yml has no follower: with the filter dropped every unit test passes, while a two-replica install's
    standby ticks would halve the ratio and keep a persistent breach quiet. (GPUAutoscalerServiceAtMaxReplicas, the
    same expression, has such a test.)
    RIGHT: an SLO-breach test group with a follower exporting standby ticks, where the alert still fires."""
    unit_tests_pass_unmutated(tmp_path, "scaling_test.yml")
    old = (
        'rate(gpu_autoscaler_decisions_total{reason="slo_breach"}[10m]))\n'
        '          / sum by (namespace, job) (rate(gpu_autoscaler_ticks_total{result!="standby"}[10m]))'
    )
    new = old.replace('{result!="standby"}', "")
    passed, _ = mutated_unit_tests_pass(tmp_path, old, new, "scaling_test.yml")
    assert not passed, "the unit tests pass with standby ticks counted in the SLO-breach denominator"


def test_no_successful_tick_unit_tests_notice_a_crash_loop(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: GPUAutoscalerNoSuccessfulTick falls back on ``min_over_time(gpu_autoscaler_process_start_time_seconds
    [1h])`` so that a crash loop (a new process every few minutes, never a successful tick) fires, as its comment
    says; no unit test restarts a process, so the plain gauge, whose age never reaches 10 minutes in a crash loop,
    passes every test.
    RIGHT: a controller_test.yml group whose process restarts every 5 minutes without a success, where the alert
    fires."""
    unit_tests_pass_unmutated(tmp_path, "controller_test.yml")
    passed, _ = mutated_unit_tests_pass(
        tmp_path,
        "min_over_time(gpu_autoscaler_process_start_time_seconds[1h])",
        "gpu_autoscaler_process_start_time_seconds",
        "controller_test.yml",
    )
    assert not passed, "the unit tests pass without the crash-loop fallback"


# ---- pins -------------------------------------------------------------------------------------------------------


def test_every_metric_named_in_rules_dashboard_and_runbooks_is_exported() -> None:
    """Cross-checked against a real registry: a rename in telemetry.py breaks the rules, the dashboard and the
    runbooks' queries, and only the rules were checked so far."""
    names = set(exported())
    sources = {
        "rules": rule_exprs(),
        "dashboard": [e for _, _, e in dashboard_exprs()],
        "runbooks": [q for _, q in runbook_promql_lines()],
    }
    for where, exprs in sources.items():
        used = {m for e in exprs for m in re.findall(r"(?<![\w:])gpu_autoscaler_\w+", e)}
        assert used, where
        assert used <= names, f"{where} name metrics the controller does not export: {sorted(used - names)}"
    # and the mutation the check exists for is caught
    assert "gpu_autoscaler_ticks" not in names and "gpu_autoscaler_ticks_total" in names


def test_readme_documents_every_exported_metric_under_its_exposition_name() -> None:
    section = README.read_text().split("### Observability shipped with it", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)(?:\{[^`]*\})?`", section))
    families = list(full_telemetry().registry.collect())
    for family in families:
        short = family.name.removeprefix("gpu_autoscaler_") + ("_total" if family.type == "counter" else "")
        assert short in documented, f"README does not list {short} ({family.name})"
    exposition = {n.removeprefix("gpu_autoscaler_") for n in exported()}
    exposition |= {f.name.removeprefix("gpu_autoscaler_") for f in families if f.type != "counter"}
    for token in documented:
        if token.endswith(("_total", "_seconds", "_replicas", "_ratio", "_gpus", "_per_hour")):
            assert token in exposition, f"README lists {token}, which the controller does not export"


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric, [(label, op, value)]) for every raw gpu_autoscaler_* selector of an expression."""
    out = []
    for name, body in re.findall(r"(?<![\w:])(gpu_autoscaler_\w+)(?:\{([^}]*)\})?", expr):
        out.append((name, re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body or "")))
    return out


def test_dashboard_selectors_use_labels_and_values_the_controller_emits() -> None:
    metrics = exported()
    values = {
        "result": set(TICK_RESULTS) | set(RESULTS) | set(EXTENDER_RESULTS) | set(FIT_RESULTS) | {"ok", "held"},
        "reason": {r.value for r in Reason} | set(STALE_CATEGORY_NAMES) | {f.value for f in FailOpen},
        "kind": ACTION_KINDS,
        "component": set(ERROR_COMPONENTS),
        "verb": set(EXTENDER_VERBS),
        "how": {"suspend", "evict"},
        "dry_run": {"true", "false"},
        "state": {s.value for s in HeadroomState},
    }
    checked = 0
    for title, _, expr in dashboard_exprs():
        for name, matchers in selectors(expr):
            _, labels = metrics[name]
            for label, op, value in matchers:
                assert label in labels | TARGET_LABELS, f"{title}: {name} has no label {label}"
                if op in ("=", "=~") and label in values and "$" not in value:
                    hits = [v for v in values[label] if re.fullmatch(value, v)]
                    assert hits, f"{title}: {name}{{{label}{op}{value!r}}} matches no value the controller emits"
                    checked += 1
        # the labels aggregated by: sum by (x) (rate(gpu_autoscaler_...)) / max by (x) (gpu_autoscaler_...)
        for by, name in re.findall(r"by \(([^)]*)\) \((?:rate\(|increase\()?(gpu_autoscaler_\w+)", expr):
            _, labels = metrics[name]
            wanted = {b.strip() for b in by.split(",") if b.strip()}
            assert wanted <= labels | TARGET_LABELS, f"{title}: {name} has no {sorted(wanted - labels)}"
    assert checked >= 3


def test_every_runbook_promql_line_parses(tmp_path: Path) -> None:
    """Only the recording-rule names of the runbooks were checked: their queries are run by hand during an incident."""
    lines = runbook_promql_lines()
    assert len(lines) >= 20
    rules = [{"record": f"runbook:line_{i}:query", "expr": q} for i, (_, q) in enumerate(lines)]
    rules.append({"record": "runbook:broken:query", "expr": "sum by (result) (rate(x[5m])"})  # the check can fail
    (tmp_path / "runbooks.yml").write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    proc = subprocess.run(
        [promtool(), "check", "rules", "runbooks.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    errors = re.findall(r'rule (\d+), "([^"]+)": could not parse', proc.stdout + proc.stderr)
    assert [name for _, name in errors] == ["runbook:broken:query"], [lines[int(i) - 1] for i, _ in errors]


def test_label_cardinality_is_bounded() -> None:
    """Per-object labels (namespace/service) only on the per-service gauges, rendered from the latest tick; no pod,
    uid, node or error text in any label; counters and histograms carry closed sets of label values."""
    t = full_telemetry()
    t.services.update([ServiceGauges("ml", f"svc-{i}", 1, 1) for i in range(50)])
    per_service = {
        "gpu_autoscaler_current_replicas", "gpu_autoscaler_desired_replicas", "gpu_autoscaler_stale_services",
        "gpu_autoscaler_forecast_pinball_ratio", "gpu_autoscaler_forecast_reliable",
        "gpu_autoscaler_forecast_fit_age_seconds", "gpu_autoscaler_forecast_floor_replicas",
        "gpu_autoscaler_forecast_fallback", "gpu_autoscaler_headroom_target_ratio", "gpu_autoscaler_headroom_state",
        "gpu_autoscaler_forecast_excess_share",
    }  # fmt: skip
    bounded = {"result", "kind", "reason", "dry_run", "component", "identity", "how", "pool", "verb", "le", "state"}
    for family in t.registry.collect():
        labels = {k for s in family.samples for k in s.labels}
        if family.name in per_service:
            assert family.type == "gauge" and labels <= {"namespace", "service", "reason", "state"}, family.name
        else:
            assert labels <= bounded, f"{family.name}: unbounded labels {sorted(labels - bounded)}"
    before = len([s for f in t.registry.collect() for s in f.samples])
    t.services.update([])
    after = len([s for f in t.registry.collect() for s in f.samples])
    assert before - after == 100  # 50 services x (current, desired): gone with the snapshot


def test_a_deleted_policys_series_go_at_the_next_tick() -> None:
    """A deleted service must not stay exported at its last value (GPUAutoscalerServiceMetricsStale firing forever)."""
    from autoscaler.controller import Controller
    from tests.runtime.runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, policy_object

    cluster = FakeCluster(deployments={"ml/chat": [2, 2], "ml/embed": [1, 1]})
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 70.0
    metrics.stale["ml/embed"] = ("empty result",)
    chat = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)
    embed = ServicePolicy("ml", "embed", min_replicas=1, max_replicas=20, target=70.0)
    policies = FakePolicies([policy_object(chat), policy_object(embed)])
    telemetry = Telemetry(identity="a")
    controller = Controller(metrics=metrics, cluster=cluster, writer=cluster, policies=policies, telemetry=telemetry)
    controller.run_once(1_000_000.0)
    get = telemetry.registry.get_sample_value
    assert get("gpu_autoscaler_stale_services", {"namespace": "ml", "service": "embed", "reason": "no_data"}) == 1
    assert get("gpu_autoscaler_current_replicas", {"namespace": "ml", "service": "embed"}) == 1
    policies.objects = [policy_object(chat)]
    controller.run_once(1_000_015.0)
    rendered = telemetry.render().decode()
    assert 'service="embed"' not in rendered
    assert get("gpu_autoscaler_current_replicas", {"namespace": "ml", "service": "chat"}) == 2


def test_metric_names_follow_the_prometheus_conventions() -> None:
    for family in full_telemetry().registry.collect():
        assert family.name.startswith("gpu_autoscaler_") and family.documentation.strip(), family.name
        names = {s.name for s in family.samples}
        if family.type == "counter":
            assert f"{family.name}_total" in names and not family.name.endswith("_total"), family.name
        elif family.type == "histogram":
            assert family.name.endswith("_seconds"), f"{family.name}: a latency histogram in base units"
            assert {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"} <= names
        else:
            assert family.type == "gauge", family.name
            assert not family.name.endswith(("_total", "_count", "_sum", "_bucket", "_created")), family.name
        if "_seconds" in family.name or family.name.endswith("_ms"):
            assert not family.name.endswith(("_ms", "_milliseconds")) and "millisecond" not in family.documentation


def test_histogram_buckets_resolve_the_thresholds_that_matter() -> None:
    """TickSlow's threshold is a bucket bound (interpolation would otherwise blur it), the default tick interval is one
    too, the extender's buckets reach the scheduler's httpTimeout, and the fit buckets the fit timeout."""
    (tick_slow,) = [e for e in rule_exprs() if "gpu_autoscaler_tick_duration_seconds_bucket" in e and "0.99" in e]
    (threshold,) = re.findall(r">\s*([\d.]+)\s*$", tick_slow.strip())
    assert float(threshold) in TICK_BUCKETS
    assert Settings.model_fields["tick_interval_seconds"].default in TICK_BUCKETS
    timeout = re.search(r"httpTimeout:\s*(\d+(?:\.\d+)?)s", SCHEDULER_CONFIG.read_text())
    assert timeout is not None and max(EXTENDER_BUCKETS) >= float(timeout.group(1))
    assert min(EXTENDER_BUCKETS) <= 0.0001  # tens of microseconds for a small cluster
    assert max(FIT_BUCKETS) >= ForecastSettings.model_fields["fit_timeout_seconds"].default
    for buckets in (TICK_BUCKETS, EXTENDER_BUCKETS, FIT_BUCKETS):
        assert list(buckets) == sorted(set(buckets))
