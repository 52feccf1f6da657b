"""Runtime: the tick job (on the monotonic clock), /metrics /healthz /readyz over HTTP, leader-only acting, handover."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import apscheduler.schedulers.base as apscheduler_base
import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, get, policy_object, wait_for

from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector
from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.runtime import Runtime
from autoscaler.telemetry import Telemetry

# A fast retry (a released Lease is taken within 0.05 s); a lease and renew deadline long enough that a renewal
# thread starved for a moment on a loaded machine neither drops the leader nor lets the follower take an "expired"
# Lease in the middle of a test (no test here waits for an expiry).
FAST = ElectionTimings(lease_duration_s=5.0, renew_deadline_s=3.0, retry_period_s=0.05)


def build(
    cluster: FakeCluster, store: InMemoryLeaseStore | None, identity: str, tick: float = 0.1
) -> tuple[Runtime, Controller]:
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 140.0
    telemetry = Telemetry(identity=identity)
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    ref: list[Runtime] = []
    elector = None
    if store is not None:
        elector = LeaderElector(
            store,
            identity,
            FAST,
            on_started_leading=lambda: ref[0].on_started_leading(),
            on_stopped_leading=lambda: ref[0].on_stopped_leading(),
        )
    runtime = Runtime(
        controller,
        telemetry,
        tick_interval_s=tick,
        tick_stall_s=2.0,
        shutdown_grace_s=2.0,
        elector=elector,
        http=("127.0.0.1", 0),
    )
    ref.append(runtime)
    return runtime, controller


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    for runtime in started:
        runtime.stop()


def test_runtime_ticks_serves_metrics_and_health(runtimes: list[Runtime]) -> None:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    runtime, _controller = build(cluster, None, "solo")
    assert runtime.http is not None
    port = runtime.http.port
    assert runtime.readyz() == (False, "no successful tick yet")
    runtime.start()
    runtimes.append(runtime)
    # 1 -> 2 -> 4 over two ticks; the scale-up rate policy (4 pods per 15 s) then caps it at 5
    assert wait_for(lambda: cluster.deployments["ml/chat"][0] == 5)
    status, body = get(port, "/metrics")
    assert status == 200
    assert 'gpu_autoscaler_ticks_total{result="ok"}' in body
    assert 'gpu_autoscaler_desired_replicas{namespace="ml",service="chat"}' in body
    assert 'gpu_autoscaler_leader{identity="solo"} 1.0' in body
    assert "gpu_autoscaler_tick_duration_seconds_bucket" in body
    assert get(port, "/healthz") == (200, "ok: tick loop alive\n")
    assert get(port, "/readyz")[0] == 200
    assert get(port, "/nope")[0] == 404


def test_wedged_tick_fails_healthz(runtimes: list[Runtime]) -> None:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    runtime, _controller = build(cluster, None, "solo", tick=0.1)
    release = threading.Event()
    original = cluster.snapshot

    def hang(now: float):  # type: ignore[no-untyped-def]
        release.wait(120)  # released by the test; the bound only keeps a failed test from hanging
        return original(now)

    cluster.snapshot = hang  # type: ignore[method-assign]
    runtime.start()
    runtimes.append(runtime)
    assert runtime.http is not None
    try:
        assert wait_for(lambda: get(runtime.http.port, "/healthz")[0] == 503)  # type: ignore[union-attr]
        assert "a tick has been running" in get(runtime.http.port, "/healthz")[1]
    finally:
        release.set()
    assert wait_for(lambda: get(runtime.http.port, "/healthz")[0] == 200)  # type: ignore[union-attr]


def test_only_the_leader_acts_and_stopping_it_hands_over(runtimes: list[Runtime]) -> None:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    store = InMemoryLeaseStore()
    a, _ = build(cluster, store, "a")
    a.start()
    runtimes.append(a)
    assert wait_for(lambda: a.elector is not None and a.elector.is_leader())
    b, _ = build(cluster, store, "b")
    b.start()
    runtimes.append(b)
    assert wait_for(lambda: cluster.deployments["ml/chat"][0] == 5)
    # b's first ticks and Lease read (a may have reached 5 before b started: a fixed 0.3 s was not always enough)
    assert wait_for(
        lambda: bool(b.telemetry.registry.get_sample_value("gpu_autoscaler_ticks_total", {"result": "standby"}))
    )
    assert b.http is not None
    assert wait_for(lambda: b.elector is not None and b.elector.holder == "a" and b.elector.last_attempt_ok)
    assert b.elector is not None and not b.elector.is_leader()
    assert b.telemetry.registry.get_sample_value("gpu_autoscaler_ticks_total", {"result": "standby"})
    assert not b.telemetry.registry.get_sample_value("gpu_autoscaler_ticks_total", {"result": "ok"})
    status, body = get(b.http.port, "/readyz")
    assert status == 200 and "standby follower (leader: a)" in body
    assert b.telemetry.registry.get_sample_value("gpu_autoscaler_leader", {"identity": "b"}) == 0

    a.stop()
    runtimes.remove(a)
    assert store.record is not None
    # released: b takes it at its next retry (0.05 s); an expiry would take the 5 s lease duration
    assert wait_for(lambda: b.elector is not None and b.elector.is_leader(), timeout=4)
    # the gauge is set by the on_started_leading callback, which runs just after is_leader() turns True
    assert wait_for(
        lambda: b.telemetry.registry.get_sample_value("gpu_autoscaler_leader", {"identity": "b"}) == 1, timeout=4
    )
    assert a.telemetry.registry.get_sample_value("gpu_autoscaler_leader", {"identity": "a"}) == 0
    # b acts now: a manual scale-down by someone is corrected upwards by b's ticks (scale-up is never delayed)
    cluster.deployments["ml/chat"] = [2, 2]
    assert wait_for(lambda: cluster.deployments["ml/chat"][0] > 2)
    assert b.telemetry.registry.get_sample_value("gpu_autoscaler_ticks_total", {"result": "ok"})


def test_stop_waits_for_the_running_tick_and_writes_nothing_after(runtimes: list[Runtime]) -> None:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    runtime, controller = build(cluster, None, "solo", tick=30)
    entered, release = threading.Event(), threading.Event()
    original = cluster.snapshot

    def slow(now: float):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(5)
        return original(now)

    cluster.snapshot = slow  # type: ignore[method-assign]
    runtime.start()
    assert entered.wait(30)
    stopper = threading.Thread(target=runtime.stop)
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # waiting for the tick (bounded by shutdown_grace_s)
    release.set()
    stopper.join(5)
    assert not stopper.is_alive()
    # the tick finished after stop() began: it decided a scale-up but did not apply it
    assert cluster.writes == []
    assert controller.last_report is not None
    assert [r.result for r in controller.last_report.results] == ["not_leader"]


def test_losing_the_lease_during_a_tick_neither_deadlocks_nor_writes() -> None:
    """The election thread's callbacks never wait for a running tick, which itself asks the elector before every
    write (the two threads would otherwise wait for each other)."""
    from dataclasses import replace
    from datetime import UTC, datetime

    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    store = InMemoryLeaseStore()
    runtime, controller = build(cluster, store, "a", tick=30)
    assert runtime.elector is not None
    assert runtime.elector.try_acquire_or_renew()
    entered, release = threading.Event(), threading.Event()
    original = cluster.snapshot

    def slow(now: float):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(60)  # released by the test: an election thread waiting for this tick would wait a minute
        return original(now)

    cluster.snapshot = slow  # type: ignore[method-assign]
    ticker = threading.Thread(target=runtime.tick)
    ticker.start()
    assert entered.wait(30)
    assert store.record is not None
    store.update(replace(store.record, holder="b", renew_time=datetime.now(UTC)))  # b won the lease meanwhile
    loser = threading.Thread(target=runtime.elector.try_acquire_or_renew)
    loser.start()
    loser.join(20)
    alive = loser.is_alive()
    release.set()
    assert not alive, "the election thread waited for the tick"
    ticker.join(30)
    assert not ticker.is_alive()
    assert cluster.writes == []
    assert controller.last_report is not None
    assert [r.result for r in controller.last_report.results] == ["not_leader"]
    assert runtime.telemetry.registry.get_sample_value("gpu_autoscaler_leader", {"identity": "a"}) == 0
    if runtime.http is not None:
        runtime.http.stop()


# ---- the jobs' timing: the monotonic clock ------------------------------------------------------------------------


class SteppedDatetime(datetime):
    """``datetime.now()`` of a wall clock stepped by ``STEP[0]`` seconds."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
        return datetime.now(tz) + timedelta(seconds=STEP[0])


