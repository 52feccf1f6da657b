"""One small Protocol per external system. Each has a real adapter (``autoscaler/adapters``) and an in-memory fake
(``autoscaler/fakes``); the simulator is one more implementation of them. The GPUScalingPolicy objects
(``PolicySource``, ``PolicyStatusWriter``) and the forecasts the refit job publishes (``ForecastReader``) are read
through ports too.

Errors: an adapter raises ``PortError`` (or a subclass) for an outage it could not recover from; callers turn that
into stale data / a hold, never into a scale-down or a preemption.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import Observation, ServicePolicy
from autoscaler.core.status import StatusUpdate
from autoscaler.core.tick import ForecastReadConfig, PublishedForecast, ServiceForecastView

POLICY_KIND = "GPUScalingPolicy"  # the kind of a PolicyObject: its Events and status go to this object


class PortError(Exception):
    """An external system failed in a way the adapter could not hide (outage, auth, timeout after retries)."""


@dataclass(frozen=True, slots=True)
class Series:
    """A regular or irregular time series: ``times`` in Unix seconds ascending, ``values`` of the same length."""

    times: tuple[float, ...]
    values: tuple[float, ...]


class MetricsSource(Protocol):
    """Observes DCGM and application metrics (Prometheus in production)."""

    def observe(
        self, services: Sequence[ServicePolicy], now: float, *, cluster: ClusterSnapshot | None = None
    ) -> Observation:
        """One observation of every service and GPU at ``now``. Never raises for an outage: returns stale data.

        ``cluster``, this tick's snapshot, lets a source map pods to Deployments and count unready pods (the
        Prometheus adapter does); a source that does not need it ignores it."""
        ...

    def set_service_queries(self, service_queries: Mapping[str, Any]) -> None:
        """Replace the per-service query overrides (``spec.queries`` of each policy that sets one, by service key);
        a source without queries ignores them. Raises ValueError naming the service first
        (``"<namespace>/<name>: spec.queries.<field>: <why>"``) when an override is rejected."""
        ...

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        """History of one service's signal (``request_rate``, ``gpu_utilization``...) for forecasting."""
        ...


class EvictionOutcome(StrEnum):
    EVICTED = "evicted"  # the pod is being evicted (a dry run: it would be)
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget says not now
    # Not evicted, nothing written: the pod meant is no longer there -- 404 (already gone), or a pod of that name with
    # another uid (a StatefulSet/JobSet successor; the uid precondition's 409). Its goal is met, but no eviction of
    # ours made it: no Event may name the pod (the name may be the successor's).
    GONE = "gone"


class WriteOutcome(StrEnum):
    """What a scale, suspend or resume (``ClusterWriter``) or a resize (``NodePoolScaler.scale``) did: the writer
    says whether it wrote, so that Events, metrics and the rate policies count only the changes it made."""

    WROTE = "wrote"  # the change was written
    ALREADY = "already"  # the object was already as wanted (replicas, suspended, running, size): nothing written
    GONE = "gone"  # the object does not exist (404), or another object holds its name now: nothing written


class ClusterReader(Protocol):
    def snapshot(self, now: float) -> ClusterSnapshot: ...


WriteGuard = Callable[[], bool]
"""Asked by a writer immediately before every request that changes the cluster (each PATCH, PUT, POST, eviction,
including those of a conflict retry); False means "do not send it": the writer raises ``WriteNotAllowed``. The
actuator passes the leadership check (the runtime's ``can_act``: ``LeaderElector.may_write``, the Lease held and
renewed recently enough for a request sent now to land before a follower may take over). ``ClusterWriter``,
``PolicyStatusWriter`` and ``NodePoolScaler.scale`` take it."""


class ChangedSinceRead(PortError):
    """Not written: the object is no longer as the decision saw it (a Deployment's replicas changed between the
    tick's read and the write). Nothing was changed; the next tick decides on fresh data."""


def refuse_replicas_changed(what: str, live: int, expected: int | None) -> None:
    """``ChangedSinceRead`` when a Deployment's live replicas are not the ``expected`` ones its scale was decided
    from (None: no precondition). Every ``ClusterWriter.scale_deployment`` asks this before writing."""
    if expected is not None and live != expected:
        raise ChangedSinceRead(
            f"{what}: not written: the Deployment changed from {expected} to {live!r} replicas since the tick read it; "
            "the next tick decides on fresh data"
        )


def refuse_pool_size_changed(what: str, live: int, expected: int | None) -> None:
    """``ChangedSinceRead`` when a pool's live size is not the ``expected`` one its resize was planned from (None:
    no precondition): an absolute write over a size the plan did not see could shrink a pool that a scale-up meant
    to grow (5 requested, 3 registered, "+1: 3 -> 4" writes 4). Every ``NodePoolScaler.scale`` asks this."""
    if expected is not None and live != expected:
        raise ChangedSinceRead(
            f"{what}: the pool's size is {live}, not the {expected} the plan was made from; not written (the next "
            "tick plans from the live size)"
        )


class WriteNotAllowed(PortError):
    """Not written: the write guard said no just before the request (not the leader any more, a write deadline
    passed). Nothing was changed by that request."""


