"""Runtime review 38: the job scheduler, leadership transitions, the probes, ``run --once`` and the metric labels.

Strict xfails are defects found in this review (docstrings: WRONG / RIGHT); the three saying "Fixed" were fixed in the
same stop (run --once's own Lease identity, its exit code on a metrics-only hold, a new term's refit queued behind a
running one), the other three at stop 39 (/readyz no longer waits for a Lease request, the takeover's tick queued behind
a running standby tick, the reads' retry deadline within the tick's stall bound). The other tests pin behaviour checked
in the review that no other test covers. Every wait is an Event or a poll with a deadline; the whole file runs in a few
seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object, wait_for

from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector, LeaseRecord
from autoscaler.commands.run import EXIT_NOT_LEADER, EXIT_OK, run_once
from autoscaler.controller import Controller
from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import ServicePolicy
from autoscaler.ports import PortError
from autoscaler.runtime import Runtime
from autoscaler.telemetry import Telemetry

FAST = ElectionTimings(lease_duration_s=5.0, renew_deadline_s=3.0, retry_period_s=0.05)
POD = "gpu-autoscaler-7d9f8c6b5-abcde"  # leader_election.identity defaults to POD_NAME


class Built:
    def __init__(self, runtime: Runtime, controller: Controller, cluster: FakeCluster, metrics: FakeMetrics,
                 policies: FakePolicies, telemetry: Telemetry) -> None:
        self.runtime = runtime
        self.controller = controller
        self.cluster = cluster
        self.metrics = metrics
        self.policies = policies
        self.telemetry = telemetry

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.telemetry.registry.get_sample_value(name, labels or {})


def build(
    *,
    cluster: FakeCluster | None = None,
    identity: str | None = None,
    store: InMemoryLeaseStore | None = None,
    elector: object | None = None,
    **runtime_kw: object,
) -> Built:
    """A controller over the in-memory fakes (one service, utilisation 140 %: it wants to scale up) in a Runtime;
    with ``store``, a real ``LeaderElector`` named ``identity`` wired as ``autoscaler.app.build_runtime`` wires it."""
    cluster = cluster if cluster is not None else FakeCluster(deployments={"ml/chat": [1, 1]})
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 140.0
    telemetry = Telemetry(identity=identity or "solo")
    policies = FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))])
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=policies,
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    ref: list[Runtime] = []
    if store is not None:
        elector = LeaderElector(
            store,
            identity or "solo",
            FAST,
            on_started_leading=lambda: ref[0].on_started_leading(),
            on_stopped_leading=lambda: ref[0].on_stopped_leading(),
        )
    kw: dict[str, object] = {"http": None, "tick_interval_s": 3600.0, "refit_interval_s": 3600.0,
                             "rebalance_interval_s": 3600.0, "shutdown_grace_s": 2.0}
    kw.update(runtime_kw)
    runtime = Runtime(controller, telemetry, elector=elector, **kw)  # type: ignore[arg-type]
    ref.append(runtime)
    return Built(runtime, controller, cluster, metrics, policies, telemetry)


class FakeElector:
    """What the Runtime asks of a ``LeaderElector``, switched by the test."""

    def __init__(self, leader: bool) -> None:
        self.leader = leader
        self.holder = "other"
        self.last_attempt_ok = True
        self.last_error: Exception | None = None

    def is_leader(self) -> bool:
        return self.leader

    def may_write(self) -> bool:
        return self.leader

    def start(self) -> None:
        pass

    def stop(self, release: bool = True) -> None:
        pass


class BlockingLeaseStore(InMemoryLeaseStore):
    """A Lease whose reads hang while ``block`` is set (an API server that accepts the connection and does not
    answer), until the test opens ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.block = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def get(self) -> LeaseRecord | None:
        if self.block:
            self.entered.set()
            self.gate.wait(20)
        return super().get()


