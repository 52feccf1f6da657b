"""Fixtures for the tests against a real control plane (see control_plane.py): one per test session, a namespace
per test.

The binaries come from ``scripts/control-plane.sh`` (or the directory in ``$GPU_AUTOSCALER_CONTROL_PLANE_BIN``).
Without them every test here is skipped with the reason, except when ``$CI`` is set: there a missing control plane
is an error, so CI never goes green by skipping the real-cluster tests. When a test fails, the tails of every
component's log are attached to its report; the full logs stay in the session's tmp dir (printed at the end).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from tests.realkube.control_plane import ControlPlane, ControlPlaneError, find_binaries

_running: list[ControlPlane] = []
_summary: list[str] = []


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the real control plane is unavailable: {why}", pytrace=False)
        pytest.skip(why)
    work_dir = tmp_path_factory.mktemp("realkube")
    cp = ControlPlane(bin_dir=bin_dir, work_dir=work_dir)
    failure = None
    try:
        cp.start()
    except (ControlPlaneError, OSError, subprocess.SubprocessError) as exc:
        failure = f"the control plane did not start (logs in {cp.logs}):\n{exc}"
    except BaseException:
        cp.stop()
        raise
    if failure is not None:
        cp.stop()  # every component started so far, by pid
        pytest.fail(failure, pytrace=False)
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in cp.timings.items())
    _summary.append(f"real control plane from {bin_dir}: up in {cp.timings['ready']:.1f}s ({timings}); logs {cp.logs}")
    _running.append(cp)
    try:
        yield cp
    finally:
        _running.remove(cp)
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.admin_kubeconfig


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` built the way the controller builds it."""
    api = load_api_client("kubeconfig", kubeconfig)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) for one test, deleted afterwards (not waited for)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"rk-{base}-{secrets.token_hex(3)}"
    control_plane.create_namespace(name)
    try:
        yield name
    finally:
        control_plane.delete_namespace(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _running and "control_plane" in getattr(item, "fixturenames", ()):
        cp = _running[-1]
        pids = ", ".join(f"{k}={v}" for k, v in cp.pids().items())
        report.sections.append(("control plane logs", f"pids: {pids}\nlogs: {cp.logs}\n{cp.log_tails(lines=20)}"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
