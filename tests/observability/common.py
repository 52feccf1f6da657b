"""Paths and helpers shared by the alert rules, runbooks and dashboard tests.

promtool and prometheus come from Debian's ``prometheus`` package (2.42). Without them the tests that need them are
skipped locally with the reason, and fail in CI (``CI`` set), where the package must be installed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "rules"
RULE_FILE = RULES_DIR / "gpu-autoscaler.rules.yml"
PROMETHEUS_RULE = ROOT / "deploy" / "base" / "prometheusrule.yaml"
RUNBOOKS_DIR = ROOT / "deploy" / "runbooks"
DASHBOARDS_DIR = ROOT / "dashboards"
RUNBOOK_BASE = "https://github.com/example/gpu-autoscaler/blob/main/deploy/runbooks"

INSTALL_HINT = "install Debian's package: apt-get install -y --no-install-recommends prometheus"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if in_ci():
            pytest.fail(f"CI is set but `{name}` is not installed: {INSTALL_HINT}")
        pytest.skip(f"`{name}` is not installed ({INSTALL_HINT}); CI runs these tests")
    return path


def load_rules() -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load(RULE_FILE.read_text())
    return rules


def alerts(rules: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Alert name -> rule, for every alert of the plain rule file."""
    rules = rules if rules is not None else load_rules()
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def unit_test_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*_test.yml"))


def require_grafana_sdk() -> None:
    """The dashboard generator's SDK (the ``test`` extra): skipped locally without it, a failure in CI."""
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        message = "grafana-foundation-sdk is not installed: pip install 'grafana-foundation-sdk==0.0.21'"
        if in_ci():
            pytest.fail(f"CI is set but {message}")
        pytest.skip(message)
