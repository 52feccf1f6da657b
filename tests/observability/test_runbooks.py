"""Runbooks: one per alert and one alert per runbook, each with the sections an on-call engineer looks for, commands
that exist, and an index that lists them all.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.observability.common import RUNBOOKS_DIR, alerts, load_rules

SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation", "## Escalation")
INDEX = RUNBOOKS_DIR / "README.md"


def runbooks() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(RUNBOOKS_DIR.glob("*.md")) if p != INDEX}


def test_every_alert_has_a_runbook_and_every_runbook_an_alert() -> None:
    defined, written = set(alerts()), set(runbooks())
    assert defined - written == set(), f"alerts without a runbook: {sorted(defined - written)}"
    assert written - defined == set(), f"runbooks without an alert: {sorted(written - defined)}"


@pytest.mark.parametrize("name", sorted(alerts()))
def test_runbook_has_the_sections_and_names_its_alert(name: str) -> None:
    text = runbooks().get(name, "")
    assert text.startswith(f"# {name}\n"), "the title is the alert name"
    positions = [text.find(s + "\n") for s in SECTIONS]
    missing = [s for s in SECTIONS if s + "\n" not in text]
    assert not missing, f"missing sections: {missing}"
    assert positions == sorted(positions), "sections in the usual order"
    severity = alerts()[name]["labels"]["severity"]
    assert f"| Severity | {severity} |" in text, "the runbook states the alert's severity"
    diagnosis = text[text.find("## Diagnosis") : text.find("## Mitigation")]
    assert "```promql" in diagnosis or "```bash" in diagnosis, "diagnosis gives commands to run"


def test_runbooks_give_promql_kubectl_and_autoscaler_commands() -> None:
    every = "\n".join(runbooks().values())
    assert every.count("```promql") >= len(alerts()) - 2
    assert "kubectl " in every and "autoscaler plan" in every and "autoscaler observe" in every


def promql_blocks(text: str) -> list[str]:
    return re.findall(r"```promql\n(.*?)```", text, flags=re.S)


def test_runbook_promql_uses_only_known_recording_rules() -> None:
    """A runbook query against a recorded series must name one the rules record (renames break runbooks)."""
    recorded = {r["record"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}
    for name, text in runbooks().items():
        for block in promql_blocks(text):
            for series in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", block):
                assert series in recorded, f"{name}: {series} is not a recording rule"


def test_runbook_cli_commands_exist() -> None:
    """Every ``autoscaler <command> --flag`` in a runbook is a command and flag the CLI accepts."""
    used: dict[str, set[str]] = {}
    for text in runbooks().values():
        for command, rest in re.findall(r"\bautoscaler (plan|observe|run|simulate)\b([^`\n|]*)", text):
            used.setdefault(command, set()).update(re.findall(r"(--[a-z][a-z-]*)", rest))
    assert {"plan", "observe"} <= set(used)
    for command, flags in used.items():
        help_text = subprocess.run(
            [sys.executable, "-m", "autoscaler.cli", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        unknown = {f for f in flags if f not in help_text}
        assert not unknown, f"autoscaler {command} has no {sorted(unknown)}"


def test_the_index_lists_every_alert() -> None:
    index = INDEX.read_text()
    for name, rule in alerts().items():
        row = next((line for line in index.splitlines() if line.startswith(f"| [{name}]({name}.md) |")), None)
        assert row is not None, f"{name} is not in deploy/runbooks/README.md"
        assert f"| {rule['labels']['severity']} |" in row
