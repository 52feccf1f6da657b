"""Node pools that can be resized: the ``NodePoolScaler`` port, a Cluster API implementation and a provider registry.

Cluster API: a pool is a ``MachineDeployment`` (cluster.x-k8s.io/v1beta1); its ``scale`` subresource sets
``spec.replicas`` and the MachineSet controller creates or deletes Machines (and so Nodes). The same min/max
annotations the Cluster Autoscaler reads bound our writes too, so both never disagree on the limits.

A scale-down names the node the plan emptied. The MachineSet deletes a Machine of its own choosing (its delete
policy: Random by default) unless one carries the ``cluster.x-k8s.io/delete-machine`` annotation, so the node's
Machine is annotated first, then the size lowered, as the Cluster Autoscaler's Cluster API provider does; a node
whose Machine cannot be found is not removed by chance: nothing is written. A scale-down may instead give back a
Machine that never got a Node (``remove_unregistered``: past the provision timeout, the capacity it stands for never
came), by name as the Cluster Autoscaler removes its unregistered nodes: the oldest Machine without a
``status.nodeRef``, marked the same way; never a registered node, and nothing written when there is none.

The MachineSet deletes ``len(machines) - spec.replicas`` Machines, its ``machines`` including those already being
deleted (a MachineHealthCheck remediation, ``kubectl delete machine``), which go first, then every marked one. So the
size falls only when the Machines being deleted, the other marked Machines and ours fit in that number: a Machine
being deleted would otherwise absorb the decrease, and a mark left by the Cluster Autoscaler, a person, or by us
after a size write whose outcome was unknown could make the MachineSet delete that node (busy by now) instead of the
one the plan emptied. ``MachinesDeletedFirstError`` (``OtherMachinesMarkedError`` when marks are among them) then,
nothing written. Nor while the MachineDeployment rolls out (``RolloutInProgressError``: it spreads a size change over
its MachineSets without looking at the mark), and no resize at all of a paused one (``PoolPausedError``: the size
would wait unapplied while ``node_count`` reports it). Our marks are written, and taken back, only on the Machine as
we last saw it (resourceVersion): the take-back leaves a mark someone re-wrote meanwhile. Our own marks carry a
second annotation recording when we placed them (``gpuautoscaler.dev/delete-machine-by``); one left behind is cleared
by a later scale-down once it can no longer matter: older than any in-flight size write and the MachineDeployment
settled (``status.replicas == spec.replicas``, generation observed) with the Machine still there.

Leadership: ``scale`` asks its ``can_write`` guard (the leader's ``can_act``) immediately before every request it
sends, reads included (each exists only to decide this resize's writes, and they retry for longer than a Lease may
last); when it says no, nothing more is sent and ``WriteNotAllowed`` is raised. A delete-machine mark this call already
placed then stays: taking it back is a write too, and a replica that may not write sends nothing. Left, it is ours
(recorded with its time), reported (``on_mark_left``: ``not_leader``) and cleared by the leader's next scale-down once
it can no longer matter; taken back by a replica that no longer leads, it could be removed under the new leader's own
scale-down of that very node (it found the mark and lowered the size), and the MachineSet would delete a Machine of
its own choosing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes._api import (
    JSON,
    MERGE_PATCH,
    ConflictError,
    KubeApiError,
    KubeUnavailable,
    Pager,
    call_json,
    format_time,
    may_write,
    parse_time,
    with_read_retries,
)
from autoscaler.ports import (
    ChangedSinceRead,
    NodePoolScaler,
    PortError,
    WriteGuard,
    WriteNotAllowed,
    WriteOutcome,
    refuse_pool_size_changed,
)

log = logging.getLogger(__name__)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta1"
CAPI_PLURAL = "machinedeployments"
MACHINE_PLURAL = "machines"
# Machines made by a MachineDeployment's MachineSets carry its name in this label
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
# a MachineSet scaling down deletes Machines with this annotation first, whatever its delete policy
DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
# the MachineSet a Machine belongs to (besides its controller owner reference)
MACHINE_SET_NAME_LABEL = "cluster.x-k8s.io/set-name"
# a MachineDeployment carrying it is not reconciled: a size written meanwhile reaches no MachineSet
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
# Cluster API 1.9+ sets this condition on the MachineDeployment when it or its Cluster (spec.paused) is paused
PAUSED_CONDITION = "Paused"
# Written with (and removed with) every delete-machine mark of ours, with the same value ("gpu-autoscaler <RFC 3339
# UTC>"): a mark is ours only while both agree (the Cluster Autoscaler re-marking the Machine rewrites the value).
MARKED_BY_ANNOTATION = "gpuautoscaler.dev/delete-machine-by"
MARK_PREFIX = "gpu-autoscaler "
# Seconds a Machine's age (our clock against the apiserver's creationTimestamp) may read short and still count as
# old enough: clock skew, and the tick between the size write and the core's first sight of the request. A
# MachineHealthCheck's replacement of a stuck Machine is minutes younger.
CREATION_CLOCK_ALLOWANCE_S = 60.0
MIN_SIZE_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
MAX_SIZE_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"


class UnknownPoolError(PortError):
    """The plan names a pool that is not configured."""


class MachineNotFoundError(PortError):
    """The node to remove has no Machine of the pool's MachineDeployment (or its Machine is already going)."""


class NoUnregisteredMachineError(MachineNotFoundError):
    """Not scaled down, nothing written: a scale-down that gives back a Machine that never registered a Node
    (``remove_unregistered``) found none in the MachineDeployment (every Machine not being deleted has a
    ``status.nodeRef``), or the one it chose got a Node or started going meanwhile. Lowering the size anyway would let
    the MachineSet delete a Machine of its own choosing: a running node, possibly a busy one."""


