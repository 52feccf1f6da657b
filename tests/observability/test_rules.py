"""The Prometheus rules: promtool accepts them, their unit tests pass and would catch a broken alert, the installed
PrometheusRule is the plain rule file, and the rules speak the controller's metric names and label values.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.actuator import RESULTS
from autoscaler.adapters.promql import POD_TO_DEPLOYMENT_RE
from autoscaler.core import model
from autoscaler.core.reasons import Reason
from autoscaler.telemetry import ERROR_COMPONENTS, ServiceGauges, Telemetry
from tests.observability.common import (
    PROMETHEUS_RULE,
    RULE_FILE,
    RULES_DIR,
    RUNBOOK_BASE,
    alerts,
    load_rules,
    unit_test_files,
)

SEVERITIES = {"critical", "warning", "info"}
TICK_RESULTS = {"ok", "hold", "error", "standby"}
ACTION_RESULTS = set(RESULTS)
MATCHER = re.compile(r'\b([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def promtool_run(promtool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def parallel(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    # promtool builds a small TSDB per test group (~0.1 s each): run files side by side to keep the suite fast.
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(fn, items))


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"unparsed duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def expressions() -> list[str]:
    return [r["expr"] for g in load_rules()["groups"] for r in g["rules"]]


# ---- promtool ---------------------------------------------------------------------------------------------------


def test_promtool_check_rules(promtool: str) -> None:
    proc = promtool_run(promtool, "check", "rules", str(RULE_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(expressions())} rules found" in proc.stdout


def test_promtool_check_rules_rejects_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    rules = load_rules()
    rules["groups"][0]["rules"][0]["expr"] = "sum by (job) (rate(gpu_autoscaler_ticks_total[5m])"
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(yaml.safe_dump(rules))
    proc = promtool_run(promtool, "check", "rules", str(broken))
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    files = unit_test_files()
    assert {f.name for f in files} >= {"controller_test.yml", "scaling_test.yml", "gpu_test.yml"}
    results = parallel(lambda f: (f.name, promtool_run(promtool, "test", "rules", f.name, cwd=RULES_DIR)), files)
    failures = {name: p.stdout + p.stderr for name, p in results if p.returncode != 0}
    assert not failures, failures


# ---- coverage of the unit tests ---------------------------------------------------------------------------------


def alert_checks() -> dict[str, list[tuple[str, float, bool]]]:
    """Alert name -> [(test group, eval time in s, expects firing alerts)] over all unit-test files."""
    checks: dict[str, list[tuple[str, float, bool]]] = {}
    for path in unit_test_files():
        for i, group in enumerate(yaml.safe_load(path.read_text())["tests"]):
            where = f"{path.name}#{i} {group.get('name', '')}"
            for check in group.get("alert_rule_test", []):
                firing = bool(check.get("exp_alerts"))
                checks.setdefault(check["alertname"], []).append((where, seconds(check["eval_time"]), firing))
    return checks


def test_every_alert_is_unit_tested_quiet_firing_and_resolved() -> None:
    checks = alert_checks()
    defined = set(alerts())
    assert set(checks) <= defined, f"tests name unknown alerts: {set(checks) - defined}"
    problems = []
    for name in sorted(defined):
        by_group: dict[str, list[tuple[float, bool]]] = {}
        for where, t, firing in checks.get(name, []):
            by_group.setdefault(where, []).append((t, firing))
        # In one test group: quiet (or pending) before it fires, firing, and resolved after it fired.
        complete = False
        for evals in by_group.values():
            fired = [t for t, firing in evals if firing]
            quiet = [t for t, firing in evals if not firing]
            if fired and any(t < min(fired) for t in quiet) and any(t > min(fired) for t in quiet):
                complete = True
        if not complete:
            problems.append(name)
    assert not problems, f"alerts without a quiet -> firing -> resolved unit test: {problems}"


def never_fires(rule: dict[str, Any]) -> None:
    rule["expr"] = "vector(1) < 0"


def fires_at_once(rule: dict[str, Any]) -> None:
    rule.pop("for")


def never_resolves(rule: dict[str, Any]) -> None:
    # Keep the last result for an hour after the condition clears: only a "resolved" expectation notices.
    rule["expr"] = f"last_over_time(({rule['expr'].strip()})[1h:1m])"


# mutation -> (how to break an alert, which of its checks must then fail)
MUTATIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "never fires": (never_fires, "firing"),
    "fires without waiting for `for`": (fires_at_once, "before"),
    "never resolves": (never_resolves, "after"),
}
FAILED_CHECK = re.compile(r"alertname: (\w+), time: (\w+),")


def check_times(kind: str) -> dict[str, set[float]]:
    """Alert -> eval times of its checks of one kind: firing, quiet/pending before firing, resolved after firing."""
    times: dict[str, set[float]] = {}
    by_group: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for name, evals in alert_checks().items():
        for where, t, firing in evals:
            by_group.setdefault((name, where), []).append((t, firing))
    for (name, _), evals in by_group.items():
        fired = [t for t, firing in evals if firing]
        if not fired:
            continue
        for t, firing in evals:
            if (kind == "firing" and firing) or (
                not firing and (t < min(fired) if kind == "before" else t > min(fired))
            ):
                times.setdefault(name, set()).add(t)
    return times


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_unit_tests_catch_a_broken_alert(promtool: str, tmp_path: Path, mutation: str) -> None:
    """Break every alert the same way: for each alert, one of its checks of the expected kind must fail.

    promtool names the alert and time of each failed check, so one run per test file covers every alert; alerts do
    not read each other, so breaking them together is the same as breaking them one at a time.
    """
    mutate, kind = MUTATIONS[mutation]
    rules = load_rules()
    for rule in alerts(rules).values():
        mutate(rule)
    (tmp_path / RULE_FILE.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    for path in unit_test_files():
        (tmp_path / path.name).write_text(path.read_text())
    runs = parallel(lambda f: promtool_run(promtool, "test", "rules", f.name, cwd=tmp_path), unit_test_files())
    failed: dict[str, set[float]] = {}
    for proc in runs:
        for name, at in FAILED_CHECK.findall(proc.stdout + proc.stderr):
            failed.setdefault(name, set()).add(seconds(at))
    expected = check_times(kind)
    assert set(expected) == set(alerts()), f"alerts without {kind} checks: {set(alerts()) - set(expected)}"
    uncaught = sorted(name for name, times in expected.items() if not failed.get(name, set()) & times)
    assert not uncaught, f"no {kind} check fails with these alerts mutated ({mutation}): {uncaught}"


# ---- alert metadata ---------------------------------------------------------------------------------------------


def test_every_alert_has_severity_annotations_and_runbook_url() -> None:
    found = alerts()
    assert len(found) >= 15
    for name, rule in found.items():
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), name
        assert set(rule["labels"]) == {"severity"} and rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].strip() and len(annotations["description"]) > len(annotations["summary"])
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}/{name}.md", name
        assert seconds(rule["for"]) >= 60, f"{name}: a `for` of at least a minute rides out one bad scrape"


def test_alert_names_are_unique_across_groups() -> None:
    names = [r["alert"] for g in load_rules()["groups"] for r in g["rules"] if "alert" in r]
    records = [r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r]
    assert len(names) == len(set(names)) and len(records) == len(set(records))
    for record in records:
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", record), f"{record}: level:metric:operations"


# ---- the PrometheusRule -----------------------------------------------------------------------------------------


def load_generator() -> Any:
    sys.path.insert(0, str(RULES_DIR))
    try:
        import generate

        return generate
    finally:
        sys.path.remove(str(RULES_DIR))


def test_prometheusrule_is_the_plain_rule_file() -> None:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "gpu-autoscaler"
    assert doc["spec"] == load_rules()
    assert PROMETHEUS_RULE.read_text() == load_generator().render(RULE_FILE.read_text()), (
        "run: python deploy/rules/generate.py"
    )
    check = subprocess.run(
        [sys.executable, str(RULES_DIR / "generate.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr


def test_generator_check_fails_when_out_of_date(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate = load_generator()
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(PROMETHEUS_RULE.read_text().replace("for: 5m", "for: 6m", 1))
    monkeypatch.setattr(generate, "TARGET", stale)
    assert generate.main(["--check"]) == 1


def test_runbook_base_can_be_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate = load_generator()
    for path in [RULE_FILE, *unit_test_files()]:
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(generate, "RULES_DIR", tmp_path)
    monkeypatch.setattr(generate, "SOURCE", tmp_path / RULE_FILE.name)
    new_base = "https://git.example.com/platform/gpu-autoscaler/-/blob/main/deploy/runbooks"
    changed = generate.set_runbook_base(new_base + "/")
    assert {p.name for p in changed} == {RULE_FILE.name, *(p.name for p in unit_test_files())}
    rules = yaml.safe_load((tmp_path / RULE_FILE.name).read_text())
    assert {r["annotations"]["runbook_url"] for r in alerts(rules).values()} == {
        f"{new_base}/{name}.md" for name in alerts()
    }
    # only the runbook_url lines changed
    for path in [RULE_FILE, *unit_test_files()]:
        old, new = path.read_text().splitlines(), (tmp_path / path.name).read_text().splitlines()
        assert len(old) == len(new)
        assert all(a == b or ("runbook_url" in a and new_base in b) for a, b in zip(old, new, strict=True))


# ---- the rules speak the controller's language ------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    telemetry = Telemetry(identity="test")
    telemetry.services.update([ServiceGauges("ns", "svc", 1, 2, ("no_data",))])
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        family.name + suffix for family in telemetry.registry.collect() for suffix in suffixes.get(family.type, [""])
    }


def test_rules_use_metrics_the_controller_exports() -> None:
    exported = exported_metric_names()
    used = {m for expr in expressions() for m in re.findall(r"(?<![\w:])gpu_autoscaler_\w+", expr)}
    assert used and used <= exported, f"not exported by autoscaler/telemetry.py: {used - exported}"


def matcher_values(label: str) -> set[str]:
    values: set[str] = set()
    for expr in expressions():
        for name, op, value in MATCHER.findall(expr):
            if name == label and op in ("=", "=~"):
                values |= set(value.split("|")) if op == "=~" else {value}
    return values


def test_rules_use_label_values_the_controller_emits() -> None:
    assert matcher_values("reason") <= {r.value for r in Reason}
    actions = {
        cls.__name__
        for cls in (
            model.ScaleDeployment,
            model.EvictPod,
            model.SuspendWorkload,
            model.ResumeWorkload,
            model.ScaleNodePool,
        )
    }
    assert matcher_values("kind") <= actions
    assert matcher_values("component") <= set(ERROR_COMPONENTS)
    assert matcher_values("result") <= TICK_RESULTS | ACTION_RESULTS


def test_every_error_component_is_covered_by_an_alert() -> None:
    """A new component in telemetry.ERROR_COMPONENTS must be given to an alert (or this list) deliberately."""
    rules = alerts()
    holding = rules["GPUAutoscalerTicksHolding"]["expr"]
    assert 'result=~"hold|error"' in holding
    covered_by_holding = {"metrics_read", "cluster_read", "policy_read", "decide"}  # they make ticks hold / error
    covered_by_actions = {"cluster_write", "node_pool"}  # they fail actions
    assert 'result="failed"' in rules["GPUAutoscalerActionsFailing"]["expr"]
    (component_regex,) = re.findall(r'component=~"([^"]+)"', rules["GPUAutoscalerComponentErrors"]["expr"])
    covered = covered_by_holding | covered_by_actions | set(component_regex.split("|"))
    assert covered == set(ERROR_COMPONENTS)


def test_burst_spend_threshold_is_set_in_one_place() -> None:
    """The alert (expression and description) and the dashboard read one recording rule; no second number."""
    name = "cluster:gpu_autoscaler_burst_spend_per_hour:alert_threshold"
    rules = [r for g in load_rules()["groups"] for r in g["rules"]]
    (threshold,) = [r for r in rules if r.get("record") == name]
    assert re.fullmatch(r"vector\(\d+(\.\d+)?\)", threshold["expr"].strip())
    spend = alerts()["GPUAutoscalerBurstSpendHigh"]
    assert name in spend["expr"] and not re.search(r"[<>]=?\s*\d", spend["expr"]), "compare with the recorded threshold"
    assert f'query "{name}"' in spend["annotations"]["description"]


def test_inference_pods_use_the_adapters_pod_regex() -> None:
    pod_regexes = [m.group(1) for expr in expressions() for m in re.finditer(r'"pod",\s*"([^"]+)"', expr)]
    assert len(pod_regexes) >= 3 and set(pod_regexes) == {POD_TO_DEPLOYMENT_RE}
