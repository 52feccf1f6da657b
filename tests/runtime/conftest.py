"""Prints the fault suite's table (tests/runtime/test_faults.py) at the end of the run, when it ran."""

from __future__ import annotations

import pytest
from controller_process import FAULT_TABLE


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FAULT_TABLE:
        return
    terminalreporter.section("fault suite: autoscaler run as a program")
    terminalreporter.write_line(f"{'fault':<56} {'replicas during':<16} {'first action after':<30} recovery s")
    for row in FAULT_TABLE:
        during = ",".join(str(r) for r in row.replicas_during)
        took = "-" if row.recovery_s is None else f"{row.recovery_s:.1f}"
        terminalreporter.write_line(f"{row.fault:<56} {during:<16} {row.first_action:<30} {took}")