class UnregisteredMachineBootingError(NoUnregisteredMachineError, ChangedSinceRead):
    """Not scaled down, nothing written: every Machine without a Node is younger than the minimum age -- the one the
    pool waited on was replaced (a MachineHealthCheck's replacement of a stuck Machine) or a scale-up created it.
    The premise of the give-back (a Machine that has waited past the provision timeout) is gone: the actuator reports
    the action ``skipped``, not ``failed`` (no error counted, no give-back back-off for the pool), and the next tick
    decides again."""


class MachinesDeletedFirstError(PortError):
    """Not scaled down, nothing written (a mark this call placed taken back): the MachineSet would delete other
    Machines first (ones already being deleted, which it still counts, and marked ones), so lowering the size would
    not reach the node the plan emptied. ``machines``: the other marked Machines, ``deleting``: those being deleted,
    ``namespace/name``, sorted."""

    def __init__(self, message: str, machines: tuple[str, ...], deleting: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.machines = machines
        self.deleting = deleting


class OtherMachinesMarkedError(MachinesDeletedFirstError):
    """Not scaled down, nothing written: more Machines of the MachineDeployment carry the delete-machine annotation
    (and are not being deleted) than the size would fall by, so the MachineSet might delete one of them instead of
    the node the plan emptied. ``machines``: the other marked Machines, ``namespace/name``, sorted."""


class RolloutInProgressError(PortError):
    """Not scaled down, nothing written: the MachineDeployment is rolling out (Machines in more than one MachineSet):
    it spreads a size change over its MachineSets without looking at the delete-machine mark, so the one that shrinks
    may delete a busy Machine of its own choosing while the emptied node stays."""


class PoolPausedError(PortError):
    """Not resized, nothing written: the MachineDeployment (or its Cluster) is paused, so a size written now reaches
    no MachineSet until it is unpaused, while ``node_count`` would already report it."""


class PoolDeletingError(PortError):
    """Not resized, nothing written: the MachineDeployment is being deleted (``metadata.deletionTimestamp``): Cluster
    API only runs its delete path and creates no Machine, while ``node_count`` would report the size written."""


class MarkedMachineChangedError(PortError):
    """Not scaled down, nothing more written: between two conflict rounds the node's Machine is another one than
    the Machine this call marked (or found marked): the size is lowered only while the Machine to remove is marked."""


MarkLeft = Callable[[str, str], None]
"""Told of every delete-machine mark a scale-down leaves on a Machine after it did not go through, with the Machine
(``namespace/name``) and why: ``outcome_unknown`` (no answer or a 5xx to the size write), ``size_fell`` (another
writer lowered the size meanwhile), ``size_unreadable`` (could not tell), ``unmark_failed``, ``not_leader`` (the
write guard refused before the size write or the take-back: this replica may write nothing more). Such a mark makes
the next scale-down by anyone remove that node: the hook for a metric or an Event."""


class MachineDeploymentNodePools:
    """``NodePoolScaler`` over Cluster API MachineDeployments in one namespace.

    ``pools`` maps the pool name the core uses (the nodes' pool label) to a MachineDeployment name; without it a
    pool is the MachineDeployment of the same name.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        pools: Mapping[str, str] | None = None,
        *,
        request_timeout_s: float = 10.0,
        conflict_retries: int = 5,
        read_retries: int = 2,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        stale_mark_grace_s: float = 300.0,
        on_mark_left: MarkLeft | None = None,
    ) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.pools = dict(pools) if pools is not None else None
        self.request_timeout_s = request_timeout_s
        self.conflict_retries = conflict_retries
        self.read_retries = read_retries
        self._sleep = sleep
        self._clock = clock
        # How old a mark of ours must be before it is taken for stale: a size write whose answer was lost may still
        # be applied for a while (the apiserver's request timeout is 60 s by default); cleared before it lands, the
        # MachineSet would delete a Machine of its own choosing.
        self.stale_mark_grace_s = stale_mark_grace_s
        self.on_mark_left = on_mark_left
        # (MachineDeployment, annotation, value) already warned about: read every tick, warned once per value
        self._bad_annotations: set[tuple[str, str, str]] = set()
        self.api_calls = 0

    def _md_name(self, pool: str) -> str:
        if self.pools is None:
            return pool
        try:
            return self.pools[pool]
        except KeyError:
            raise UnknownPoolError(f"node pool {pool!r} is not configured (known: {sorted(self.pools)})") from None

    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, can_write: WriteGuard | None = None, **kwargs: Any
    ) -> JSON:
        """One request of the Cluster API group in this namespace: ``fn(group, version, namespace, *args)``;
        ``can_write`` asked immediately before it (``WriteNotAllowed``, nothing sent, when it says no)."""
        may_write(what, can_write)
        self.api_calls += 1
        return call_json(
            what, fn, CAPI_GROUP, CAPI_VERSION, self.namespace, *args, timeout_s=self.request_timeout_s, **kwargs
        )

    def _read(
        self, what: str, fn: Callable[..., Any], *args: Any, can_write: WriteGuard | None = None, **kwargs: Any
    ) -> JSON:
        """One read (``_call``), retried like every read of the adapters; ``can_write`` asked before every attempt
        (a read of a resize: its retries may outlast the Lease)."""
        return with_read_retries(
            what,
            lambda: self._call(what, fn, *args, can_write=can_write, **kwargs),
            retries=self.read_retries,
            backoff_s=0.2,
            max_backoff_s=2.0,
            sleep=self._sleep,
        )

    def _get(self, what: str, name: str, can_write: WriteGuard | None = None) -> JSON:
        return self._read(what, self._custom.get_namespaced_custom_object, CAPI_PLURAL, name, can_write=can_write)

    def node_count(self, pool: str) -> int:
        """The pool's desired size (``spec.replicas``): what was asked for, booted or not."""
        name = self._md_name(pool)
        what = f"read MachineDeployment {self.namespace}/{name}"
        scale = self._read(what, self._custom.get_namespaced_custom_object_scale, CAPI_PLURAL, name)
        return int((scale.get("spec") or {}).get("replicas") or 0)

    def bounds(self, pool: str) -> tuple[int | None, int | None]:
        """(min, max) from the Cluster Autoscaler annotations, None where unset."""
        md = self._get(f"read MachineDeployment {self._md_name(pool)}", self._md_name(pool))
        return _bounds(md, self._bad_annotations)

    def size_and_bounds(self, pool: str) -> tuple[int, tuple[int | None, int | None]]:
        """``node_count`` and ``bounds`` from one read of the MachineDeployment: its ``spec.replicas`` is what the
        scale subresource reads (the controller reads both every tick and pool: one request instead of two)."""
        name = self._md_name(pool)
        md = self._get(f"read MachineDeployment {self.namespace}/{name}", name)
        return int((md.get("spec") or {}).get("replicas") or 0), _bounds(md, self._bad_annotations)

    def _machines(self, name: str, can_write: WriteGuard | None = None) -> list[JSON]:
        """The Machines of MachineDeployment ``name`` (every MachineSet of it)."""
        what = f"list Machines of MachineDeployment {self.namespace}/{name}"
        listed = self._read(
            what, self._custom.list_namespaced_custom_object, MACHINE_PLURAL,
            label_selector=f"{DEPLOYMENT_NAME_LABEL}={name}", can_write=can_write,
        )  # fmt: skip
        return list(listed.get("items") or [])

    def _find_machine(self, name: str, machines: list[JSON], node: str) -> JSON:
        for machine in machines:
            if ((machine.get("status") or {}).get("nodeRef") or {}).get("name") != node:
                continue
            if (machine.get("metadata") or {}).get("deletionTimestamp"):
                # lowering the size as well would make the MachineSet delete a second Machine
                raise MachineNotFoundError(
                    f"node {node}: its Machine {self.namespace}/{machine['metadata']['name']} is already being deleted"
                )
            return machine
        raise MachineNotFoundError(
            f"node {node} has no Machine in MachineDeployment {self.namespace}/{name} (label {DEPLOYMENT_NAME_LABEL}, "
            "status.nodeRef): not scaled down, the MachineSet would remove a node of its own choosing"
        )

    def _registered_provider_ids(self, can_write: WriteGuard | None = None) -> set[str]:
        """The ``spec.providerID`` of every registered Node (the Nodes are on the apiserver this adapter talks to),
        listed in pages by the reader's ``Pager`` (``can_write`` asked before every request); any error raises: the
        caller then writes nothing."""
        what = "list Nodes (their provider IDs: a Machine without a nodeRef may still have its Node)"

        def before_each_request() -> None:
            may_write(what, can_write)
            self.api_calls += 1

        pager = Pager(
            page_size=500, timeout_s=self.request_timeout_s, retries=self.read_retries, backoff_s=0.2,
            max_backoff_s=2.0, sleep=self._sleep, on_call=before_each_request,
        )  # fmt: skip
        ids, _ = pager.converted(what, _provider_id, self._core.list_node)
        return set(ids)

    def _find_unregistered(
        self,
        name: str,
        machines: list[JSON],
        keep: str | None = None,
        can_write: WriteGuard | None = None,
        min_age_s: float = 0.0,
    ) -> JSON:
        """The Machine to give back for a node that never registered: among those without a Node (no
        ``status.nodeRef`` name) and not being deleted, the oldest (``metadata.creationTimestamp``, then name): it
        has waited longest, while one a scale-up created moments ago has no Node yet either. ``min_age_s``: only a
        Machine created at least that long ago (by this adapter's clock, less ``CREATION_CLOCK_ALLOWANCE_S``)
        qualifies; one without a readable creationTimestamp then does not. ``keep``: the Machine an earlier attempt
        of this call marked (or found marked), kept while it still qualifies (a retry never moves to another
        Machine, the marked one left behind); ``NoUnregisteredMachineError`` when none qualifies."""
        waiting = [
            m for m in machines
            if not ((m.get("status") or {}).get("nodeRef") or {}).get("name")
            and not (m.get("metadata") or {}).get("deletionTimestamp")
        ]  # fmt: skip
        if any((m.get("spec") or {}).get("providerID") for m in waiting):
            # No nodeRef is not no Node: the Machine controller sets it only once it has reconciled the Machine (it
            # lags while Cluster API's controllers are down or slow). A Machine whose provider ID a registered Node
            # carries has its Node -- running, maybe busy -- and is never given back as one that never came.
            registered = self._registered_provider_ids(can_write)
            waiting = [m for m in waiting if (m.get("spec") or {}).get("providerID") not in registered]
        young = 0
        if min_age_s > 0 and waiting:
            # The core's timer is the pool's (its count beyond its registered nodes has stood past the timeout); the
            # Machine removed must itself have waited that long, as the Cluster Autoscaler's unregistered node must:
            # a MachineHealthCheck deletes the stuck Machine at its nodeStartupTimeout (10 min by default) and the
            # MachineSet replaces it, so the pool's count stands while the one left without a Node is booting.
            cutoff = self._clock() - min_age_s + CREATION_CLOCK_ALLOWANCE_S
            old_enough = [m for m in waiting if _age_key(m)[0] <= cutoff]
            young = len(waiting) - len(old_enough)
            waiting = old_enough
        if keep is not None:
            for machine in waiting:
                if machine["metadata"]["name"] == keep:
                    return machine
            raise NoUnregisteredMachineError(
                f"Machine {self.namespace}/{keep}, chosen as never registered, got a Node, started going or is gone "
                "since: not scaled down, the MachineSet would remove a node of its own choosing"
            )
        if not waiting:
            younger = (
                f" ({young} created less than {min_age_s:.0f}s ago, still booting: a MachineHealthCheck's replacement "
                "of a stuck one, or a new scale-up)"
                if young
                else ""
            )
            error = UnregisteredMachineBootingError if young else NoUnregisteredMachineError
            raise error(
                f"MachineDeployment {self.namespace}/{name} has no Machine without a Node (status.nodeRef) that is not "
                f"already being deleted{' and is old enough' if young else ''}{younger}: not scaled down, the "
                "MachineSet would remove a node of its own choosing"
            )
        return min(waiting, key=_age_key)

    def _annotate_machine(
        self,
        machine: JSON,
        value: str | None,
        *,
        precondition: bool = False,
        can_write: WriteGuard | None = None,
    ) -> JSON:
        """Set (or with None remove) the delete-machine annotation and our record of it: a merge patch of those two
        keys; the Machine as written is returned. ``precondition``: only if the Machine is still as ``machine`` (its
        resourceVersion; 409 otherwise). ``can_write``: asked immediately before the PATCH."""
        machine_name = machine["metadata"]["name"]
        verb = "mark" if value is not None else "unmark"
        metadata: JSON = {"annotations": {DELETE_MACHINE_ANNOTATION: value, MARKED_BY_ANNOTATION: value}}
        if precondition:
            metadata["resourceVersion"] = machine["metadata"]["resourceVersion"]
        return self._call(
            f"{verb} Machine {self.namespace}/{machine_name} for deletion",
            self._custom.patch_namespaced_custom_object,
            MACHINE_PLURAL,
            machine_name,
            {"metadata": metadata},
            _content_type=MERGE_PATCH,
            can_write=can_write,
        )

    def _mark_left(self, what: str, machine: JSON, why: str) -> None:
        if self.on_mark_left is None:
            return
        try:
            self.on_mark_left(f"{self.namespace}/{machine['metadata']['name']}", why)
        except Exception:  # a reporting hook never turns a scale-down's outcome into another
            log.exception("%s: the mark-left hook failed", what)

    def _check_way_clear(
        self,
        what: str,
        md: JSON,
        machines: list[JSON],
        ours: JSON,
        node: str,
        target: int,
        can_write: WriteGuard | None,
    ) -> None:
        """Raise unless lowering the size to ``target`` makes the MachineSet delete ``ours``: no rollout spreading
        the change (``_check_rollout``), no Machine being deleted or marked taking it (``_check_other_marks``).
        ``node``: what is being removed, for the messages only (``node n's Machine ns/m``, ``the unregistered Machine
        ns/m``)."""
        self._check_rollout(what, md, machines, node)
        self._check_other_marks(what, md, machines, ours, node, target, can_write)

    def _check_rollout(self, what: str, md: JSON, machines: list[JSON], node: str) -> None:
        """Raise ``RolloutInProgressError`` when the MachineDeployment has Machines in more than one MachineSet: it
        then spreads a size change over them (proportionally, largest first) without looking at the delete-machine
        mark. Two signals, either enough: the Machines not being deleted belong to more than one MachineSet (their
        controller owner reference, else their set-name label), or the status counts fewer Machines in the newest
        MachineSet than in all (``updatedReplicas < replicas``: also a new MachineSet whose Machines are not created
        yet). A Machine naming no MachineSet, or a status without ``updatedReplicas``, proves nothing either way."""
        sets = sorted({s for m in machines if not m["metadata"].get("deletionTimestamp") and (s := _machine_set_of(m))})
        status = md.get("status") or {}
        updated, total = status.get("updatedReplicas"), status.get("replicas")
        # not compared with spec.replicas: it differs during any scale-up or scale-down still under way too
        behind = isinstance(updated, int) and isinstance(total, int) and updated < total
        if len(sets) <= 1 and not behind:
            return
        seen = [f"Machines in MachineSets {', '.join(sets)}"] if len(sets) > 1 else []
        if behind:
            seen.append(f"status.updatedReplicas {updated} < status.replicas {total}")
        raise RolloutInProgressError(
            f"{what}: not scaled down: the MachineDeployment is rolling out ({'; '.join(seen)}): it spreads a size "
            f"change over its MachineSets without looking at {DELETE_MACHINE_ANNOTATION}, so one of them could delete "
            f"a busy Machine of its own choosing instead of {node}. Nothing written; retried once the rollout "
            "has finished."
        )

    def _check_other_marks(
        self,
        what: str,
        md: JSON,
        machines: list[JSON],
        ours: JSON,
        node: str,
        target: int,
        can_write: WriteGuard | None = None,
    ) -> None:
        """Raise ``MachinesDeletedFirstError`` (``OtherMachinesMarkedError`` when marks are among the reasons) unless
        lowering the size to ``target`` makes the MachineSet delete ``ours`` too. It deletes ``len(machines) -
        target`` Machines, those already being deleted counted and taken first, then the marked ones: so only when
        deleting Machines + other marked Machines + ours fit in that number. Marks of ours that can no longer matter
        (older than the grace, the MachineDeployment settled) are cleared first instead of counted (``can_write``
        asked before each)."""
        deleting = sorted(
            f"{self.namespace}/{m['metadata']['name']}" for m in machines if m["metadata"].get("deletionTimestamp")
        )
        others = [
            m for m in machines
            if m["metadata"]["name"] != ours["metadata"]["name"]
            and DELETE_MACHINE_ANNOTATION in (m["metadata"].get("annotations") or {})
            and not m["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        settled = _settled(md)
        now = self._clock()
        blocking: list[tuple[str, str]] = []
        for machine in others:
            full = f"{self.namespace}/{machine['metadata']['name']}"
            at = _our_mark_time(machine)
            if at is not None and settled and now - at >= self.stale_mark_grace_s:
                log.warning(
                    "%s: clearing our stale delete-machine mark on Machine %s (placed %s; the MachineDeployment has "
                    "settled at %s replicas without deleting it)", what, full, format_time(at),
                    (md.get("spec") or {}).get("replicas"),
                )  # fmt: skip
                # only if nobody re-marked it since the list (a 409 fails this scale-down, the next tick looks again)
                self._annotate_machine(machine, None, precondition=True, can_write=can_write)
                continue
            if at is None:
                why = f"marked by someone else: {machine['metadata']['annotations'][DELETE_MACHINE_ANNOTATION]!r}"
            elif not settled:
                why = f"ours, since {format_time(at)}; the MachineDeployment is still scaling"
            else:
                why = f"ours, since {format_time(at)}; a size write of ours may still land"
            blocking.append((full, f"{full} ({why})"))
        # Fewer Machines listed than spec.replicas is a MachineSet about to create them (it creates the objects at
        # once): counted as the size, the fall the plan asked for, as before this count looked at the Machines.
        removes = max(len(machines), int((md.get("spec") or {}).get("replicas") or 0)) - target
        if len(deleting) + len(blocking) + 1 <= removes:
            return
        counted = (
            f"lowering the size to {target} makes the MachineSet delete {removes} of the {len(machines)} Machines "
            f"it counts, and {node} would not be among them"
        )
        names = tuple(sorted(full for full, _ in blocking))
        if not blocking:  # only Machines being deleted are in the way (removes >= 1: a scale-down)
            raise MachinesDeletedFirstError(
                f"{what}: not scaled down: Machines already being deleted are counted by the MachineSet and deleted "
                f"first: {', '.join(deleting)} (a MachineHealthCheck remediation, kubectl delete machine); {counted}. "
                "Nothing written; retried once they are gone.",
                names,
                tuple(deleting),
            )
        details = "; ".join(detail for _, detail in sorted(blocking))
        also = f" Also being deleted, and deleted first: {', '.join(deleting)}." if deleting else ""
        raise OtherMachinesMarkedError(
            f"{what}: not scaled down: other Machines carry {DELETE_MACHINE_ANNOTATION} and are not being deleted: "
            f"{', '.join(names)}. The MachineSet deletes marked Machines first: {counted}.{also} Nothing written; "
            f"remove the annotation from them (or let their scale-down finish) to go on. {details}",
            names,
            tuple(deleting),
        )

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
    ) -> WriteOutcome:
        """Set the pool's size (idempotent), clamped to its min/max annotations: ``WROTE``; ``ALREADY`` when the live
        size is the target already (or the bound it is clamped to): nothing written. ``expected``: the size the plan
        was made from; a different live size raises ``ChangedSinceRead`` and writes nothing. ``PoolPausedError`` and
        nothing written when the MachineDeployment or its Cluster is paused. ``remove_node``: on a scale-down, the
        node to remove: its Machine is annotated for deletion before the size is lowered (and the annotation taken
        back when the size write fails, unless someone re-marked it meanwhile; a mark found there already is left as
        found); ``MachineNotFoundError`` and nothing written when the node has no Machine in the pool,
        ``RolloutInProgressError`` when the MachineDeployment's Machines are in more than one MachineSet,
        ``MachinesDeletedFirstError`` (``OtherMachinesMarkedError`` when marks are among them) when Machines being
        deleted and other marked Machines would take the decrease (more than the MachineSet removes, ours included),
        our own stale marks cleared first; nothing written (or the mark taken back) then either. ``can_write``:
        asked immediately before every request (reads included, conflict rounds and the take-back too); when it says
        no, ``WriteNotAllowed`` and nothing more is sent: a mark this call placed stays, reported as ``not_leader``.
        ``remove_unregistered``: on a scale-down, give back a Machine that never got a Node (past the provision
        timeout) instead of a named node: the oldest Machine of the pool without ``status.nodeRef`` and not being
        deleted (``_find_unregistered``; a conflict's retry keeps the Machine it marked), then everything as with
        ``remove_node``; ``NoUnregisteredMachineError`` and nothing written when there is none. A scale-up, or a size
        already there, ignores it; with ``remove_node`` too: ``ValueError``. ``unregistered_min_age_s`` (seconds):
        only a Machine created at least that long ago qualifies, less ``CREATION_CLOCK_ALLOWANCE_S`` (the core passes
        the pool's provision limit: a MachineHealthCheck's replacement of the stuck Machine, created moments ago, is
        booting, not stuck)."""
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        if remove_unregistered and remove_node is not None:
            raise ValueError("remove_node and remove_unregistered are exclusive: a scale-down removes one or the other")
        name = self._md_name(pool)
        what = f"scale MachineDeployment {self.namespace}/{name} to {nodes}"
        marked: JSON | None = None  # the Machine this call marked (and so may take back), as last known
        mark_value = ""  # what this call wrote in the mark: the take-back leaves any other value alone
        found_marked = False  # the node's Machine carried the annotation already: left as found
        held: str | None = None  # the Machine this call marked or found marked: a retry removes it, not another
        shrink_sent: int | None = None  # the size a write sent while the Machine was marked asked for
        refused = False  # the guard said no: this replica sends nothing more, not even the take-back of its mark
        try:
            for attempt in range(self.conflict_retries + 1):
                md = self._get(what, name, can_write)
                live = int((md.get("spec") or {}).get("replicas") or 0)
                if live != nodes:  # already there is fine whatever the plan saw
                    refuse_pool_size_changed(what, live, expected)
                low, high = _bounds(md, self._bad_annotations)
                target = nodes
                # Clamped towards the live size only, as Cluster Autoscaler does: a pool above a lowered max is not
                # grown, never shrunk for it (that would delete running machines on a scale-up); one below a raised
                # min is not shrunk, never grown for it.
                if target > live and high is not None and target > high:
                    target = max(high, live)
                    log.warning("%s: clamped to the pool's max size %d (live %d)", what, high, live)
                if target < live and low is not None and target < low:
                    target = min(low, live)
                    log.warning("%s: clamped to the pool's min size %d (live %d)", what, low, live)
                if live == target:
                    log.info("%s: already at %d nodes: nothing written", what, live)
                    return WriteOutcome.ALREADY
                if (md.get("metadata") or {}).get("deletionTimestamp"):
                    raise PoolDeletingError(
                        f"{what}: not resized: the MachineDeployment is being deleted (deletionTimestamp "
                        f"{md['metadata']['deletionTimestamp']}): Cluster API creates or removes no Machine for it "
                        "any more. Nothing written."
                    )
                paused = _paused(md)
                if paused is not None:
                    # Paused, the size would wait unapplied while node_count reports it: a scale-up counted as
                    # capacity that never boots, a scale-down's emptied node filled again and, once unpaused,
                    # deleted busy (our mark on it).
                    raise PoolPausedError(
                        f"{what}: not resized: the MachineDeployment is paused ({paused}): Cluster API applies no "
                        f"size change until it is unpaused. Nothing written; retried once unpaused."
                    )
                if target < live and (remove_node is not None or remove_unregistered):
                    # every attempt: a conflict's retry may find marks that were not there before
                    machines = self._machines(name, can_write)
                    machine = (
                        self._find_unregistered(name, machines, held, can_write, unregistered_min_age_s)
                        if remove_unregistered
                        else self._find_machine(name, machines, str(remove_node))
                    )
                    ours = f"{self.namespace}/{machine['metadata']['name']}"
                    removed = (
                        f"the unregistered Machine {ours}"
                        if remove_unregistered
                        else f"node {remove_node}'s Machine {ours}"
                    )
                    if held is not None:
                        # a conflict's retry: the size is lowered only while the Machine to remove is marked, in the
                        # list this round read (the Cluster Autoscaler's unmark after its own failed write, or a
                        # person, may have taken the mark off since: the MachineSet would pick a Machine itself)
                        if machine["metadata"]["name"] != held:
                            raise MarkedMachineChangedError(
                                f"{what}: not scaled down: {removed} is not the Machine {self.namespace}/{held} this "
                                "call marked (or found marked) before the conflict"
                            )
                        if DELETE_MACHINE_ANNOTATION not in (machine["metadata"].get("annotations") or {}):
                            log.info("%s: the mark on %s was taken off since the last round: marking again", what, ours)
                            marked, found_marked = None, False
                    self._check_way_clear(what, md, machines, machine, removed, target, can_write)
                    if marked is None and not found_marked:
                        held = machine["metadata"]["name"]
                        if DELETE_MACHINE_ANNOTATION in (machine["metadata"].get("annotations") or {}):
                            found_marked = True  # not ours to rewrite, nor to take back
                        else:
                            # asked before ``marked`` is set: a refusal here has placed nothing to leave behind
                            may_write(f"mark Machine {self.namespace}/{machine['metadata']['name']}", can_write)
                            marked = machine  # first: a mark that lands but whose answer is lost is taken back too
                            mark_value = f"{MARK_PREFIX}{format_time(self._clock())}"
                            try:
                                # Only on the Machine as listed (the guard was asked just above, nothing sent since):
                                # a mark placed by someone since is theirs, not overwritten and so never taken back
                                # by us.
                                marked = self._annotate_machine(machine, mark_value, precondition=True)
                            except ConflictError:
                                marked = held = None  # a 409 wrote nothing: look at the Machine again
                                log.info("%s: conflict on the mark, re-reading (%d/%d)", what, attempt + 1,
                                         self.conflict_retries)  # fmt: skip
                                continue
                            # somebody may have marked another Machine since the list: look again before the size
                            machines = self._machines(name, can_write)
                            self._check_way_clear(what, md, machines, machine, removed, target, can_write)
                if marked is not None and target < live:
                    shrink_sent = target
                # The scale subresource shares the MachineDeployment's resourceVersion: a precondition on both.
                body = {
                    "metadata": {"resourceVersion": md["metadata"]["resourceVersion"]},
                    "spec": {"replicas": target},
                }
                try:
                    self._call(
                        what,
                        self._custom.patch_namespaced_custom_object_scale,
                        CAPI_PLURAL,
                        name,
                        body,
                        _content_type=MERGE_PATCH,
                        can_write=can_write,
                    )
                except ConflictError:
                    log.info("%s: conflict, re-reading (%d/%d)", what, attempt + 1, self.conflict_retries)
                    continue
                except (KubeUnavailable, KubeApiError) as exc:
                    # No answer (or a 5xx): the write may have been applied, or may still be; without the mark the
                    # MachineSet would then delete a Machine of its own choosing. The mark stays.
                    if marked is not None and (isinstance(exc, KubeUnavailable) or exc.status >= 500):
                        log.warning("%s: outcome unknown (%s): the delete-machine mark stays", what, exc)
                        self._mark_left(what, marked, "outcome_unknown")
                        marked = None
                    raise
                removing = ""
                if target < live and remove_node is not None:
                    removing = f", removing node {remove_node}"
                elif target < live and remove_unregistered:
                    removing = f", removing unregistered Machine {self.namespace}/{held}"
                log.info(
                    "scaled node pool %s (MachineDeployment %s/%s) to %d%s", pool, self.namespace, name, target,
                    removing,
                )  # fmt: skip
                if target < live:
                    marked = None  # the MachineSet deletes it now: the annotation stays
                return WriteOutcome.WROTE
            raise ConflictError(what, 409, "Conflict", f"still conflicting after {self.conflict_retries} retries")
        except WriteNotAllowed:
            refused = True
            raise
        finally:
            if marked is not None:
                if refused:
                    self._leave_mark(what, marked)
                else:
                    self._take_back_mark(what, name, marked, mark_value, shrink_sent, can_write)

    def _leave_mark(self, what: str, marked: JSON) -> None:
        """The guard refused after this call marked a Machine: the mark stays (taking it back is a write, and a replica
        that may not write sends nothing). It is ours, recorded with its time: the leader's next scale-down of the
        pool clears it once it can no longer matter, or keeps it when it removes that very node."""
        log.warning(
            "%s: not the leader any more: the delete-machine mark on Machine %s/%s stays (taking it back would be a "
            "write); the leader's next scale-down clears it once stale", what, self.namespace,
            marked["metadata"]["name"],
        )  # fmt: skip
        self._mark_left(what, marked, "not_leader")

    def _take_back_mark(
        self,
        what: str,
        name: str,
        marked: JSON,
        value: str,
        shrink_sent: int | None,
        can_write: WriteGuard | None = None,
    ) -> None:
        """After a scale-down that did not go through, take the delete-machine mark back: left behind, it makes the
        next scale-down by anyone (the Cluster Autoscaler, a person) remove this node, busy or not by then. Unless
        the size fell meanwhile (another writer): the MachineSet then deletes a Machine now, and without the mark one
        of its own choosing; when the size cannot be read, the mark stays too. ``can_write`` asked before every read
        and PATCH: refused, the mark stays (``_leave_mark``); the size write's own error is what the caller gets
        either way. ``marked``: the Machine as this call last saw it, ``value``: the mark it wrote."""
        if shrink_sent is not None:
            try:
                size = int((self._get(what, name, can_write).get("spec") or {}).get("replicas") or 0)
            except WriteNotAllowed:
                self._leave_mark(what, marked)
                return
            except PortError as exc:
                log.error("%s: could not tell whether the size fell: the delete-machine mark stays: %s", what, exc)
                self._mark_left(what, marked, "size_unreadable")
                return
            if size <= shrink_sent:
                log.warning("%s: the size fell to %d meanwhile: the delete-machine mark stays", what, size)
                self._mark_left(what, marked, "size_fell")
                return
        try:
            self._unmark_if_ours(what, marked, value, can_write)
        except WriteNotAllowed:
            self._leave_mark(what, marked)
        except PortError as exc:
            log.error("%s: could not take back the delete-machine annotation: %s", what, exc)
            self._mark_left(what, marked, "unmark_failed")

    def _unmark_if_ours(self, what: str, machine: JSON, value: str, can_write: WriteGuard | None) -> None:
        """Remove our mark only while the Machine is as last seen (resourceVersion precondition). On a 409 it is read
        again: the mark still ``value`` (the Machine controller's own updates change the resourceVersion too), tried
        again; another value (the Cluster Autoscaler or a person re-marked it for their own scale-down) or no mark,
        left alone: removing theirs would make their decrease delete a Machine of the MachineSet's choosing."""
        machine_name = machine["metadata"]["name"]
        full = f"{self.namespace}/{machine_name}"
        for _ in range(self.conflict_retries + 1):
            try:
                self._annotate_machine(machine, None, precondition=True, can_write=can_write)
                return
            except ConflictError:
                pass
            except KubeApiError as exc:
                # deleted since (a person, a MachineHealthCheck, the MachineSet): its mark went with it; reported as
                # a failed take-back it read as a mark left behind that would delete a busy node
                if exc.status != 404:
                    raise
                log.info("%s: Machine %s is gone: no delete-machine mark to take back", what, full)
                return
            try:
                machine = self._read(
                    f"read Machine {full}", self._custom.get_namespaced_custom_object, MACHINE_PLURAL, machine_name,
                    can_write=can_write,
                )  # fmt: skip
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
                log.info("%s: Machine %s is gone: no delete-machine mark to take back", what, full)
                return
            found = (machine["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION)
            if found is None:
                log.info("%s: Machine %s carries no delete-machine mark: nothing to take back", what, full)
                return
            if found != value:
                log.warning(
                    "%s: the delete-machine mark on Machine %s is not ours any more (%r): left as it is", what, full,
                    found,
                )  # fmt: skip
                return
        raise ConflictError(
            f"unmark Machine {full} for deletion", 409, "Conflict",
            f"still conflicting after {self.conflict_retries} retries",
        )  # fmt: skip


def _our_mark_time(machine: JSON) -> float | None:
    """When we placed the Machine's delete-machine mark, or None when it is not ours: our record annotation must
    agree with the mark (a mark written before the record existed, ``gpu-autoscaler <time>`` alone, is ours too)."""
    annotations = (machine.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(DELETE_MACHINE_ANNOTATION)
    record = annotations.get(MARKED_BY_ANNOTATION)
    if not isinstance(value, str) or not value.startswith(MARK_PREFIX) or record not in (None, value):
        return None
    return parse_time(value[len(MARK_PREFIX) :])


def _provider_id(node: JSON) -> str | None:
    provider_id = (node.get("spec") or {}).get("providerID")
    return str(provider_id) if provider_id else None


def _age_key(machine: JSON) -> tuple[float, str]:
    """Oldest first: ``metadata.creationTimestamp`` (a Machine without one, which an apiserver never serves, last),
    then the name."""
    meta = machine.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    return (created if created is not None else float("inf"), str(meta.get("name")))


def _settled(md: JSON) -> bool:
    """The MachineDeployment's controller has seen its latest spec and has as many Machines as it asks for: no
    scale-down is under way that a delete-machine mark could still steer."""
    meta, spec, status = md.get("metadata") or {}, md.get("spec") or {}, md.get("status") or {}
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if not isinstance(generation, int) or not isinstance(observed, int) or observed < generation:
        return False
    return int(status.get("replicas") or 0) == int(spec.get("replicas") or 0)


def _machine_set_of(machine: JSON) -> str | None:
    """The MachineSet a Machine belongs to: its controller owner reference, else its set-name label."""
    meta = machine.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == "MachineSet" and r.get("name")]
    controller = [r for r in refs if r.get("controller")]
    if controller or refs:
        return str((controller or refs)[0]["name"])
    label = (meta.get("labels") or {}).get(MACHINE_SET_NAME_LABEL)
    return str(label) if label else None


def _paused(md: JSON) -> str | None:
    """Why the MachineDeployment is paused, or None. The annotation is its own; a paused Cluster (spec.paused) shows
    only in the Paused condition Cluster API 1.9+ writes on the MachineDeployment (``status.v1beta2.conditions`` of
    v1beta1 objects, ``status.conditions`` of v1beta2 ones): reading the Cluster would need another request and
    another permission. Older Cluster API writes no such condition: a paused Cluster then goes unseen."""
    meta, status = md.get("metadata") or {}, md.get("status") or {}
    if PAUSED_ANNOTATION in (meta.get("annotations") or {}):
        return f"annotation {PAUSED_ANNOTATION}"
    for conditions in (status.get("conditions"), (status.get("v1beta2") or {}).get("conditions")):
        for condition in conditions or []:
            if not isinstance(condition, dict) or condition.get("type") != PAUSED_CONDITION:
                continue
            if condition.get("status") == "True":
                detail = condition.get("message") or condition.get("reason") or "its Cluster's spec.paused"
                return f"condition {PAUSED_CONDITION}: {detail}"
    return None


def _bounds(md: JSON, warned: set[tuple[str, str, str]] | None = None) -> tuple[int | None, int | None]:
    """(min, max) from the Cluster Autoscaler annotations, None where unset or not an integer (that bound is not
    applied). ``warned``: the (MachineDeployment, annotation, value) already logged, so that a bad value read every
    tick is logged once, and again once it changes or comes back after a valid one."""
    annotations = (md.get("metadata") or {}).get("annotations") or {}

    def parse(key: str) -> int | None:
        value = annotations.get(key)
        try:
            bound = int(value) if value is not None else None
        except ValueError:
            seen = (str(md["metadata"].get("name")), key, str(value))
            if warned is None or seen not in warned:
                log.warning(
                    "MachineDeployment %s: annotation %s=%r is not an integer: ignored (this bound is not applied)",
                    *seen[:2], value,
                )  # fmt: skip
                if warned is not None:
                    warned.add(seen)
            return None
        if warned:
            # read fine (or unset): a bad value set again later is logged again
            name = str(md["metadata"].get("name"))
            warned.difference_update({w for w in warned if w[:2] == (name, key)})
        return bound

    return parse(MIN_SIZE_ANNOTATION), parse(MAX_SIZE_ANNOTATION)


# ---- provider registry: node-pool back-ends by name (a cloud provider plug-in registers itself here) ------------

NodePoolFactory = Callable[..., NodePoolScaler]
_PROVIDERS: dict[str, NodePoolFactory] = {"clusterapi": MachineDeploymentNodePools}


def register_node_pool_provider(name: str, factory: NodePoolFactory) -> None:
    _PROVIDERS[name] = factory


def node_pool_providers() -> tuple[str, ...]:
    return tuple(sorted(_PROVIDERS))


def make_node_pool_scaler(provider: str, *args: Any, **kwargs: Any) -> NodePoolScaler:
    """``make_node_pool_scaler("clusterapi", api_client, namespace="capi-system")``."""
    try:
        factory = _PROVIDERS[provider]
    except KeyError:
        known = ", ".join(node_pool_providers())
        raise ValueError(f"unknown node pool provider {provider!r} (known: {known})") from None
    return factory(*args, **kwargs)