def returns_within(fn: Callable[[], object], seconds: float) -> tuple[bool, object]:
    """Run ``fn`` in a daemon thread: (whether it returned within ``seconds``, what it returned)."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), out[0] if out else None)


# ---- defects --------------------------------------------------------------------------------------------------------


def test_run_once_with_the_running_leaders_identity_neither_acts_nor_releases_its_lease() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``run_once`` asks ``LeaderElector.try_acquire_or_renew``, which takes a Lease held under its own identity
    at once (meant for a restarted container of the same pod). ``leader_election.identity`` defaults to POD_NAME, so
    ``kubectl exec <leader pod> -- autoscaler run --once`` counts the running leader's Lease as its own: it scales
    beside the running leader (two writers), then ``release()`` empties the holder, so a standby may take over while the
    running leader still acts until its next renewal.
    RIGHT: a one-shot process never held the Lease before it started: an unexpired Lease under its identity is another
    process's (exit 3, nothing written, the Lease untouched), or ``--once`` elects under an identity of its own."""
    store = InMemoryLeaseStore()
    running = LeaderElector(store, POD, FAST)
    assert running.try_acquire_or_renew()
    once = build(identity=POD, store=store)
    code = run_once(once.runtime)
    record = store.record
    assert record is not None and record.holder == POD, "the running leader's Lease was released by run --once"
    assert once.cluster.writes == [], "run --once wrote beside the running leader"
    assert code == EXIT_NOT_LEADER


