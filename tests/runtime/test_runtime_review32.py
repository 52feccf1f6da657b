"""Runtime review 32: a tick waiting for a long rebalance pass is no stall (a hung pass still fails /healthz, after a
bound of its own); a standby's tick is not a writing job at shutdown; the HTTP servers report the ports they bound.

Every wait here is gated by a ``threading.Event`` or polled with a generous deadline; the only sleeps are lower bounds
("at least this long has passed"), which a loaded machine can only lengthen."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, get, policy_object, wait_for

from autoscaler.app import Adapters, build_runtime, rebalance_stall_seconds
from autoscaler.controller import Controller
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import ServicePolicy
from autoscaler.extender_http import LatestSnapshot
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings
from autoscaler.telemetry import Telemetry
from tests.kube.fake_apiserver import write_kubeconfig

REPO = Path(__file__).resolve().parents[2]


def make_controller(cluster: FakeCluster) -> tuple[Controller, FakeMetrics, Telemetry]:
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 140.0
    telemetry = Telemetry(identity="a")
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    return controller, metrics, telemetry


class GatedPass:
    """A rebalance pass that, like ``Controller.rebalance``, holds the controller's lock for the whole pass, and runs
    until the test releases it (the bound only keeps a failed test from hanging)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.entered = threading.Event()
        self.release = threading.Event()
        self.passes = 0

    def __call__(self, now: float) -> None:
        with self.controller._lock:
            self.entered.set()
            self.release.wait(30)
            self.passes += 1


def run_now(runtime: Runtime, job: str) -> None:
    runtime.scheduler.modify_job(job, next_run_time=datetime.now(UTC))


def pass_runtime(
    tick_stall_s: float, rebalance_stall_s: float, http: tuple[str, int] | None = None
) -> tuple[Runtime, Controller, FakeMetrics, GatedPass]:
    """A leader (no election) whose jobs run only when the test brings them forward (after the first tick)."""
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    controller, metrics, telemetry = make_controller(cluster)
    rebalance = GatedPass(controller)
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=3600,
        refit_interval_s=3600,
        rebalance_interval_s=3600,
        tick_stall_s=tick_stall_s,
        rebalance_stall_s=rebalance_stall_s,
        shutdown_grace_s=5.0,
        rebalance=rebalance,
        http=http,
    )
    return runtime, controller, metrics, rebalance


def start_and_run_the_pass(runtime: Runtime, controller: Controller, rebalance: GatedPass) -> None:
    runtime.start()
    assert wait_for(lambda: controller.last_report is not None and runtime.jobs_running() == 0)  # the first tick
    run_now(runtime, "rebalance")
    assert rebalance.entered.wait(10)


# ---- 1. a long rebalance pass is not a stalled tick; a hung one still fails /healthz ------------------------------


def test_a_tick_waiting_for_a_long_rebalance_pass_is_not_a_stalled_tick() -> None:
    """The tick set its stall timer, then waited in run_once for the controller's lock, which a rebalance pass held
    for the whole pass: a pass longer than tick_stall_seconds (evictions under a slow API) failed /healthz with "a
    tick has been running for ...", and the livenessProbe restarted a controller that was not wedged."""
    runtime, controller, metrics, rebalance = pass_runtime(tick_stall_s=0.5, rebalance_stall_s=60.0)
    try:
        start_and_run_the_pass(runtime, controller, rebalance)
        run_now(runtime, "tick")
        assert wait_for(lambda: runtime.jobs_running() == 2)  # the tick is waiting for the pass
        time.sleep(1.0)  # at least twice the tick's stall bound
        ok, message = runtime.healthz()
        assert ok, message
        assert metrics.calls == 1  # the tick has not read anything yet: it is waiting for the pass
    finally:
        rebalance.release.set()
        assert wait_for(lambda: metrics.calls == 2)  # then it runs
        runtime.stop()
    assert rebalance.passes == 1


