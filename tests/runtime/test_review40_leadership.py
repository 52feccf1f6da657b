"""Review 40 of leader election (``adapters/kubernetes_lease``) and the process runtime (``runtime``), compared with
client-go's ``tools/leaderelection``.

Defects found (each has a test below that was a strict xfail on the code as it was):

1. WRONG: a Lease deleted while another replica holds it (``kubectl delete lease``, a namespace re-applied with
   pruning) is created at once by the first follower that finds it gone: the follower leads and acts at once, while
   the holder, which renewed a moment ago, keeps acting until its next retry finds the new holder (up to a retry
   period plus a request: both replicas scale and evict meanwhile). client-go behaves the same, but the module's own
   safety argument is that a follower takes over only after it saw the record unchanged for a lease duration.
   RIGHT: a missing Lease is the last record the follower saw, gone silent: it creates the Lease only once that
   record, held by another replica, has been unchanged for its lease duration on the follower's own clock (at once
   when it never saw one, or saw it released or held by itself). The holder recreates it at its next renewal.
2. WRONG: ``on_error`` is called unguarded inside ``try_acquire_or_renew``: a callback that raises (a broken metrics
   registry) escapes the attempt and ends the election thread for good. A follower then never takes over and stays
   Ready on its last good read; a leader stops acting at its renew deadline and never renews again. The module
   already says "a broken callback must not kill the election loop" for the other two callbacks.
   RIGHT: a failing ``on_error`` is logged and the attempt answers as it would have; the background loop also
   outlives anything an attempt raises.
3. WRONG: ``Runtime._refit_rounds`` runs the refit rounds through ``RunAgain.run``; a round that raises ends the
   loop, and the round queued behind it (a new term's first refit, asked for while the previous term's ran) is
   dropped: the new term waits a whole refit interval for its forecasts.
   RIGHT: a round that raises is logged and counted, and the queued round still runs.
4. WRONG: ``LeaderElector._fire`` delivers the leadership callbacks from whichever thread asks, with no order
   between threads: a tick whose ``is_leader()`` saw the renew deadline pass runs ``on_stopped_leading`` while the
   election thread, which renewed the Lease (still ours) a moment later, runs ``on_started_leading``; the slower one
   wins, and "stopped" after "started" leaves the Runtime with the leader gauge at 0 while it leads (the "no leader"
   alert fires, the alerts gated on ``gpu_autoscaler_leader == 1`` go silent) until the next transition.
   RIGHT: callbacks run one at a time, in the order of the transitions.

Also pinned (checked in this review, pinned nowhere else outside tests/realkube): client-go's acquireTime /
renewTime / leaderTransitions semantics, the release record (holder emptied, one-second duration, transitions kept),
expiry judged on the observer's clock whatever the holder's wall clock says, and /healthz failing on a tick stalled
beyond its bound while recovering once it ends. Hand-driven clocks; every wait has a deadline.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from runtime_fakes import wait_for
from test_review38_runtime import FakeElector, build

from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector
from autoscaler.ports import PortError


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


TIMINGS = ElectionTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)


def elector(
    store: InMemoryLeaseStore,
    name: str,
    clock: Clock,
    events: list[str] | None = None,
    wall_offset_s: float = 0.0,
) -> LeaderElector:
    log = events if events is not None else []
    return LeaderElector(
        store,
        name,
        TIMINGS,
        monotonic=clock,
        wall_clock=lambda: datetime.fromtimestamp(clock.t + wall_offset_s, UTC),
        on_started_leading=lambda: log.append(f"{name}+"),
        on_stopped_leading=lambda: log.append(f"{name}-"),
    )


def delete_lease(store: InMemoryLeaseStore) -> None:
    with store._lock:
        store._record = None


# ---- defects --------------------------------------------------------------------------------------------------------


def test_a_follower_does_not_create_a_lease_deleted_under_a_live_holder() -> None:
    """Fixed (was a strict xfail). Defect 1: both replicas acted after the Lease was deleted; now the follower
    waits and the holder recreates the Lease at its next renewal."""
    store, clock, events = InMemoryLeaseStore(), Clock(), []
    a, b = elector(store, "a", clock, events), elector(store, "b", clock, events)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b saw a's record
    clock.t += 1
    delete_lease(store)
    clock.t += 0.5
    assert not b.try_acquire_or_renew(), "b took a deleted Lease whose holder renewed 1.5 s ago"
    assert a.may_write() and not b.may_write()
    clock.t += 0.5
    assert a.try_acquire_or_renew()  # the holder's next renewal recreates it
    assert store.record is not None and store.record.holder == "a"
    for _ in range(10):
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert events == ["a+"]


def test_a_follower_creates_a_deleted_lease_once_its_last_holder_went_silent() -> None:
    """Fixed (was a strict xfail). The other side of defect 1: a holder that died with its Lease deleted is
    replaced after one lease duration of silence, counted from when the follower last saw the record change (the
    code as it was created the Lease at once)."""
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b sees a's record at t=1000
    delete_lease(store)  # and a is gone as well
    clock.t += 14
    assert not b.try_acquire_or_renew()
    clock.t += 1.5
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b"
    assert not a.is_leader()  # a's renew deadline passed long ago


def test_a_follower_creates_a_lease_it_never_saw_at_once() -> None:
    """Defect 1's fix waits only on a live holder's record it saw: on a first start the Lease is created at once."""
    store, clock = InMemoryLeaseStore(), Clock()
    assert elector(store, "a", clock).try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "a"


def test_a_raising_on_error_neither_escapes_the_attempt_nor_ends_the_election_loop() -> None:
    """Fixed (was a strict xfail). Defect 2: a broken ``on_error`` callback ended the election thread."""
    store, clock = InMemoryLeaseStore(), Clock()
    errors: list[Exception] = []

    def broken(exc: Exception) -> None:
        errors.append(exc)
        raise RuntimeError("metrics registry broken")

    leader = LeaderElector(store, "a", TIMINGS, monotonic=clock, on_error=broken)
    assert leader.try_acquire_or_renew()
    store.fail = PortError("API server unreachable")
    clock.t += 2
    assert leader.try_acquire_or_renew() is True  # still within its renew deadline
    clock.t += 9
    assert leader.try_acquire_or_renew() is False
    assert len(errors) == 2

    # the background loop keeps trying, and takes the Lease once the API answers again
    looping = LeaderElector(InMemoryLeaseStore(), "b", ElectionTimings(5, 3, 0.02), on_error=broken)
    looping._store.fail = PortError("API server unreachable")  # type: ignore[attr-defined]
    looping.start()
    try:
        assert wait_for(lambda: len(errors) >= 4, timeout=5)
        looping._store.fail = None  # type: ignore[attr-defined]
        assert wait_for(looping.is_leader, timeout=5), "the election loop died with the callback"
    finally:
        looping.stop()


def test_leadership_callbacks_run_in_the_order_of_the_transitions() -> None:
    """Fixed (was a strict xfail). Defect 4: "stopped" delivered after "started" by two threads left a renewed
    leader believing it had stopped."""
    store, clock, events = InMemoryLeaseStore(), Clock(), []
    in_stopped, finish_stopped = threading.Event(), threading.Event()

    def stopped() -> None:
        in_stopped.set()
        finish_stopped.wait(5)  # a slow callback (closing the extender's connections)
        events.append("-")

    leader = LeaderElector(
        store,
        "a",
        TIMINGS,
        monotonic=clock,
        wall_clock=lambda: datetime.fromtimestamp(clock.t, UTC),
        on_started_leading=lambda: events.append("+"),
        on_stopped_leading=stopped,
    )
    assert leader.try_acquire_or_renew()
    events.clear()
    clock.t += 10  # the renew deadline passes: a tick's is_leader() sees it and delivers "stopped"
    tick = threading.Thread(target=leader.is_leader, daemon=True)
    tick.start()
    assert in_stopped.wait(5)
    renewal = threading.Thread(target=leader.try_acquire_or_renew, daemon=True)  # the Lease is still ours
    renewal.start()
    renewal.join(0.3)
    finish_stopped.set()
    tick.join(5)
    renewal.join(5)
    assert leader.is_leader()
    assert events == ["-", "+"], "the last callback delivered must match the leadership"


def test_a_refit_round_that_raises_still_runs_the_round_queued_behind_it() -> None:
    """Fixed (was a strict xfail). Defect 3: the new term's refit was dropped when the running round raised."""
    entered, release = threading.Event(), threading.Event()
    calls: list[float] = []

    def refit(now: float) -> None:
        calls.append(now)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
            raise RuntimeError("previous term's refit failed")

    built = build(elector=FakeElector(leader=True), refit=refit)
    runner = threading.Thread(target=lambda: built.runtime._refit_rounds(time.time()), daemon=True)
    runner.start()
    assert entered.wait(5)
    assert built.runtime._refit_queue.ask()  # a new term's refit, queued behind the running round
    release.set()
    runner.join(5)
    assert not runner.is_alive()
    assert len(calls) == 2, "the queued round was dropped"
    assert built.sample("gpu_autoscaler_errors_total", {"component": "refit"}) == 1.0


