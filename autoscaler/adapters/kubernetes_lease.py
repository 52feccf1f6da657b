"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the semantics of client-go's ``leaderelection``.

Two halves:
- ``LeaseStore``: get / create / update one Lease with optimistic concurrency. ``KubernetesLeaseStore`` talks to the
  API server (CoordinationV1Api): create -> 409 means somebody created it first; update carries the
  ``resourceVersion`` it read -> 409 means somebody else wrote in between (and won). Tests use an in-memory store.
- ``LeaderElector``: the acquire/renew/release protocol on top of a store.

Safety argument (why two replicas never act at once, given clocks that tick at the same rate):
- a follower only takes over after it has seen the same Lease record unchanged for ``lease_duration`` on its *own*
  monotonic clock (no wall-clock comparison across machines, as in client-go), counted from when its GET returned;
  a Lease found deleted counts as that last record, still silent (client-go creates it at once, and the holder,
  which renewed a moment ago, acts beside the new leader until its next retry): the holder recreates it first;
- the leader stops acting as soon as ``renew_deadline`` (< ``lease_duration``) has passed since its last successful
  renewal (counted from before the renewal was sent), and at once when a renewal shows that somebody else holds the
  Lease or wins the write race (a 409 after which a fresh read names another holder; a 409 on a Lease still ours is
  a change of its metadata, and the renewal is retried on the fresh read).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from autoscaler.ports import PortError

log = logging.getLogger(__name__)

# A renewal that meets a 409 on a Lease a fresh read still shows as ours is tried again this many times.
_RENEW_CONFLICT_RETRIES = 3