def test_no_tick_for_does_not_fire_while_a_pass_runs_within_its_bound() -> None:
    runtime, controller, _metrics, rebalance = pass_runtime(tick_stall_s=0.5, rebalance_stall_s=60.0)
    try:
        start_and_run_the_pass(runtime, controller, rebalance)
        time.sleep(1.0)  # no tick for at least twice the tick's stall bound: the pass is running
        ok, message = runtime.healthz()
        assert ok, message
        assert "rebalance pass" in message
    finally:
        rebalance.release.set()
        runtime.stop()


def test_a_hung_rebalance_pass_fails_healthz_after_its_own_bound() -> None:
    """A hung pass blocks every tick: it must still fail /healthz, after the pass's bound (not the tick's)."""
    runtime, controller, _metrics, rebalance = pass_runtime(
        tick_stall_s=60.0, rebalance_stall_s=0.3, http=("127.0.0.1", 0)
    )
    assert runtime.http is not None
    port = runtime.http.port
    try:
        start_and_run_the_pass(runtime, controller, rebalance)
        run_now(runtime, "tick")  # a tick waiting for the hung pass does not hide it
        assert wait_for(lambda: get(port, "/healthz")[0] == 503, timeout=10)
        status, body = get(port, "/healthz")
        assert status == 503 and "a rebalance pass has been running for" in body, body
        assert "(> 0.3s)" in body
    finally:
        rebalance.release.set()
    # the end of the pass is progress, and the tick that waited for it runs
    assert wait_for(lambda: get(port, "/healthz")[0] == 200)
    runtime.stop()


class FakeElector:
    """Just what the Runtime asks of a ``LeaderElector``; ``stop`` records whether the Lease was released."""

    def __init__(self, leader: bool, ask: Callable[[], None] = lambda: None) -> None:
        self.leader = leader
        self.ask = ask  # runs inside may_write(), e.g. to hold a tick inside its leadership check
        self.released: list[bool] = []
        self.holder = "a" if leader else "b"
        self.last_attempt_ok = True

    def is_leader(self) -> bool:
        return self.leader

    def may_write(self) -> bool:
        self.ask()
        return self.leader

    def start(self) -> None:
        pass

    def stop(self, release: bool = True) -> None:
        self.released.append(release)


def test_stop_waits_for_a_running_pass_and_the_tick_waiting_for_it() -> None:
    """Both still count as writing jobs: stop() waits for them (within the grace), then releases the Lease; the tick
    that ran after stop() began wrote nothing."""
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    controller, _metrics, telemetry = make_controller(cluster)
    rebalance = GatedPass(controller)
    elector = FakeElector(leader=True)
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=3600,
        refit_interval_s=3600,
        rebalance_interval_s=3600,
        tick_stall_s=60.0,
        rebalance_stall_s=60.0,
        shutdown_grace_s=20.0,
        elector=elector,  # type: ignore[arg-type]
        rebalance=rebalance,
        http=None,
    )
    start_and_run_the_pass(runtime, controller, rebalance)
    writes_before = len(cluster.writes)
    run_now(runtime, "tick")
    assert wait_for(lambda: runtime.jobs_running() == 2)
    stopper = threading.Thread(target=runtime.stop)
    stopper.start()
    assert wait_for(lambda: not runtime.can_act())  # stop() began
    stopper.join(0.2)
    assert stopper.is_alive()  # waiting for the pass (and the tick behind it)
    assert elector.released == []
    rebalance.release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert elector.released == [True]
    assert runtime.jobs_running() == 0
    assert len(cluster.writes) == writes_before
    assert controller.last_report is not None
    assert {r.result for r in controller.last_report.results} <= {"not_leader"}


# ---- 1b. the pass's bound, from settings -------------------------------------------------------------------------


def test_the_rebalance_stall_bound_covers_every_request_of_a_pass() -> None:
    settings = Settings(
        tick_stall_seconds=120, kubernetes={"request_timeout_seconds": 10}, rebalance={"max_moves_per_pass": 2}
    )
    # the tick's bound (the pass's cluster read is a tick's), plus 3 ledger requests and 6 per move, each up to
    # twice the request timeout (one retried connection)
    assert rebalance_stall_seconds(settings) == 120 + (3 + 6 * 2) * 2 * 10
    settings = Settings(
        tick_stall_seconds=120, kubernetes={"request_timeout_seconds": 10}, rebalance={"max_moves_per_pass": 0}
    )
    assert rebalance_stall_seconds(settings) == 120 + 3 * 2 * 10