@runtime_checkable
class DisruptionBudgets(Protocol):
    """What a writer that can also read PodDisruptionBudgets offers the actuator: a gang's pods under one budget are
    checked together before the first eviction (the Eviction API's dry run checks one pod and spends nothing)."""

    def disruptions_allowed(self, namespace: str) -> Mapping[str, int]:
        """PodDisruptionBudget name -> its ``status.disruptionsAllowed``, read now, for every budget of
        ``namespace``. Raises PortError when they cannot be read."""
        ...


class ClusterWriter(Protocol):
    """Idempotent writes: applying the same action twice leaves the cluster as applying it once. Every write says
    what it did (``WriteOutcome``, ``EvictionOutcome``): a repeated one answers ``ALREADY`` (an eviction ``GONE``),
    and only a ``WROTE``/``EVICTED`` is reported as applied, with an Event.

    The actuator passes ``expected_replicas`` and ``can_write`` to every write; a writer with nobody else writing
    and no Lease to lose (the simulated cluster, ``autoscaler plan``'s writer that writes nothing) may ignore them."""

    def scale_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        expected_replicas: int | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """Set the Deployment's replicas to ``replicas``: ``WROTE``; already there (on the read, or on the re-read
        after a conflict): nothing written, ``ALREADY``; no such Deployment (deleted since the read): ``GONE``.
        ``expected_replicas``: the replicas the decision was made
        from; when the live value differs (and is not ``replicas``), nothing is written and ``ChangedSinceRead`` is
        raised (a scale-up never lowers, a scale-down never raises, a concurrent change)."""
        ...

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> EvictionOutcome:
        """POST an Eviction (PodDisruptionBudgets decide); ``dry_run``: ask whether it would be allowed, change
        nothing (the API's ``dryRun: All``), so that a gang is stopped whole or not at all. ``uid``: the pod the
        plan was made from; a pod of that name with another uid (recreated since the read) is not evicted:
        ``GONE``, the one meant has gone. No pod of that name: ``GONE``."""
        ...

    def suspend_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """Suspend the workload (``spec.suspend: true``; a Kueue Workload ``spec.active: false``) and mark it as
        ours: ``WROTE``. Already suspended (by anyone; not marked then): ``ALREADY``. No such workload: ``GONE``."""
        ...

    def resume_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """Undo ``suspend_workload`` (``spec.suspend: false``; a Kueue Workload ``spec.active: true``): ``WROTE``.
        Already running: ``ALREADY`` (a stale mark of ours may still be removed). No such workload: ``GONE``.
        Suspended, but not by us (now): nothing written, ``ChangedSinceRead`` (the decision was made from an older
        read)."""
        ...

    def set_pod_deletion_cost(
        self,
        namespace: str,
        name: str,
        cost: int | None,
        *,
        uid: str | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """Set the pod's ``controller.kubernetes.io/pod-deletion-cost`` to ``cost`` with this controller's mark
        beside it (``gpuautoscaler.dev/deletion-cost-by``), or remove both (``cost`` None; a pod without our mark is
        left as it is): ``WROTE``; already so: ``ALREADY``. No such pod, or one of that name with another ``uid``
        (recreated since the read): ``GONE``. A cost on the pod that somebody else set (no mark of ours): nothing
        written, ``ChangedSinceRead``."""
        ...

    def emit_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        event_type: str = "Normal",
        *,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> None:
        """An Event on the object. ``uid``: the object's ``metadata.uid`` the Event is about (the pod a plan
        evicted), so that it never attaches to another object of the same name; None: the writer's best effort."""
        ...


class NodePoolScaler(Protocol):
    """A node pool that can be resized (Cluster API MachineDeployment, a cloud provider plug-in...).

    An implementation that clamps its writes to bounds of its own (the Cluster API adapter: the MachineDeployment's
    Cluster Autoscaler min/max-size annotations) should also have ``bounds(pool) -> (min, max)`` (None where unset):
    the controller reads it with the size, and the arbitration then plans no node the provider would not make (it
    would pick a burst that never comes instead of another way to meet the shortfall). Optional: without it, the
    configured bounds are all the arbitration knows."""

    def node_count(self, pool: str) -> int: ...

    def scale(
        self,
        pool: str,
        nodes: int,
        expected: int | None = None,
        remove_node: str | None = None,
        *,
        can_write: WriteGuard | None = None,
        remove_unregistered: bool = False,
        unregistered_min_age_s: float = 0.0,
    ) -> WriteOutcome | None:
        """Resize the pool to ``nodes``: ``WROTE``; already there (or at the min/max bound it is clamped to): nothing
        written, ``ALREADY``; None from a provider plug-in written before ``WriteOutcome``: taken as written.
        ``expected``: the size the plan counted; when the live size differs (and
        is not ``nodes`` already), nothing is written and ``ChangedSinceRead`` is raised: an absolute write over a
        size the plan did not see could shrink a pool a scale-up meant to grow. ``remove_node``: on a scale-down,
        the node to remove; an implementation that cannot make the provider remove that node writes nothing and
        raises ``PortError`` (a node the provider picks may be busy). ``can_write``: asked immediately before every
        request that changes something (a resize may read for longer than the Lease lasts); when it says no,
        nothing more is sent and ``WriteNotAllowed`` is raised. An implementation with nobody else writing and no
        Lease to lose (the simulated cluster) may ignore it; a provider plug-in whose ``scale`` does not take it is
        still called (the actuator asks the guard right before the call instead). ``remove_unregistered``: on a
        scale-down, remove one node the provider counts that never registered as a Node (past the provision
        timeout), never a registered one; an implementation that finds none writes nothing and raises ``PortError``.
        Passed only when set: a provider plug-in whose ``scale`` does not take it is not asked to give back such a
        node (the actuator fails the action instead). ``unregistered_min_age_s`` (seconds, with
        ``remove_unregistered``): only a node requested at least that long ago is removed (one a MachineHealthCheck
        created moments ago to replace the stuck one is still booting); none: ``PortError``, nothing written. Passed
        only when above 0 and taken."""
        ...


# ---- the rebalancer's move ledger ----------------------------------------------------------------------------------


class MoveLedger(Protocol):
    """Where the rebalancer records when it evicted pods, so that its hourly bound holds across a restart or a change
    of leader: a new leader that started from an empty history could spend a second hour's budget within the same
    hour. Writes use optimistic concurrency: a ``write`` after another process wrote since this one's last ``read`` or
    ``write`` raises ``PortError`` and changes nothing. A ``write`` is one request with nothing read before it: the
    controller asks its leadership check (``can_act``) immediately before every call, and a replica that may not
    write does not call it."""

    def read(self) -> tuple[float, ...]:
        """Unix seconds of the recorded evictions (oldest first; empty when nothing was ever recorded). Raises
        PortError when the ledger cannot be read or does not parse: the caller then moves nothing."""
        ...

    def targets(self) -> tuple[tuple[str, float], ...]:
        """The passes of moves for the targets still waiting (``RebalanceState.moved_for``: (target, Unix seconds),
        the latest few passes of each), as the last ``read`` found them; no request. A new leader waits as long for
        them as the old one would have (``RebalanceConfig.retry_wait_s`` of their count), instead of moving again for
        a target whose moved pods were put back minutes ago."""
        ...

    def write(self, move_times: tuple[float, ...], targets: tuple[tuple[str, float], ...] = ()) -> None:
        """Replace the recorded evictions with ``move_times`` and the targets moved for with ``targets``. Raises
        PortError when it cannot."""
        ...


# ---- GPUScalingPolicy objects -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyObject:
    """One GPUScalingPolicy object: its parsed policy, or the validation error that names the bad field."""

    namespace: str
    name: str  # the object's own name (events and status go here)
    policy: ServicePolicy | None
    error: str | None = None
    generation: int | None = None
    queries: Any = None  # spec.queries (PromQL overrides for the metrics source), when set
    adopt_hpa: str | None = None  # spec.adoptHpa: the HPA this policy takes the Deployment over from
    # metadata.uid: a policy deleted and re-created under its name is a new object (with an empty status)
    uid: str | None = None


class PolicySource(Protocol):
    def list_policies(self) -> Sequence[PolicyObject]:
        """Every GPUScalingPolicy in the watched namespaces. Raises PortError when the API cannot be read."""
        ...


class PolicyStatusWriter(Protocol):
    def update_policy_status(
        self,
        namespace: str,
        name: str,
        update: StatusUpdate,
        *,
        now: float,
        generation: int | None = None,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> object:
        """Merge ``update`` into the object's status subresource (``merge_status``: conditions keep their
        transition time); idempotent. ``generation``: the ``metadata.generation`` the update was decided from,
        written as ``observedGeneration`` (None: the object's generation read by the writer). ``can_write``: asked
        immediately before every request that changes the status (``WriteNotAllowed`` when it says no, nothing
        sent). ``uid``: the ``metadata.uid`` of the object the update was decided for; an object of that name with
        another uid (deleted and created again since the read) is not written, and that is no error (the next tick
        reads the new object and writes its own status); None: whatever object has the name. Raises PortError when
        it cannot."""
        ...


# ---- forecasts --------------------------------------------------------------------------------------------------


class ForecastReader(Protocol):
    """The latest fits the refit job published, for the tick to read (``core.tick.decide_tick``); never fits."""

    @property
    def published(self) -> Mapping[str, PublishedForecast]:
        """The latest fit of every forecasting service, one immutable mapping (replaced, never changed)."""
        ...

    def read_config(self) -> ForecastReadConfig:
        """How the tick reads these forecasts (refit period, staleness, node boot, tick interval)."""
        ...

    def start_term(self) -> None:
        """This replica starts leading (again): until a refit of the new term has run, a service without a usable
        forecast is held (its fits may have gone stale while another replica led)."""
        ...

    def record_leads(self, views: Mapping[str, ServiceForecastView]) -> None:
        """The lead time the tick read each forecast at (the refit scores later forecasts on those leads)."""
        ...


class Clock(Protocol):
    def now(self) -> float: ...