# ---- behaviour pinned -----------------------------------------------------------------------------------------------


def test_acquire_time_renew_time_and_transitions_follow_client_go() -> None:
    """Renewals keep acquireTime and leaderTransitions and move renewTime; a takeover sets a new acquireTime and
    adds one transition; a release empties the holder, sets a one-second duration and keeps the transitions; taking a
    released Lease is a transition too."""
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    first = store.record
    assert first is not None and first.transitions == 0 and first.acquire_time == first.renew_time
    clock.t += 2
    a.try_acquire_or_renew()
    renewed = store.record
    assert renewed is not None
    assert renewed.acquire_time == first.acquire_time and renewed.transitions == 0
    assert renewed.renew_time == first.renew_time + timedelta(seconds=2)  # type: ignore[operator]

    b.try_acquire_or_renew()
    clock.t += 16  # a went silent
    assert b.try_acquire_or_renew()
    taken = store.record
    assert taken is not None and taken.holder == "b" and taken.transitions == 1
    assert taken.acquire_time == datetime.fromtimestamp(clock.t, UTC)

    b.release()
    released = store.record
    assert released is not None and released.holder == "" and released.lease_duration_s == 1.0
    assert released.transitions == 1
    assert a.try_acquire_or_renew()  # at once: a released Lease is free
    assert store.record is not None and store.record.transitions == 2