# ---- 2. a standby's tick is not a writing job at shutdown ------------------------------------------------------


class HangingReader:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def snapshot(self, now: float) -> ClusterSnapshot:
        self.entered.set()
        self.release.wait(30)
        return ClusterSnapshot(time=now)


def test_a_standby_tick_with_a_hung_snapshot_read_does_not_hold_up_shutdown() -> None:
    """A standby's tick only reads (the scheduler extender's snapshot) but was counted as writing: stop() waited the
    whole grace period for it, then left the Lease to expire instead of releasing it."""
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    controller, _metrics, telemetry = make_controller(cluster)
    reader = HangingReader()
    elector = FakeElector(leader=False)
    runtime = Runtime(
        controller,
        telemetry,
        shutdown_grace_s=0.5,
        elector=elector,  # type: ignore[arg-type]
        http=None,
        extender_snapshots=LatestSnapshot(reader),
    )
    ticker = threading.Thread(target=runtime.tick)
    ticker.start()
    try:
        assert reader.entered.wait(10)
        runtime.stop()
        assert elector.released == [True]  # nothing was writing: the Lease is released
        assert runtime.jobs_running() == 1  # the hung read is still running (``autoscaler run`` exits without it)
    finally:
        reader.release.set()
        ticker.join(30)
    assert not ticker.is_alive()
    assert cluster.writes == []


def test_a_tick_that_finds_it_leads_as_shutdown_begins_counts_as_writing() -> None:
    """The race: a tick asks whether it leads (yes) while stop() begins. It counts as writing before it asks, so
    stop() waits for it; and it writes nothing (stop() is in progress: every write asks again)."""
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    controller, _metrics, telemetry = make_controller(cluster)
    asking, answer = threading.Event(), threading.Event()
    first = [True]

    def ask() -> None:
        if first[0]:  # the tick's own check: held until stop() has begun
            first[0] = False
            asking.set()
            answer.wait(30)

    elector = FakeElector(leader=True, ask=ask)
    runtime = Runtime(
        controller, telemetry, shutdown_grace_s=20.0, elector=elector, http=None  # type: ignore[arg-type]
    )
    ticker = threading.Thread(target=runtime.tick)
    ticker.start()
    assert asking.wait(10)
    running_when_stopped: list[int] = []

    def stop() -> None:
        runtime.stop()
        running_when_stopped.append(runtime.jobs_running())

    stopper = threading.Thread(target=stop)
    stopper.start()
    assert wait_for(lambda: not runtime.can_act())  # stop() began (and is waiting, or about to)
    answer.set()  # "yes, this replica leads"
    stopper.join(30)
    ticker.join(30)
    assert not stopper.is_alive() and not ticker.is_alive()
    assert running_when_stopped == [0]  # stop() waited for the tick
    assert elector.released == [True]
    assert cluster.writes == []
    assert controller.last_report is not None
    assert [r.result for r in controller.last_report.results] == ["not_leader"]


# ---- 3. port 0: the ports really bound are the ones reported ------------------------------------------------------


