"""Review 32 of the Lease-based leader elector: each test reproduces a defect found in review (it failed on the code
before the fix). Hand-driven clocks; no sleeps."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes_lease import (
    ElectionTimings,
    InMemoryLeaseStore,
    KubernetesLeaseStore,
    LeaderElector,
    LeaseRecord,
)
from tests.kube.fake_apiserver import FakeApiServer


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


TIMINGS = ElectionTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)


def elector(
    store: object, name: str, clock: Clock, events: list[str], timings: ElectionTimings = TIMINGS
) -> LeaderElector:
    return LeaderElector(
        store,  # type: ignore[arg-type]
        name,
        timings,
        monotonic=clock,
        wall_clock=lambda: datetime.fromtimestamp(clock.t, UTC),
        on_started_leading=lambda: events.append(f"{name}+"),
        on_stopped_leading=lambda: events.append(f"{name}-"),
    )


class SlowGet:
    """A view of a shared Lease whose GET takes time: ``during_get`` runs while the request is in flight (the API
    server answers after it), and the answer arrives ``latency`` seconds after the request was sent."""

    def __init__(self, inner: InMemoryLeaseStore, clock: Clock) -> None:
        self.inner, self.clock = inner, clock
        self.latency = 0.0
        self.during_get: list[object] = []

    def get(self) -> LeaseRecord | None:
        sent = self.clock.t
        for hook in self.during_get:
            hook()  # type: ignore[operator]
        self.during_get = []
        record = self.inner.get()
        self.clock.t = sent + self.latency
        return record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self.inner.create(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        return self.inner.update(record)


def test_a_follower_times_the_lease_from_when_it_saw_it_not_from_when_it_asked() -> None:
    """client-go stamps an observed record with the time *after* the GET returned. Stamping it with the time the
    GET was sent let a follower whose GET was in flight while the leader renewed take over up to one request
    latency early: here at 1014.5, while the leader's last permitted write (started at 1004.9 with a 10 s request
    timeout) could still land until 1014.9."""
    store, clock, events = InMemoryLeaseStore(), Clock(), list[str]()
    a = elector(store, "a", clock, events, replace(TIMINGS, write_margin_s=10))
    b_view = SlowGet(store, clock)
    b = elector(b_view, "b", clock, events)
    clock.t = 990.0
    assert a.try_acquire_or_renew()
    # b sends its GET at 999; a renews at 1000 while it is in flight; b gets a's fresh record back at 1001
    clock.t = 999.0
    b_view.latency = 2.0

    def a_renews_at_1000() -> None:
        clock.t = 1000.0
        assert a.try_acquire_or_renew()

    b_view.during_get = [a_renews_at_1000]
    assert not b.try_acquire_or_renew()
    assert clock.t == 1001.0
    b_view.latency = 0.0
    # a goes silent (crashed, partitioned); its last write may start at 1004.9 and land 10 s later
    clock.t = 1004.9
    assert a.may_write()
    for t in (1003.0, 1008.0, 1012.0, 1014.5, 1015.9):
        clock.t = t
        assert not b.try_acquire_or_renew(), f"b took over at {t}, before 15 s had passed since it saw a's renewal"
    clock.t = 1016.1
    assert b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1


class TouchedBetweenReadAndWrite:
    """Somebody else writes the Lease (a label, an annotation: the holder unchanged) between our GET and our PUT,
    ``times`` times: our PUT then fails with 409 on a Lease that is still ours."""

    def __init__(self, inner: InMemoryLeaseStore, times: int) -> None:
        self.inner, self.times = inner, times

    def get(self) -> LeaseRecord | None:
        return self.inner.get()

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self.inner.create(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.times > 0:
            self.times -= 1
            current = self.inner.get()
            assert current is not None
            self.inner.update(current)  # same content, new resourceVersion (as a metadata-only change gives)
        return self.inner.update(record)


def test_a_renewal_conflict_on_a_lease_still_ours_is_retried_on_a_fresh_read_not_a_lost_leadership() -> None:
    """A 409 on the renewal while the fresh read still names us as the holder did not mean somebody else won: the
    leader dropped leadership at once and took it back two seconds later (stopped/started callbacks: the controller
    treats that as a new leader and holds scale-downs for a stabilisation window). client-go does not stop leading on
    a failed renewal before the renew deadline; the project rule is that a 409 is retried on a fresh read."""
    inner, clock, events = InMemoryLeaseStore(), Clock(), list[str]()
    store = TouchedBetweenReadAndWrite(inner, times=0)
    a = elector(store, "a", clock, events)
    assert a.try_acquire_or_renew()
    clock.t += 2
    store.times = 1
    assert a.try_acquire_or_renew()
    assert a.is_leader()
    assert events == ["a+"]
    assert inner.record is not None and inner.record.holder == "a"
    assert inner.record.renew_time == datetime.fromtimestamp(clock.t, UTC)  # renewed now
    assert inner.record.transitions == 0


def test_a_renewal_conflict_that_shows_another_holder_still_stops_at_once() -> None:
    inner, clock, events = InMemoryLeaseStore(), Clock(), list[str]()

    class TakenOver(TouchedBetweenReadAndWrite):
        def update(self, record: LeaseRecord) -> LeaseRecord:
            if self.times > 0:
                self.times -= 1
                current = self.inner.get()
                assert current is not None
                self.inner.update(replace(current, holder="b"))
            return self.inner.update(record)

    store = TakenOver(inner, times=0)
    a = elector(store, "a", clock, events)
    assert a.try_acquire_or_renew()
    clock.t += 2
    store.times = 1
    assert not a.try_acquire_or_renew()
    assert not a.is_leader()
    assert events == ["a+", "a-"]
    assert inner.record is not None and inner.record.holder == "b"


def test_renewal_conflicts_that_keep_coming_are_bounded() -> None:
    inner, clock, events = InMemoryLeaseStore(), Clock(), list[str]()
    store = TouchedBetweenReadAndWrite(inner, times=0)
    a = elector(store, "a", clock, events)
    assert a.try_acquire_or_renew()
    clock.t += 2
    store.times = 1000
    assert not a.try_acquire_or_renew()  # gave up after a bounded number of fresh reads
    assert store.times > 990
    assert not a.is_leader()


def test_renewals_keep_the_labels_and_annotations_others_put_on_the_lease(tmp_path: Path) -> None:
    """The renewal is a PUT: a body carrying only name, namespace and resourceVersion in its metadata dropped every
    label and annotation somebody else had put on the Lease (an install tool's, a policy engine's). client-go
    updates the object it read, metadata included."""
    with FakeApiServer() as server:
        api = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            store = KubernetesLeaseStore(client.CoordinationV1Api(api), "default", "gpu-autoscaler")
            clock, events = Clock(), list[str]()
            a = elector(store, "a", clock, events)
            assert a.try_acquire_or_renew()  # created
            lease = server.get("coordination.k8s.io/v1", "Lease", "gpu-autoscaler")
            assert lease is not None
            lease["metadata"]["labels"] = {"app.kubernetes.io/part-of": "gpu-autoscaler"}
            lease["metadata"]["annotations"] = {"example.com/owner": "platform"}
            server.update_object(lease)
            for _ in range(2):
                clock.t += 2
                assert a.try_acquire_or_renew()
            a.release()
            lease = server.get("coordination.k8s.io/v1", "Lease", "gpu-autoscaler")
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == ""
            assert lease["metadata"]["labels"] == {"app.kubernetes.io/part-of": "gpu-autoscaler"}
            assert lease["metadata"]["annotations"] == {"example.com/owner": "platform"}
        finally:
            api.close()  # type: ignore[no-untyped-call]