def test_run_once_exits_0_when_the_tick_read_the_policies_and_the_cluster_but_not_the_metrics() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``commands.run.run_once`` returns 0 only for ``report.result == "ok"``; a tick held with ``held_by ==
    "metrics_read"`` (the metrics source raised) exits 1, while ``/readyz`` calls the same tick Ready
    (``read_the_policies``) and the README says exit 1 means "the --once tick could not read the policies or the
    cluster" (a Prometheus outage: exit 0, services held).
    RIGHT: exit 0 when ``read_the_policies(report)`` (the tick read both and held on its metrics only), 1 otherwise."""
    built = build()
    built.metrics.fail = PortError("cannot reach Prometheus at http://prometheus.invalid:9090")
    code = run_once(built.runtime)
    report = built.controller.last_report
    assert report is not None and report.result == "hold" and report.held_by == "metrics_read"
    assert built.runtime.readyz()[0]  # Ready: the controller rides the outage out as designed
    assert code == EXIT_OK


def test_readyz_answers_while_the_election_thread_waits_for_the_api() -> None:
    """Fixed (was a strict xfail): the elector's state lock is no longer held across a Lease request.

    WRONG: ``Runtime.readyz`` calls ``elector.is_leader()``, which takes ``LeaderElector._lock``; ``_attempt`` holds
    that lock for its whole GET/PUT of the Lease (up to the request timeout each, twice with the client's connect
    retry: 5 s x 2 with the defaults, beside the probe's timeoutSeconds of 3). A slow API server (or one that does not
    answer) turns /readyz into a probe timeout rather than an answer naming the cause, on the leader as on the standby.
    RIGHT: the probe answers from state in memory (e.g. the leadership flag and renewal time read without waiting for
    a request in flight, or the lock not held across the store's I/O)."""
    store = BlockingLeaseStore()
    other = LeaderElector(store, "other", FAST)
    assert other.try_acquire_or_renew()
    built = build(identity="me", store=store)
    elector = built.runtime.elector
    assert elector is not None
    assert not elector.try_acquire_or_renew()
    assert built.runtime.readyz() == (True, "standby follower (leader: other)")
    store.block = True
    attempt = threading.Thread(target=elector.try_acquire_or_renew, daemon=True)
    attempt.start()
    try:
        assert store.entered.wait(5)
        answered, _ = returns_within(built.runtime.readyz, 1.0)
        assert answered, "/readyz is still waiting for the Lease request"
    finally:
        store.gate.set()
        attempt.join(10)


def test_a_new_leader_ticks_at_once_even_when_its_standby_tick_is_still_reading() -> None:
    """Fixed (was a strict xfail): the running tick runs the takeover's tick as soon as it ends.

    WRONG: ``on_started_leading`` brings the tick job forward with ``modify_job(next_run_time=now)``; when the
    standby's tick is still running (its scheduler-extender snapshot read: seconds on a large cluster), apscheduler
    skips that run ("maximum number of running instances reached") and schedules the next interval, so the service
    stays unattended (and the new leader NotReady: "no successful tick yet") for up to a tick interval after a
    handover. The leader label got its own job for this very race; the tick did not.
    RIGHT: the takeover tick runs as soon as the running standby tick ends (e.g. the standby tick, or the end of
    ``tick()``, notices the leadership change and runs the leader tick, or a one-off job is queued after it)."""
    started = threading.Event()
    release = threading.Event()

    class HeldSnapshots:
        def snapshot(self, now: float) -> ClusterSnapshot | None:
            started.set()
            release.wait(10)
            return None

    elector = FakeElector(leader=False)
    built = build(elector=elector, tick_interval_s=30.0, extender_snapshots=HeldSnapshots())
    built.runtime.start()
    try:
        assert started.wait(10)  # the first (standby) tick reads for the extender
        elector.leader = True
        built.runtime.on_started_leading()
        time.sleep(0.3)  # the scheduler wakes for the tick brought forward while the standby tick still runs
        release.set()
        assert wait_for(lambda: built.controller.last_report is not None, timeout=4.0), "no leader tick yet"
    finally:
        release.set()
        built.runtime.stop()


def test_a_new_terms_refit_runs_once_the_previous_terms_refit_ends() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``Runtime._leader_tick`` brings the refit forward once per term (``_refit_after_tick``) with
    ``modify_job(next_run_time=now)``. A renewal blip (the renew deadline passes during a short API outage, then the
    Lease, still ours, is renewed) starts a new term while the refit of the previous one is still fitting; apscheduler
    skips the brought-forward run (max_instances=1) and the flag is already cleared, so the term's first refit waits
    for the next interval. ``ForecastService`` counts only a refit begun within the term (``start_term``): until then
    every forecasting service without a usable forecast holds at its spec's target.
    RIGHT: the term's refit runs as soon as the running one ends (keep the flag until a refit of the term started, or
    queue a one-off run behind the running one)."""
    first_entered = threading.Event()
    release = threading.Event()
    calls: list[float] = []

    def refit(now: float) -> None:
        calls.append(now)
        if len(calls) == 1:
            first_entered.set()
            release.wait(10)  # the previous term's refit, still fitting

    elector = FakeElector(leader=True)
    built = build(elector=elector, tick_interval_s=30.0, refit_interval_s=30.0, refit=refit)
    built.runtime.start()
    try:
        assert first_entered.wait(10)  # brought forward by the first tick
        before = built.controller.last_report
        built.runtime.on_stopped_leading()  # a renewal blip: the renew deadline passed...
        built.runtime.on_started_leading()  # ...and the Lease, still ours, was renewed: a new term
        # the new term's tick (brought forward) has run, and brought the refit forward while the first one runs
        assert wait_for(lambda: built.controller.last_report is not before and built.runtime.jobs_running() == 1, 10)
        time.sleep(0.3)
        release.set()
        assert wait_for(lambda: len(calls) >= 2, timeout=4.0), "the new term's refit did not run"
    finally:
        release.set()
        built.runtime.stop()


def test_the_tick_stall_bound_covers_a_tick_whose_reads_succeed_on_their_last_try() -> None:
    """Fixed (was a strict xfail): a tick's Kubernetes reads stop retrying once its retry window is spent.

    WRONG: ``app.tick_stall_seconds`` is max(tick_stall_seconds, the policy read through all its tries + a tick
    interval): 79 s with the defaults, so 120 s stands. It models a tick that *holds* after its first read; a tick
    whose policy list succeeds on its third try goes on to the cluster read, whose lists retry as much
    (KubeClusterReader: read_retries=2, each try up to twice the request timeout). The policy list and the first list
    of the snapshot each answering on their last try run 64 + 60.6 s > 120 s, so an API server that drops two
    requests in three makes /healthz fail and the livenessProbe restart the controller through it.
    RIGHT (done): the reads stop retrying once the tick's own budget is spent: ``read_retry_window_seconds`` into
    the tick no read starts a retry (the tick holds on that read), and the window plus what may follow it (the last
    try, one Prometheus query through its retries, a tick interval) fits the stall bound, whatever the settings."""
    from autoscaler.app import read_retry_window_seconds, tick_stall_seconds
    from autoscaler.settings import Settings

    long_lease = {"lease_duration_seconds": 120, "renew_deadline_seconds": 90}
    cases: list[tuple[float, float, int, float, dict[str, object]]] = [
        (10, 10, 2, 15, {}),  # the defaults
        (1, 5, 0, 5, {}),
        (5, 10, 2, 60, {"tick_stall_seconds": 200}),
        (60, 30, 3, 60, {"tick_stall_seconds": 300, "leader_election": long_lease}),
    ]
    for timeout, prom_timeout, prom_retries, interval, more in cases:
        settings = Settings(
            tick_interval_seconds=interval,
            kubernetes={"request_timeout_seconds": timeout},
            prometheus={"timeout_seconds": prom_timeout, "retries": prom_retries},
            **more,
        )
        window = read_retry_window_seconds(settings)
        after = 2 * timeout + prom_timeout * (1 + 2 * prom_retries) + interval
        assert window > 0, settings
        assert window + after <= tick_stall_seconds(settings), settings


def test_reads_stop_retrying_at_the_ticks_retry_deadline() -> None:
    """Within ``read_retry_deadline`` a failing read is retried only while the retry's backoff ends by the deadline;
    outside it, as many times as configured. Each try here takes 20 s of a fake clock (a request timing out)."""
    from autoscaler.adapters.kubernetes._api import KubeUnavailable, read_retry_deadline, with_read_retries

    clock = [0.0]
    tries: list[float] = []

    def flaky() -> str:
        tries.append(clock[0])
        clock[0] += 20.0
        if len(tries) % 3:
            raise KubeUnavailable("list pods: timed out")
        return "answer"

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    def read() -> str:
        return with_read_retries("list pods", flaky, retries=2, backoff_s=0.2, max_backoff_s=2.0, sleep=sleep)

    assert read() == "answer" and len(tries) == 3  # no deadline: the third try answers
    tries.clear()
    clock[0] = 0.0
    with read_retry_deadline(25.0, clock=lambda: clock[0]), pytest.raises(KubeUnavailable):
        read()  # the first try ends at 20 s, its retry (0.2 s later) starts before 25 s, ends at 40.2 s: no more
    assert tries == [0.0, 20.2]
    tries.clear()
    clock[0] = 0.0
    with read_retry_deadline(100.0, clock=lambda: clock[0]):
        assert read() == "answer"  # time enough: every try
    assert len(tries) == 3


def test_the_runtime_runs_each_tick_inside_its_tick_scope() -> None:
    """``Runtime(tick_scope=...)`` is entered around the leader's tick and the standby's read (``app`` passes the
    reads' retry deadline): the controller's reads run inside it."""
    entered: list[str] = []
    inside = threading.local()

    class Scope:
        def __enter__(self) -> None:
            inside.on = True
            entered.append("enter")

        def __exit__(self, *exc: object) -> None:
            inside.on = False
            entered.append("exit")

    built = build(tick_scope=Scope)
    seen: list[bool] = []
    snapshot = built.cluster.snapshot

    def snapshot_in_scope(now: float) -> ClusterSnapshot:
        seen.append(getattr(inside, "on", False))
        return snapshot(now)

    built.cluster.snapshot = snapshot_in_scope  # type: ignore[method-assign]
    built.runtime.tick()
    assert seen and all(seen)
    assert entered == ["enter", "exit"]


# ---- behaviour checked and pinned -----------------------------------------------------------------------------------


def test_healthz_answers_while_the_election_thread_waits_for_the_api() -> None:
    """The liveness probe never waits for the Kubernetes API: it reads no Lease and takes no elector lock."""
    store = BlockingLeaseStore()
    built = build(identity="me", store=store)
    elector = built.runtime.elector
    assert elector is not None
    store.block = True
    attempt = threading.Thread(target=elector.try_acquire_or_renew, daemon=True)
    attempt.start()
    try:
        assert store.entered.wait(5)
        answered, result = returns_within(built.runtime.healthz, 1.0)
        assert answered and result == (True, "tick loop alive")
    finally:
        store.gate.set()
        attempt.join(10)


def test_healthz_stays_ok_through_failed_policy_cluster_and_metrics_reads() -> None:
    """A Prometheus or Kubernetes API outage never fails /healthz (it would crash-loop the controller through the
    outage it is meant to hold through); /readyz says which read failed."""
    built = build()
    runtime = built.runtime
    built.policies.fail = PortError("list gpuscalingpolicies: HTTP 503")
    runtime.tick()
    assert runtime.healthz() == (True, "tick loop alive")
    assert not runtime.readyz()[0]
    built.policies.fail = None
    built.cluster.fail_reads = PortError("list pods: connection refused")
    runtime.tick()
    assert runtime.healthz() == (True, "tick loop alive")
    assert not runtime.readyz()[0]
    built.cluster.fail_reads = None
    built.metrics.fail = PortError("cannot reach Prometheus")
    runtime.tick()
    assert runtime.healthz() == (True, "tick loop alive")
    assert runtime.readyz()[0]
    assert built.cluster.writes == []  # held: nothing written on a failed read


def test_a_refit_and_a_rebalance_that_raise_run_again_at_their_next_interval() -> None:
    """A job's exception is logged and counted, and the job runs again: it never stops for good."""
    calls = {"refit": 0, "rebalance": 0}

    def flaky(name: str) -> Callable[[float], None]:
        def job(now: float) -> None:
            calls[name] += 1
            if calls[name] == 1:
                raise RuntimeError(f"{name} boom")

        return job

    built = build(refit=flaky("refit"), rebalance=flaky("rebalance"), refit_interval_s=0.2, rebalance_interval_s=0.2)
    built.runtime.start()
    try:
        assert wait_for(lambda: calls["refit"] >= 3 and calls["rebalance"] >= 3, timeout=15)
    finally:
        built.runtime.stop()
    assert built.sample("gpu_autoscaler_errors_total", {"component": "refit"}) == 1.0
    assert built.sample("gpu_autoscaler_errors_total", {"component": "rebalance"}) == 1.0
    assert built.runtime.scheduler is not None and not built.runtime.scheduler.running


def test_a_tick_that_raises_does_not_stop_the_tick_job() -> None:
    """The last line of defence in ``Runtime.tick``: an exception out of the controller is counted as a decide error,
    the heartbeat moves on, and the next tick runs and acts."""
    built = build(tick_interval_s=0.2)
    original = built.controller.run_once
    raised: list[float] = []

    def run_once_raising_once(now: float):  # type: ignore[no-untyped-def]
        if not raised:
            raised.append(now)
            raise RuntimeError("tick boom")
        return original(now)

    built.controller.run_once = run_once_raising_once  # type: ignore[method-assign]
    built.runtime.start()
    try:
        assert wait_for(lambda: built.cluster.writes != [], timeout=15)
        assert built.runtime.healthz()[0]
    finally:
        built.runtime.stop()
    assert raised
    assert built.sample("gpu_autoscaler_errors_total", {"component": "decide"}) == 1.0


def test_ticks_never_overlap_a_slow_tick_nor_a_tick_called_beside_the_scheduler() -> None:
    """max_instances=1 and coalescing: a tick slower than the interval delays the next one; ``tick()`` called beside the
    scheduler's job waits for it (one stall timer)."""
    lock = threading.Lock()
    state = {"running": 0, "max": 0, "ticks": 0}

    class SlowCluster(FakeCluster):
        def snapshot(self, now: float) -> ClusterSnapshot:
            with lock:
                state["running"] += 1
                state["max"] = max(state["max"], state["running"])
                state["ticks"] += 1
            time.sleep(0.25)
            with lock:
                state["running"] -= 1
            return super().snapshot(now)

    built = build(cluster=SlowCluster(deployments={"ml/chat": [1, 1]}), tick_interval_s=0.05)
    built.runtime.start()
    try:
        assert wait_for(lambda: state["ticks"] >= 1, timeout=10)
        beside = threading.Thread(target=built.runtime.tick, daemon=True)
        beside.start()
        assert wait_for(lambda: state["ticks"] >= 4, timeout=15)
        beside.join(10)
    finally:
        built.runtime.stop()
    assert state["max"] == 1


def test_service_gauges_drop_a_deleted_policy_and_labels_carry_no_free_text() -> None:
    """The per-service gauges render the latest tick only (a deleted policy's service disappears, nothing stale), and
    a stale reason or a read error's free text (pod names, URLs) never becomes a label value."""
    built = build()
    free_text = "pod ml/chat-7d9f8c6b5-xk2p9 has no DCGM sample at http://prometheus.invalid:9090"
    built.metrics.stale["ml/chat"] = (free_text,)
    built.runtime.tick()
    body = built.telemetry.render().decode()
    assert 'gpu_autoscaler_stale_services{namespace="ml",reason=' in body
    assert "xk2p9" not in body and "prometheus.invalid" not in body
    built.metrics.stale.clear()
    built.metrics.fail = PortError("GET http://prometheus.invalid:9090/api/v1/query: pod chat-7d9f8c6b5-xk2p9")
    built.runtime.tick()
    body = built.telemetry.render().decode()
    assert "xk2p9" not in body and "prometheus.invalid" not in body
    built.metrics.fail = None
    built.policies.objects = []
    built.runtime.tick()
    body = built.telemetry.render().decode()
    assert 'service="chat"' not in body


def test_run_once_that_takes_the_lease_acts_and_releases_it() -> None:
    """``run --once`` acts only with the Lease, and gives it back at once (holder "") so that the Deployment's
    replicas need not wait a lease duration."""
    store = InMemoryLeaseStore()
    built = build(identity="once-job", store=store)
    assert run_once(built.runtime) == EXIT_OK
    assert [w.args for w in built.cluster.writes] == [("ml", "chat", 2)]
    record = store.record
    assert record is not None and record.holder == ""
    other = LeaderElector(store, "replica-b", FAST)
    assert other.try_acquire_or_renew()


def test_stop_releases_the_lease_and_says_shutting_down_and_not_leader() -> None:
    """SIGTERM's stop(): the Lease released after the tick (holder ""), the leader gauge 0, /readyz "shutting down"
    and /healthz still alive (a probe during shutdown must not restart the container)."""
    store = InMemoryLeaseStore()
    built = build(identity="me", store=store, tick_interval_s=0.1)
    built.runtime.start()
    try:
        assert wait_for(lambda: built.controller.last_report is not None, timeout=15)
    finally:
        built.runtime.stop()
    record = store.record
    assert record is not None and record.holder == ""
    assert built.sample("gpu_autoscaler_leader", {"identity": "me"}) == 0.0
    assert built.runtime.readyz() == (False, "shutting down")
    assert built.runtime.healthz()[0]