def test_port_zero_reports_the_bound_ports_and_serves_healthz_on_them(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(
        leader_election={"enabled": False},
        http={"bind_address": "127.0.0.1", "port": 0},
        scheduler_extender={"enabled": True, "bind_address": "127.0.0.1", "port": 0},
    )
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    metrics = FakeMetrics(cluster)
    adapters = Adapters(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        node_pools=None,
    )
    runtime = build_runtime(settings, adapters, refit=lambda now: None)
    assert runtime.http is not None and runtime.extender is not None
    caplog.set_level(logging.INFO, logger="autoscaler")
    runtime.start()
    try:
        text = caplog.text
        http_port = re.search(r"serving /metrics /healthz /readyz on port (\d+)", text)
        extender_port = re.search(r"serving the scheduler extender .* on port (\d+)", text)
        assert http_port and extender_port, text
        assert int(http_port.group(1)) == runtime.http.port != 0
        assert int(extender_port.group(1)) == runtime.extender.port != 0
        assert wait_for(lambda: get(int(http_port.group(1)), "/healthz")[0] == 200, timeout=10)
        assert get(int(extender_port.group(1)), "/healthz")[0] == 200
    finally:
        runtime.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_autoscaler_run_with_port_zero_logs_the_ports_it_bound(tmp_path: Path) -> None:
    """``autoscaler run`` with AUTOSCALER_HTTP__PORT=0 and the extender's port 0: its log names the ports bound, and
    /healthz answers on them (the Kubernetes API and Prometheus are closed ports: every tick holds)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{closed_port()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "POD_NAME": "me",
            "POD_NAMESPACE": "default",
            "AUTOSCALER_LEADER_ELECTION__ENABLED": "false",
            "AUTOSCALER_HTTP__BIND_ADDRESS": "127.0.0.1",
            "AUTOSCALER_HTTP__PORT": "0",
            "AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true",
            "AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS": "127.0.0.1",
            "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "0",
            "AUTOSCALER_KUBERNETES__CONFIG_MODE": "kubeconfig",
            "AUTOSCALER_KUBERNETES__KUBECONFIG": str(kubeconfig),
            "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
            "AUTOSCALER_PROMETHEUS_URL": f"http://127.0.0.1:{closed_port()}",
            "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "1",
            "AUTOSCALER_PROMETHEUS_RETRIES": "0",
            "AUTOSCALER_FORECAST__WORKERS": "1",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli", "run"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()

    def ports() -> tuple[int, int] | None:
        text = "".join(lines)
        http = re.search(r"serving /metrics /healthz /readyz on port (\d+)", text)
        extender = re.search(r"serving the scheduler extender .* on port (\d+)", text)
        return (int(http.group(1)), int(extender.group(1))) if http and extender else None

    try:
        assert wait_for(lambda: ports() is not None or proc.poll() is not None, timeout=120)
        found = ports()
        assert found is not None, "".join(lines)
        http_port, extender_port = found
        assert 0 not in found
        assert get(http_port, "/healthz")[0] == 200, "".join(lines)
        assert get(extender_port, "/healthz")[0] == 200, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(10)
    assert proc.returncode == 0, "".join(lines)


# ---- 4. a delete-machine mark left behind is counted ---------------------------------------------------------------


def test_a_delete_machine_mark_left_behind_is_counted_by_why() -> None:
    """The Cluster API adapter tells ``on_mark_left`` of every mark a scale-down leaves behind (the pool's next
    scale-down, anyone's, removes that node); it was only logged. ``build_runtime`` counts it in telemetry."""
    from kubernetes import client

    from autoscaler.adapters.kubernetes.nodepool import MachineDeploymentNodePools

    settings = Settings(leader_election={"enabled": False}, http={"bind_address": "127.0.0.1", "port": 0})
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    pools = MachineDeploymentNodePools(client.ApiClient(), "capi-system")
    adapters = Adapters(
        metrics=FakeMetrics(cluster),
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        node_pools=pools,
    )
    runtime = build_runtime(settings, adapters, refit=lambda now: None, http=False)
    assert pools.on_mark_left is not None
    pools.on_mark_left("capi-system/burst-a", "outcome_unknown")
    pools.on_mark_left("capi-system/burst-b", "outcome_unknown")
    counted = runtime.telemetry.registry.get_sample_value(
        "gpu_autoscaler_node_pool_delete_marks_left_total", {"reason": "outcome_unknown"}
    )
    assert counted == 2.0
    assert (
        runtime.telemetry.registry.get_sample_value(
            "gpu_autoscaler_node_pool_delete_marks_left_total", {"reason": "unmark_failed"}
        )
        == 0.0
    )
