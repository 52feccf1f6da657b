"""LeaderElector on an in-memory Lease with a hand-driven monotonic clock: one leader, takeover only after expiry,
immediate stop on a lost race, renew deadline on an unreachable API, fast handover on release."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from autoscaler.adapters.kubernetes_lease import (
    ElectionTimings,
    InMemoryLeaseStore,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
)
from autoscaler.ports import PortError


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(store: InMemoryLeaseStore, name: str, clock: Clock, events: list[str] | None = None) -> LeaderElector:
    log = events if events is not None else []
    return LeaderElector(
        store,
        name,
        ElectionTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2),
        monotonic=clock,
        wall_clock=lambda: datetime.fromtimestamp(clock.t, UTC),
        on_started_leading=lambda: log.append(f"{name}+"),
        on_stopped_leading=lambda: log.append(f"{name}-"),
    )


def test_first_comer_leads_the_other_stands_by() -> None:
    store, clock, events = InMemoryLeaseStore(), Clock(), []
    a, b = elector(store, "a", clock, events), elector(store, "b", clock, events)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(20):  # a renews every 2 s: b never takes over
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    assert events == ["a+"]
    assert store.record is not None and store.record.holder == "a" and store.record.transitions == 0


def test_follower_takes_over_only_after_a_full_lease_duration_of_silence() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b sees a's record at t=1000
    clock.t += 14
    assert not b.try_acquire_or_renew()
    clock.t += 1.5  # 15.5 s without a change of the record
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1
    # a has not renewed for 15.5 s > renew deadline: it stopped acting already, before b could take over
    assert not a.is_leader()
    assert not a.try_acquire_or_renew()


def test_old_leader_stops_acting_before_a_follower_can_take_over() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    store.fail = PortError("API server unreachable from a")
    for _ in range(7):  # a keeps failing to renew; b cannot reach the API either
        clock.t += 2
        a.try_acquire_or_renew()
        if clock.t - 1000 >= 10:
            assert not a.is_leader(), f"still acting {clock.t - 1000}s after the last renewal"
        else:
            assert a.is_leader()
    store.fail = None
    assert not a.is_leader()
    clock.t = 1000 + 15.1
    assert b.try_acquire_or_renew()


def test_lost_write_race_stops_acting_immediately() -> None:
    store, clock, events = InMemoryLeaseStore(), Clock(), []
    a = elector(store, "a", clock, events)
    a.try_acquire_or_renew()
    assert store.record is not None
    # somebody else overwrites the lease (e.g. after a long GC pause on our side)
    store.update(replace(store.record, holder="c", renew_time=datetime.now(UTC)))
    clock.t += 2
    assert not a.try_acquire_or_renew()
    assert not a.is_leader()
    assert events == ["a+", "a-"]


def test_conflict_on_update_means_not_leader() -> None:
    class RacyStore(InMemoryLeaseStore):
        def update(self, record: LeaseRecord) -> LeaseRecord:
            raise LeaseConflict("someone else won")

    store, clock = RacyStore(), Clock()
    a = elector(store, "a", clock)
    assert a.try_acquire_or_renew()  # create works
    clock.t += 2
    assert not a.try_acquire_or_renew()
    assert not a.is_leader()


def test_create_race_has_one_winner() -> None:
    store, clock = InMemoryLeaseStore(), Clock()

    a, b = elector(store, "a", clock), elector(store, "b", clock)
    real_get = store.get
    store.get = lambda: None  # type: ignore[method-assign]  # both read 'no lease' before either creates it
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # create -> 409
    store.get = real_get  # type: ignore[method-assign]
    assert store.record is not None and store.record.holder == "a"


def test_release_hands_over_at_the_next_retry() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    assert store.record is not None and store.record.holder == ""
    clock.t += 2
    assert b.try_acquire_or_renew()


def test_release_by_a_follower_does_not_touch_the_lease() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    b.release()
    assert store.record is not None and store.record.holder == "a"


@pytest.mark.parametrize("restart", [True, False])
def test_leader_restart_with_same_identity_keeps_the_lease(restart: bool) -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a = elector(store, "a", clock)
    a.try_acquire_or_renew()
    again = elector(store, "a", clock) if restart else a
    clock.t += 3
    assert again.try_acquire_or_renew()
    assert store.record is not None and store.record.transitions == 0


def test_background_loop_acquires_and_stop_releases() -> None:
    import time

    # A 20 s lease: b could take it by expiry only after 20 s, so a handover within a few seconds (generous on a
    # loaded machine; the next retry after the release is 0.05 s away) can only be the release.
    timings = ElectionTimings(lease_duration_s=20.0, renew_deadline_s=10.0, retry_period_s=0.05)
    store = InMemoryLeaseStore()
    a = LeaderElector(store, "a", timings)
    b = LeaderElector(store, "b", timings)
    a.start()
    deadline = time.monotonic() + 30
    while not a.is_leader() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.is_leader()
    b.start()
    deadline = time.monotonic() + 30
    while b.holder is None and time.monotonic() < deadline:  # b has read the Lease
        time.sleep(0.01)
    time.sleep(0.3)
    assert b.holder == "a" and not b.is_leader()
    started = time.monotonic()
    a.stop(release=True)
    deadline = started + 30
    while not b.is_leader() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.is_leader()
    assert time.monotonic() - started < 5.0  # well under the 20 s lease duration: released, not expired
    b.stop()


def test_writes_stop_a_request_timeout_before_a_follower_could_take_over() -> None:
    """A write that starts while the leader still leads can land a request timeout later: ``may_write`` stops writes
    early enough that the latest one lands before the lease duration runs out (follower takeover), while
    ``is_leader`` keeps the renew deadline for everything else."""
    store, clock = InMemoryLeaseStore(), Clock()
    a = LeaderElector(
        store, "a", ElectionTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2, write_margin_s=10),
        monotonic=clock, wall_clock=lambda: datetime.fromtimestamp(clock.t, UTC),
    )  # fmt: skip
    assert a.try_acquire_or_renew()
    store.fail = PortError("API server slow")
    seen = []
    for elapsed in (0.0, 2.0, 4.9, 5.0, 7.0, 9.9, 10.0):
        clock.t = 1000 + elapsed
        seen.append((elapsed, a.is_leader(), a.may_write()))
    assert seen == [
        (0.0, True, True), (2.0, True, True), (4.9, True, True),  # 4.9 + 10 < 15: lands in time
        (5.0, True, False), (7.0, True, False), (9.9, True, False),  # leader, but a write could land at 15+ s
        (10.0, False, False),  # the renew deadline: not leading at all
    ]  # fmt: skip
    store.fail = None
    assert a.try_acquire_or_renew()  # the holder renews its own Lease
    assert a.may_write()  # and may write again


def test_without_a_write_margin_may_write_is_is_leader() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a = elector(store, "a", clock)
    assert a.try_acquire_or_renew()
    for elapsed in (0.0, 9.9, 10.0):
        clock.t = 1000 + elapsed
        assert a.may_write() == a.is_leader() == (elapsed < 10)


def test_the_controller_writes_with_its_request_timeout_as_the_margin() -> None:
    """``build_runtime`` hands the Kubernetes request timeout to the elector, and the runtime's write guard
    (``can_act``, asked by the writer before every request) is ``may_write``."""
    from kubernetes import client

    from autoscaler.app import Adapters, build_runtime
    from autoscaler.fakes.cluster import FakeCluster
    from autoscaler.fakes.metrics import FakeMetricsSource
    from autoscaler.settings import Settings
    from tests.runtime.runtime_fakes import FakePolicies

    fake = FakeCluster()
    adapters = Adapters(metrics=FakeMetricsSource(), cluster=fake, writer=fake, policies=FakePolicies([]),
                        status_writer=None, node_pools=None, api_client=client.ApiClient())  # fmt: skip
    settings = Settings(leader_election={"enabled": True, "identity": "a"}, kubernetes={"request_timeout_seconds": 7})
    runtime = build_runtime(settings, adapters, refit=lambda now: None, http=False)
    assert runtime.elector is not None
    assert runtime.elector._timings.write_margin_s == 7
    runtime.elector.may_write = lambda: False  # type: ignore[method-assign]
    runtime.elector.is_leader = lambda: True  # type: ignore[method-assign]
    assert not runtime.can_act()  # leading, but no time for a write to land: nothing is written