def test_expiry_is_judged_on_the_observers_clock_not_the_holders_timestamps() -> None:
    """A holder whose wall clock is an hour behind writes renewTimes an hour old: a follower that compared them with
    its own wall clock would take over at once. Only a record that stops changing for a lease duration on the
    follower's monotonic clock expires; and a holder an hour ahead does not delay a takeover."""
    store, clock = InMemoryLeaseStore(), Clock()
    behind, follower = elector(store, "behind", clock, wall_offset_s=-3600), elector(store, "f", clock)
    behind.try_acquire_or_renew()
    for _ in range(20):
        clock.t += 2
        assert behind.try_acquire_or_renew()
        assert not follower.try_acquire_or_renew()

    store2 = InMemoryLeaseStore()
    ahead, follower2 = elector(store2, "ahead", clock, wall_offset_s=3600), elector(store2, "f", clock)
    ahead.try_acquire_or_renew()
    follower2.try_acquire_or_renew()
    clock.t += 15.5  # ahead went silent
    assert follower2.try_acquire_or_renew()


def test_healthz_fails_while_a_tick_stalls_beyond_its_bound_and_recovers_when_it_ends() -> None:
    """A tick that hangs past ``tick_stall_s`` fails /healthz (the kubelet restarts the container); once the tick
    ends, the next probe passes again."""
    entered, release = threading.Event(), threading.Event()
    built = build(elector=FakeElector(leader=True), tick_stall_s=0.3)
    original = built.controller.run_once

    def hung_run_once(now: float):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        return original(now)

    built.controller.run_once = hung_run_once  # type: ignore[method-assign]
    runner = threading.Thread(target=built.runtime.tick, daemon=True)
    runner.start()
    try:
        assert entered.wait(5)
        assert built.runtime.healthz()[0]
        assert wait_for(lambda: not built.runtime.healthz()[0], timeout=5)
        _, why = built.runtime.healthz()
        assert "a tick has been running for" in why
    finally:
        release.set()
        runner.join(5)
    assert built.runtime.healthz() == (True, "tick loop alive")