class LeaseConflict(Exception):
    """The Lease changed since it was read (409 on update), or already exists (409 on create)."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str  # "" when released
    lease_duration_s: float
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str | None = None


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None:
        """The Lease, or None when it does not exist. Raises PortError when the API cannot be reached."""
        ...

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the Lease; LeaseConflict when it exists already."""
        ...

    def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the Lease if its resourceVersion still is ``record.resource_version``; else LeaseConflict."""
        ...


def _micro_time(value: datetime | None) -> datetime | None:
    """A ``MicroTime`` the apiserver accepts. It parses RFC 3339 with exactly six fraction digits; the client
    serialises with ``isoformat()``, which drops the fraction on a whole second, and the real apiserver answers 400
    (found against the real control plane of tests/realkube; the fake API server accepted it). The client's pydantic
    models turn a string back into a datetime, so the only fix on our side is to never send microsecond 0: one
    microsecond later is immaterial to a Lease."""
    if value is None:
        return None
    return value.replace(microsecond=1) if value.microsecond == 0 else value


class KubernetesLeaseStore:
    """One Lease object through the official client's CoordinationV1Api."""

    def __init__(self, api: object, namespace: str, name: str, request_timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self._client = client
        self._api = api if api is not None else client.CoordinationV1Api()
        self._namespace = namespace
        self._name = name
        # The timeout must stay well below the renew deadline, or one hung request would eat the whole deadline.
        self._timeout = request_timeout_s
        # The metadata of the Lease last read or written: an update is a PUT, which replaces the whole object, so
        # it carries the labels, annotations, owner references and finalizers somebody else put on the Lease (as
        # client-go's LeaseLock updates the object it read) instead of dropping them.
        self._last_metadata: object | None = None

    def _record(self, lease: object) -> LeaseRecord:
        spec = lease.spec  # type: ignore[attr-defined]
        metadata = lease.metadata  # type: ignore[attr-defined]
        self._last_metadata = metadata
        return LeaseRecord(
            holder=(spec.holder_identity or "") if spec else "",
            lease_duration_s=float((spec.lease_duration_seconds if spec else None) or 0),
            acquire_time=spec.acquire_time if spec else None,
            renew_time=spec.renew_time if spec else None,
            transitions=(spec.lease_transitions if spec else None) or 0,
            resource_version=metadata.resource_version if metadata else None,
        )

    def _body(self, record: LeaseRecord) -> object:
        c = self._client
        metadata = c.V1ObjectMeta(name=self._name, namespace=self._namespace, resource_version=record.resource_version)
        last = self._last_metadata
        if record.resource_version is not None and getattr(last, "resource_version", None) == record.resource_version:
            # the object this update is based on: keep what others wrote into its metadata
            for field in ("labels", "annotations", "owner_references", "finalizers"):
                setattr(metadata, field, getattr(last, field, None))
        return c.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=metadata,
            spec=c.V1LeaseSpec(
                holder_identity=record.holder,
                # The API field is whole seconds; round up so that followers never wait less than configured.
                lease_duration_seconds=max(1, math.ceil(record.lease_duration_s)),
                acquire_time=_micro_time(record.acquire_time),
                renew_time=_micro_time(record.renew_time),
                lease_transitions=record.transitions,
            ),
        )

    def _call(self, what: str, fn: Callable[[], object]) -> object:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(f"{what}: 409 Conflict") from exc
            raise PortError(f"lease {self._namespace}/{self._name}: {what}: HTTP {exc.status} {exc.reason}") from exc
        except LeaseConflict:
            raise
        except Exception as exc:  # urllib3 connection errors and timeouts are not ApiException
            raise PortError(f"lease {self._namespace}/{self._name}: {what}: {type(exc).__name__}: {exc}") from exc

    def get(self) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self._api.read_namespaced_lease(  # type: ignore[attr-defined]
                self._name, self._namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise PortError(f"lease {self._namespace}/{self._name}: read: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise PortError(f"lease {self._namespace}/{self._name}: read: {type(exc).__name__}: {exc}") from exc
        return self._record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(replace(record, resource_version=None))
        created = self._call(
            "create",
            lambda: self._api.create_namespaced_lease(  # type: ignore[attr-defined]
                self._namespace, body, _request_timeout=self._timeout
            ),
        )
        return self._record(created)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(record)
        updated = self._call(
            "update",
            lambda: self._api.replace_namespaced_lease(  # type: ignore[attr-defined]
                self._name, self._namespace, body, _request_timeout=self._timeout
            ),
        )
        return self._record(updated)


class InMemoryLeaseStore:
    """A Lease with the API server's optimistic concurrency, shared by several electors in one process (tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._record: LeaseRecord | None = None
        self._version = 0
        self.fail: Exception | None = None  # set to make every call raise (an unreachable API server)

    @property
    def record(self) -> LeaseRecord | None:
        return self._record

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def get(self) -> LeaseRecord | None:
        with self._lock:
            self._check()
            return self._record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        with self._lock:
            self._check()
            if self._record is not None:
                raise LeaseConflict("exists")
            self._version += 1
            self._record = replace(record, resource_version=str(self._version))
            return self._record

    def update(self, record: LeaseRecord) -> LeaseRecord:
        with self._lock:
            self._check()
            if self._record is None or record.resource_version != self._record.resource_version:
                raise LeaseConflict("resourceVersion mismatch")
            self._version += 1
            self._record = replace(record, resource_version=str(self._version))
            return self._record


@dataclass(frozen=True, slots=True)
class ElectionTimings:
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    # Seconds a write may take to reach the API server (the request timeout): ``may_write`` stops writes this long
    # before a follower could take the Lease over, so that a slow write cannot land beside the next leader's.
    write_margin_s: float = 0.0


class LeaderElector:
    """Acquire, renew and release one Lease; ``is_leader()`` is what every acting code path asks first.

    Call ``try_acquire_or_renew()`` every ``retry_period`` (``start()`` runs a thread that does), and ``release()``
    on shutdown so that a follower takes over at its next retry instead of after a full lease duration.
    """

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timings: ElectionTimings = ElectionTimings(),
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.identity = identity
        self._store = store
        self._timings = timings
        self._monotonic = monotonic
        self._wall = wall_clock
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_error = on_error
        # State (leadership, renewal time, what was observed): held only for bookkeeping, never across a request.
        self._lock = threading.RLock()
        # Serialises attempts and releases: held across the Lease requests.
        self._attempt_lock = threading.Lock()
        self._leader = False
        self._last_renew = -math.inf  # monotonic time of the last successful create/update as holder
        self._observed: tuple[str, datetime | None, str | None] | None = None
        self._observed_at = -math.inf  # monotonic time at which the observed record last changed
        # The holder and lease duration of the record last observed: a Lease found deleted stays taken by that
        # holder until the record has been silent for that duration.
        self._observed_holder_duration: tuple[str, float] | None = None
        self._pending: list[Callable[[], None]] = []
        # Held while callbacks run (re-entrant: a callback may ask is_leader()); never taken under ``_lock``.
        self._delivering = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_attempt_ok = False  # the last call reached the API (for /readyz of a follower)
        # Why the last attempt could not talk to the API (None when it could): a False from try_acquire_or_renew()
        # with this set means "could not read or write the Lease", not "another replica holds it".
        self.last_error: Exception | None = None

    # ---- what the rest of the controller asks ----

    def is_leader(self) -> bool:
        """True while this process holds the Lease *and* renewed it within the renew deadline."""
        return self._leading(margin_s=None)

    def may_write(self) -> bool:
        """``is_leader()``, and a request sent now reaches the API server before a follower may take over: the time
        since the last renewal plus ``write_margin_s`` is within the lease duration. The renew deadline alone let a
        write start 9.9 s after the last renewal and, with a 10 s request timeout, land 19.9 s after it, when a
        follower may have been leading for 4.9 s (lease duration 15 s)."""
        return self._leading(margin_s=self._timings.write_margin_s)

    def _leading(self, margin_s: float | None) -> bool:
        with self._lock:
            leader = self._check_deadline() and (
                margin_s is None or self._monotonic() - self._last_renew + margin_s < self._timings.lease_duration_s
            )
        self._fire()
        return leader

    def _check_deadline(self) -> bool:
        if self._leader and self._monotonic() - self._last_renew >= self._timings.renew_deadline_s:
            log.warning(
                "leader election: no successful renewal for %.1fs (renew deadline %.1fs): stop acting",
                self._monotonic() - self._last_renew,
                self._timings.renew_deadline_s,
            )
            self._set_leader(False)
        return self._leader

    @property
    def holder(self) -> str | None:
        """The holder identity seen last ("" = released, None = never read)."""
        with self._lock:
            return self._observed[0] if self._observed else None

    # ---- protocol ----

    def _set_leader(self, leader: bool) -> None:
        """Record a transition (under the lock); its callback runs later in ``_fire``, outside the lock."""
        if leader == self._leader:
            return
        self._leader = leader
        log.info("leader election: %s %s", self.identity, "became the leader" if leader else "is no longer the leader")
        callback = self._on_started if leader else self._on_stopped
        if callback is not None:
            self._pending.append(callback)

    def _fire(self) -> None:
        # Callbacks run without our lock held: they may take other locks (the controller's), and a tick that holds
        # those asks is_leader() before every write; running them under our lock could deadlock the two threads.
        # They run one at a time, in the order of the transitions (``_delivering``): a tick thread that saw the renew
        # deadline pass and the election thread that renewed just after both fire; unordered, "stopped" could run
        # after "started" and leave the runtime believing it no longer leads (leader gauge 0, "no leader" alert).
        with self._lock:
            if not self._pending:
                return
        with self._delivering:
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    callback = self._pending.pop(0)
                try:
                    callback()
                except Exception:  # a broken callback must not kill the election loop
                    log.exception("leader election callback failed")

    def _observe(self, record: LeaseRecord, now: float) -> None:
        key = (record.holder, record.renew_time, record.resource_version)
        if key != self._observed:
            self._observed = key
            self._observed_at = now
        self._observed_holder_duration = (record.holder, record.lease_duration_s)

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether this process is the leader afterwards."""
        try:
            return self._attempt()
        finally:
            self._fire()

    def _attempt(self) -> bool:
        # One attempt at a time (the election thread, `run --once`, a release on shutdown), but the state lock is
        # taken only around the bookkeeping, never across a Lease request: is_leader() and may_write() (asked before
        # every write) and /readyz answer from memory while a GET or PUT waits for a slow API server.
        with self._attempt_lock:
            now = self._monotonic()
            wall = self._wall()
            duration = self._timings.lease_duration_s
            try:
                current = self._store.get()
                if current is None:
                    with self._lock:
                        last, silent_for = self._observed_holder_duration, now - self._observed_at
                        if last is not None and last[0] not in ("", self.identity) and silent_for < last[1]:
                            # Deleted under a holder whose renewals we saw lately: it still acts until its next retry
                            # (and recreates the Lease then); creating it now would make two leaders.
                            self.last_attempt_ok = True
                            self.last_error = None
                            self._set_leader(False)
                            return False
                    fresh = LeaseRecord(self.identity, duration, acquire_time=wall, renew_time=wall, transitions=0)
                    created = self._store.create(fresh)
                    with self._lock:
                        self._observe(created, now)
                        self._renewed(now)
                    return True
                # The record was seen when the GET returned, not when it was sent: a GET in flight while the holder
                # renewed returns the new record, and stamping it with the time it was sent would let this replica
                # take over up to one request latency before the holder's writes stop (client-go stamps it after
                # the GET too). The expiry check below keeps ``now``, the earlier time: the conservative side.
                with self._lock:
                    self._observe(current, self._monotonic())
                    self.last_attempt_ok = True
                    self.last_error = None
                    observed_at = self._observed_at
                for conflicts in range(_RENEW_CONFLICT_RETRIES + 1):
                    mine = current.holder == self.identity
                    if not mine and current.holder and now - observed_at < current.lease_duration_s:
                        # Somebody else holds a lease that has not expired by our own clock.
                        with self._lock:
                            self._set_leader(False)
                        return False
                    wanted = LeaseRecord(
                        holder=self.identity,
                        lease_duration_s=duration,
                        acquire_time=current.acquire_time if mine else wall,
                        renew_time=wall,
                        transitions=current.transitions if mine else current.transitions + 1,
                        resource_version=current.resource_version,
                    )
                    try:
                        written = self._store.update(wanted)
                    except LeaseConflict:
                        if not mine or conflicts >= _RENEW_CONFLICT_RETRIES:
                            raise
                        # Our own Lease changed under the renewal: somebody took it over, or only touched it (a
                        # label, an annotation). A fresh read tells: still ours -> renew on it; else stop at once.
                        try:
                            reread = self._store.get()
                        except Exception as exc:  # cannot tell who won: stop at once, as before
                            raise LeaseConflict(f"renewal conflict, then the re-read failed: {exc}") from exc
                        if reread is None or reread.holder != self.identity:
                            raise
                        with self._lock:
                            self._observe(reread, self._monotonic())
                            observed_at = self._observed_at
                        current = reread
                        continue
                    with self._lock:
                        self._observe(written, now)
                        self._renewed(now)
                    return True
                raise AssertionError("unreachable")  # pragma: no cover
            except LeaseConflict:
                # Somebody else wrote first: they are the leader now. Stop acting at once, not at the deadline.
                with self._lock:
                    self.last_attempt_ok = True
                    self.last_error = None
                    self._set_leader(False)
                return False
            except Exception as exc:
                with self._lock:
                    self.last_attempt_ok = False
                    self.last_error = exc
                log.warning("leader election: %s", exc)
                if self._on_error is not None:
                    try:
                        self._on_error(exc)
                    except Exception:  # a broken callback must not kill the election loop
                        log.exception("leader election error callback failed")
                with self._lock:
                    return self._check_deadline()  # keeps leadership until the renew deadline, then drops it

    def _renewed(self, sent_at: float) -> None:
        """A create or update as holder succeeded (under the state lock). The renewal counts from when it was sent:
        the conservative side for the deadline and for ``may_write``."""
        self._last_renew = sent_at
        self.last_attempt_ok = True
        self.last_error = None
        self._set_leader(True)

    def release(self) -> None:
        """Give the Lease up (holder "") so that a follower can take it at its next retry."""
        try:
            self._release()
        finally:
            self._fire()

    def _release(self) -> None:
        with self._attempt_lock:
            with self._lock:
                was_leader = self._leader
                self._set_leader(False)
            if not was_leader:
                return
            try:
                current = self._store.get()
                if current is None or current.holder != self.identity:
                    return
                wall = self._wall()
                self._store.update(
                    replace(current, holder="", lease_duration_s=1.0, renew_time=wall, acquire_time=wall)
                )
                log.info("leader election: released lease")
            except Exception as exc:  # best effort: the lease expires by itself anyway
                log.warning("leader election: release failed (followers wait for expiry): %s", exc)

    # ---- background loop ----

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:  # the loop is the only thing that renews: it must outlive any bug in one attempt
                log.exception("leader election attempt failed")
            # Followers retry at the retry period; so does the leader, giving it several renewals per deadline.
            self._stop.wait(self._timings.retry_period_s)

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timings.renew_deadline_s)
            self._thread = None
        if release:
            self.release()