STEP = [0.0]


def test_ticks_go_on_when_the_wall_clock_steps_back(runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall clock stepped back (an NTP correction, a VM restored from a snapshot) stopped every job for the size of
    the step (apscheduler's interval trigger compares their next run times with it): no tick, and /healthz failing.
    The runtime's clock watch moves the jobs back by the step."""
    STEP[0] = 0.0
    monkeypatch.setattr(apscheduler_base, "datetime", SteppedDatetime)  # the wall clock apscheduler compares with
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 70.0
    telemetry = Telemetry(identity="solo")
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    runtime = Runtime(
        controller, telemetry, tick_interval_s=0.1, tick_stall_s=1.0, http=None, clock=lambda: time.time() + STEP[0]
    )
    runtime.start()
    runtimes.append(runtime)
    assert wait_for(lambda: metrics.calls >= 3)
    STEP[0] = -120.0  # the wall clock steps back two minutes
    time.sleep(0.3)
    before, started = metrics.calls, time.monotonic()
    time.sleep(3.0)
    ticks, elapsed = metrics.calls - before, time.monotonic() - started
    # Neither stopped (without the clock watch: no tick for 120 s) nor doubled (twice elapsed / 0.1 s). The bounds
    # are on the ticks of the time that really passed (a sleep on a loaded machine overruns), and the lower one
    # leaves room for a few delayed ticks, which apscheduler coalesces.
    assert 5 <= ticks <= elapsed / 0.1 * 1.25 + 2, f"{ticks} ticks in {elapsed:.2f} s at a 0.1 s interval"
    assert runtime.healthz() == (True, "tick loop alive")


def test_a_step_back_moves_each_job_to_when_it_was_due_and_runs_none_twice() -> None:
    cluster = FakeCluster(deployments={"ml/chat": [1, 1]})
    runtime, _ = build(cluster, None, "solo", tick=15.0)
    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.start(paused=True)  # nothing runs: the run times are only looked at
    try:
        runtime.scheduler = scheduler
        now = datetime.now(UTC)
        # the wall clock has just stepped back 120 s: every next run time is 120 s further away than it was
        scheduler.add_job(print, "interval", seconds=15, id="tick", next_run_time=now + timedelta(seconds=125))
        scheduler.add_job(print, "interval", seconds=900, id="refit", next_run_time=now + timedelta(seconds=1000))
        scheduler.add_job(print, "interval", seconds=300, id="late", next_run_time=now + timedelta(seconds=30))
        scheduler.add_job(print, "interval", seconds=15, id="due", next_run_time=now + timedelta(seconds=0.5))
        runtime._clock_stepped_back(120.0)

        def due_in(job: str) -> float:
            return (scheduler.get_job(job).next_run_time - now).total_seconds()

        assert due_in("tick") == pytest.approx(5, abs=0.5)  # when it was due: 5 s away, as before the step
        assert due_in("refit") == pytest.approx(880, abs=0.5)
        assert 0 <= due_in("late") < 1  # due 90 s ago by the monotonic clock: once, now (coalesced)
        assert due_in("due") == pytest.approx(0.5, abs=0.01)  # about to run (maybe running): left alone
    finally:
        scheduler.shutdown(wait=False)
