"""ClusterWriter over the Kubernetes API, plus status updates of GPUScalingPolicy objects.

Every write is idempotent and optimistic, and says what it did (``WriteOutcome``, ``EvictionOutcome``):
- read the object fresh, stop if it is already as wanted (no write, no resourceVersion bump): ``ALREADY``; an
  object that does not exist (404; for a pod, one of its name with another uid) is ``GONE``, also nothing written;
  only a change sent and accepted is ``WROTE`` / ``EVICTED``, and only that one gets an Event from the actuator;
- a scale carries the replicas its decision was made from (``expected_replicas``): when the live value differs,
  somebody else changed it since the tick read it, and nothing is written (``ChangedSinceRead``; the next tick
  decides on fresh data), so a conflict can never turn a scale-up into a scale-down or the reverse;
- every request that changes something first asks the caller's ``can_write`` guard (the leadership check): the
  reads before a write may retry for longer than the Lease lasts, so the question asked before the call began is
  not enough; a refusal raises ``WriteNotAllowed`` and sends nothing;
- write with the ``resourceVersion`` just read as a precondition; a 409 means someone wrote in between, so read
  again and decide again, a bounded number of times (``ConflictError`` after that);
- never blindly retry a write that failed otherwise (5xx, timeout): it may have happened. The caller gets a
  ``PortError`` and the next tick re-applies the same absolute target, which is safe because writes are idempotent.
  (The official client never retries a PATCH itself either.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client

from autoscaler.adapters.kubernetes._api import (
    JSON,
    MERGE_PATCH,
    ConflictError,
    KubeApiError,
    UnsupportedWorkloadError,
    call_json,
    format_micro_time,
    format_time,
    may_write,
    with_read_retries,
)
from autoscaler.adapters.kubernetes.reader import (
    DELETION_COST_BY_ANNOTATION,
    POD_DELETION_COST_ANNOTATION,
    suspended_by_us_at,
)
from autoscaler.adapters.kubernetes.status import StatusUpdate, merge_status
from autoscaler.adapters.kubernetes.workloads import (
    OUR_ANNOTATIONS,
    SUSPENDED_AT_ANNOTATION,
    SUSPENDED_BY_ANNOTATION,
    SUSPENDED_BY_VALUE,
    SUSPENDED_GENERATION_ANNOTATION,
    WORKLOAD_KINDS,
    WorkloadKind,
    at_first_served,
    served_first,
)
from autoscaler.core.cluster import DELETION_COST_BY_US
from autoscaler.policy import API_GROUP, API_VERSION, KIND, PLURAL
from autoscaler.ports import (
    ChangedSinceRead,
    EvictionOutcome,
    PortError,
    WriteGuard,
    WriteOutcome,
    refuse_replicas_changed,
)

log = logging.getLogger(__name__)

NOTE_LIMIT = 1024  # events.k8s.io/v1 rejects longer notes


def _default_instance() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclass(frozen=True)
class WriterConfig:
    request_timeout_s: float = 10.0
    conflict_retries: int = 5
    read_retries: int = 2  # for the fresh reads before a write (reads are safe to retry)
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 2.0
    event_api: Literal["events.k8s.io/v1", "v1"] = "events.k8s.io/v1"
    reporting_controller: str = "gpuautoscaler.dev/controller"
    reporting_instance: str = ""  # default: POD_NAME, else the hostname
    eviction_grace_period_s: int | None = None  # None: the pod's own terminationGracePeriodSeconds


# (apiVersion, plural, namespaced) of the objects Events are attached to; kinds not listed get no uid lookup.
EVENT_TARGETS: dict[str, tuple[str, str, bool]] = {
    "Pod": ("v1", "pods", True),
    "Node": ("v1", "nodes", False),
    "Deployment": ("apps/v1", "deployments", True),
    KIND: (f"{API_GROUP}/{API_VERSION}", PLURAL, True),
    "MachineDeployment": ("cluster.x-k8s.io/v1beta1", "machinedeployments", True),
    **{kind: (f"{w.group}/{w.version}", w.plural, True) for kind, w in WORKLOAD_KINDS.items()},
}


def _get_path(obj: JSON, path: tuple[str, ...]) -> Any:
    node: Any = obj
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _nested(path: tuple[str, ...], value: Any) -> JSON:
    out: JSON = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def _truncate_utf8(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


class KubeClusterWriter:
    """``ClusterWriter`` for a live cluster. ``api_calls`` counts every request it made (for metrics/benchmarks)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        config: WriterConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config or WriterConfig()
        self._apps = client.AppsV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._events = client.EventsV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._clock = clock
        self._sleep = sleep
        self._uids: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._served_versions: dict[str, str] = {}  # workload kind -> the version its objects were last read at
        self.api_calls = 0
        self.instance = self.config.reporting_instance or _default_instance()

    # -- helpers --

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        self.api_calls += 1
        return call_json(what, fn, *args, timeout_s=self.config.request_timeout_s, **kwargs)

    def _read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        cfg = self.config
        return with_read_retries(
            what,
            lambda: self._call(what, fn, *args, **kwargs),
            retries=cfg.read_retries,
            backoff_s=cfg.retry_backoff_s,
            max_backoff_s=cfg.max_backoff_s,
            sleep=self._sleep,
        )

    def _remember_uid(self, kind: str, namespace: str, name: str, obj: JSON) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if uid:
            self._cache_uid((kind, namespace, name), uid)

    def _cache_uid(self, key: tuple[str, str, str], uid: str) -> None:
        self._uids[key] = uid
        self._uids.move_to_end(key)
        while len(self._uids) > 4096:
            self._uids.popitem(last=False)

    def _forget_uid(self, kind: str, namespace: str, name: str) -> None:
        """Remember that the object is gone (uid unknown for good): later Events skip the lookup. A pod recreated
        under the same name (StatefulSet) gets Events without uid until the entry ages out of the LRU cache."""
        self._cache_uid((kind, namespace, name), "")

    def _read_modify_write(
        self,
        what: str,
        read: Callable[[], JSON],
        decide: Callable[[JSON], JSON | None],
        write: Callable[[JSON], JSON],
        can_write: WriteGuard | None = None,
    ) -> bool:
        """Fresh read -> ``decide`` (None = already as wanted; it may raise to refuse) -> the guard -> conditional
        write; 409 -> again (bounded). The guard is asked before every write, the retried ones included.

        Returns True when something was written.
        """
        for attempt in range(self.config.conflict_retries + 1):
            current = read()
            body = decide(current)
            if body is None:
                return False
            may_write(what, can_write)
            try:
                write(body)
                return True
            except ConflictError:
                log.info("%s: conflict, re-reading (%d/%d)", what, attempt + 1, self.config.conflict_retries)
        raise ConflictError(what, 409, "Conflict", f"still conflicting after {self.config.conflict_retries} retries")

    # -- ClusterWriter --

    def scale_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        *,
        expected_replicas: int | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """Set ``spec.replicas`` through the scale subresource (what ``kubectl scale`` and the HPA use): ``WROTE``;
        ``ALREADY`` when a fresh read (the first, or the one after a 409) already shows ``replicas``: nothing written;
        ``GONE`` when the Deployment does not exist (404: deleted since the tick read it).

        ``expected_replicas``: the replicas the decision was made from. Every fresh read (the first one and the one
        after each 409) must still show them, or nothing is written and ``ChangedSinceRead`` is raised: a concurrent
        ``kubectl scale`` to 10 between the tick's read of 4 and our write of 5 must not become 10 -> 5. Without it,
        the target is written whatever the live value is (the old contract, for callers that decide on their own).
        ``can_write``: asked immediately before every PATCH (``WriteNotAllowed`` when it says no)."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        what = f"scale deployment {namespace}/{name} to {replicas}"

        def read() -> JSON:
            scale = self._read(what, self._apps.read_namespaced_deployment_scale, name, namespace)
            self._remember_uid("Deployment", namespace, name, scale)  # a Scale carries its parent's uid
            return scale

        def decide(scale: JSON) -> JSON | None:
            # autoscaling/v1 ScaleSpec.replicas is omitempty: an absent field is 0.
            live = (scale.get("spec") or {}).get("replicas", 0)
            if live == replicas:
                return None
            refuse_replicas_changed(what, live, expected_replicas)
            rv = scale["metadata"]["resourceVersion"]
            return {"metadata": {"resourceVersion": rv}, "spec": {"replicas": replicas}}

        def write(body: JSON) -> JSON:
            return self._call(
                what, self._apps.patch_namespaced_deployment_scale, name, namespace, body, _content_type=MERGE_PATCH
            )

        try:
            written = self._read_modify_write(what, read, decide, write, can_write)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            log.info("%s: no such Deployment: nothing written", what)
            self._forget_uid("Deployment", namespace, name)
            return WriteOutcome.GONE
        if not written:
            log.info("%s: already at %d replicas: nothing written", what, replicas)
            return WriteOutcome.ALREADY
        log.info("scaled deployment %s/%s to %d replicas", namespace, name, replicas)
        return WriteOutcome.WROTE

    def evict_pod(
        self,
        namespace: str,
        name: str,
        *,
        dry_run: bool = False,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> EvictionOutcome:
        """POST a policy/v1 Eviction: PodDisruptionBudgets are enforced by the API server, not by us. ``dry_run``:
        the API server checks the budgets and changes nothing (``deleteOptions.dryRun: [All]``). ``can_write``:
        asked immediately before the POST (``WriteNotAllowed`` when it says no).

        ``uid``: sent as the eviction's uid precondition. A pod of that name with another uid (a StatefulSet, JobSet
        or PyTorchJob successor) makes the API server answer 409 Conflict ("the UID in the precondition ... does not
        match the UID in record"): the pod is read to tell that from any other conflict, and a successor (or no pod
        at all by then) is ``GONE``; the same uid is an error. 404: ``GONE``, already gone."""
        body: JSON = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: JSON = {}
        if self.config.eviction_grace_period_s is not None:
            options["gracePeriodSeconds"] = self.config.eviction_grace_period_s
        if dry_run:
            options["dryRun"] = ["All"]
        if uid:
            options["preconditions"] = {"uid": uid}  # a successor of the same name is not the pod the plan meant
        if options:
            body["deleteOptions"] = options
        what = f"evict pod {namespace}/{name}" + (" (dry run)" if dry_run else "")
        may_write(what, can_write)
        try:
            self._call(what, self._core.create_namespaced_pod_eviction, name, namespace, body)
        except KubeApiError as exc:
            if exc.status == 404:
                self._forget_uid("Pod", namespace, name)
            if exc.status == 429:
                # A PodDisruptionBudget (or API throttling) says "not now": nothing happened, try another tick.
                log.info("eviction of %s/%s blocked: %s", namespace, name, exc.message)
                return EvictionOutcome.BLOCKED
            if exc.status == 404:
                return EvictionOutcome.GONE  # already gone: what we wanted, and why a repeated eviction is safe
            if exc.status == 409 and uid:
                live = self._live_pod_uid(what, namespace, name)
                if live != uid:
                    # the uid precondition failed: the pod meant has gone, a successor holds its name (or none)
                    log.info(
                        "eviction of %s/%s not made: the pod of uid %s is gone (%s)", namespace, name, uid,
                        f"a new pod of that name has uid {live}" if live else "no pod of that name now",
                    )  # fmt: skip
                    return EvictionOutcome.GONE
            raise
        if dry_run:
            return EvictionOutcome.EVICTED  # it would be: nothing changed
        # The pod is going: an Event on it must not cost a GET that can only answer 404 (no uid, no describe).
        self._forget_uid("Pod", namespace, name)
        return EvictionOutcome.EVICTED

    def disruptions_allowed(self, namespace: str) -> dict[str, int]:
        """Every PodDisruptionBudget of ``namespace`` -> its ``status.disruptionsAllowed`` now (one list, with the
        read retries; the Role lists them already for the snapshot). A budget without a status yet allows none."""
        what = f"list poddisruptionbudgets in {namespace}"
        listed = self._read(what, self._policy.list_namespaced_pod_disruption_budget, namespace)
        out: dict[str, int] = {}
        for item in listed.get("items") or []:
            name = (item.get("metadata") or {}).get("name")
            allowed = (item.get("status") or {}).get("disruptionsAllowed")
            if isinstance(name, str):
                out[name] = allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0
        return out

    def _live_pod_uid(self, what: str, namespace: str, name: str) -> str | None:
        """The uid of the pod of that name now (remembered for its Events), or None when there is none."""
        try:
            pod = self._read(f"{what}: read the pod after a conflict", self._core.read_namespaced_pod, name, namespace)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            self._forget_uid("Pod", namespace, name)
            return None
        self._remember_uid("Pod", namespace, name, pod)
        return (pod.get("metadata") or {}).get("uid") or None

    def _workload_kind(self, verb: str, kind: str, namespace: str, name: str) -> WorkloadKind:
        spec = WORKLOAD_KINDS.get(kind)
        if spec is None:
            raise UnsupportedWorkloadError(
                f"{verb} {kind} {namespace}/{name}: not suspendable through its spec "
                f"(supported: {', '.join(sorted(WORKLOAD_KINDS))}); evict its pods instead"
            )
        return spec

    def _write_workload(
        self,
        what: str,
        kind: str,
        namespace: str,
        name: str,
        decide: Callable[[JSON], JSON | None],
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """Read-modify-write of a workload's spec by merge patch (resourceVersion precondition, 409 -> again):
        ``WROTE``, or ``ALREADY`` when ``decide`` finds nothing to write; 404 is ``GONE`` (a deleted workload uses no
        GPUs, and there is nothing to suspend or resume)."""
        spec = WORKLOAD_KINDS[kind]
        read_at = [spec.version]  # the version of the last read: the patch is sent at the same one

        def read() -> JSON:
            if kind == "Job":
                obj = self._read(what, self._batch.read_namespaced_job, name, namespace)
            else:
                read_at[0], obj = self._read_served(what, kind, spec, namespace, name)
            self._remember_uid(kind, namespace, name, obj)
            return obj

        def patch(body: JSON) -> JSON:
            if kind == "Job":
                return self._call(
                    what, self._batch.patch_namespaced_job, name, namespace, body, _content_type=MERGE_PATCH
                )
            return self._call(
                what,
                self._custom.patch_namespaced_custom_object,
                spec.group,
                read_at[0],
                namespace,
                spec.plural,
                name,
                body,
                _content_type=MERGE_PATCH,
            )

        try:
            written = self._read_modify_write(what, read, decide, patch, can_write)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            log.info("%s: no such workload: nothing written", what)  # a deleted workload uses no GPUs
            return WriteOutcome.GONE
        return WriteOutcome.WROTE if written else WriteOutcome.ALREADY

    def _read_served(self, what: str, kind: str, spec: WorkloadKind, namespace: str, name: str) -> tuple[str, JSON]:
        """(version, object): the custom workload read at the first of its versions that has it (the one that
        answered last time first). A 404 is a version not served (Kueue >= 0.20 serves no v1beta1) or no such
        object, and the next version is tried; the last 404 is raised when none has it."""
        version, obj = at_first_served(
            served_first(spec, self._served_versions.get(kind)),
            lambda v: self._read(
                what, self._custom.get_namespaced_custom_object, spec.group, v, namespace, spec.plural, name
            ),
        )
        self._served_versions[kind] = version
        return version, obj

    def suspend_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """Suspend a Job / JobSet / PyTorchJob / TFJob (``suspend: true``) or deactivate a Kueue Workload: ``WROTE``.

        The same merge patch marks it as ours (``gpuautoscaler.dev/suspended-by``, ``-at``, ``-generation``): only
        a workload so marked is ever resumed by this controller. One already suspended (by anyone) is left as it is,
        unmarked: we did not suspend it (``ALREADY``). No such workload: ``GONE``."""
        spec = self._workload_kind("suspend", kind, namespace, name)

        def decide(obj: JSON) -> JSON | None:
            if _get_path(obj, spec.path) == spec.suspended_value:
                return None
            meta = obj.get("metadata") or {}
            annotations = {
                SUSPENDED_BY_ANNOTATION: SUSPENDED_BY_VALUE,
                SUSPENDED_AT_ANNOTATION: format_time(self._clock()),
                SUSPENDED_GENERATION_ANNOTATION: None,
            }
            generation = meta.get("generation")
            if isinstance(generation, int) and not isinstance(generation, bool):
                # A spec change bumps metadata.generation by one: the generation this very patch produces.
                annotations[SUSPENDED_GENERATION_ANNOTATION] = str(generation + 1)
            body = _nested(spec.path, spec.suspended_value)
            body["metadata"] = {"resourceVersion": meta["resourceVersion"], "annotations": annotations}
            return body

        what = f"suspend {kind} {namespace}/{name}"
        outcome = self._write_workload(what, kind, namespace, name, decide, can_write)
        if outcome is WriteOutcome.WROTE:
            log.info("suspended %s %s/%s", kind, namespace, name)
        elif outcome is WriteOutcome.ALREADY:
            log.info("%s: already suspended: nothing written", what)
        return outcome

    def resume_workload(
        self, kind: str, namespace: str, name: str, *, can_write: WriteGuard | None = None
    ) -> WriteOutcome:
        """Undo ``suspend_workload``: ``suspend: false`` (Kueue: ``active: true``) and our annotations removed, in
        one merge patch: ``WROTE``. Idempotent: a running workload is ``ALREADY`` (not written, unless a stale mark
        of ours is still on it: that is removed, and it is still ``ALREADY``: the resume changed nothing). No such
        workload: ``GONE``. Suspended, but not by us now: nothing written, ``ChangedSinceRead``."""
        spec = self._workload_kind("resume", kind, namespace, name)
        what = f"resume {kind} {namespace}/{name}"
        cleanup_only = [False]  # what the last decide wrote: only our stale mark off a running workload

        def decide(obj: JSON) -> JSON | None:
            meta = obj.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            ours = [key for key in OUR_ANNOTATIONS if key in annotations]
            suspended = _get_path(obj, spec.path) == spec.suspended_value
            if not suspended and not ours:
                return None
            if suspended and suspended_by_us_at(annotations, meta.get("generation")) is None:
                # Suspended, but not (or no longer) by us: without a mark (a queue such as Kueue, a person), or with
                # one older than its spec (resumed and suspended again by hand since). As suspend leaves a workload
                # somebody else suspended alone, resume does: the tick decided from an older read.
                raise ChangedSinceRead(
                    f"{what}: not resumed: it is suspended, not by this controller now (unmarked, or suspended again "
                    "since our suspension); the next tick decides on fresh data"
                )
            cleanup_only[:] = [not suspended]
            body: JSON = _nested(spec.path, spec.resumed_value) if suspended else {}
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
            if ours:
                body["metadata"]["annotations"] = dict.fromkeys(ours)  # merge patch: null removes the key
            return body

        outcome = self._write_workload(what, kind, namespace, name, decide, can_write)
        if outcome is WriteOutcome.WROTE and cleanup_only[0]:
            log.info("%s: already running: only our stale suspension mark was removed", what)
            return WriteOutcome.ALREADY
        if outcome is WriteOutcome.WROTE:
            log.info("resumed %s %s/%s", kind, namespace, name)
        elif outcome is WriteOutcome.ALREADY:
            log.info("%s: already running: nothing written", what)
        return outcome

    def set_pod_deletion_cost(
        self,
        namespace: str,
        name: str,
        cost: int | None,
        *,
        uid: str | None = None,
        can_write: WriteGuard | None = None,
    ) -> WriteOutcome:
        """Mark a replica for its Deployment's scale-down: ``controller.kubernetes.io/pod-deletion-cost`` set to
        ``cost`` and ``gpuautoscaler.dev/deletion-cost-by: gpu-autoscaler`` beside it, in one JSON merge patch of the
        pod's metadata; ``cost`` None removes both (only from a pod that carries our mark). ``WROTE``; already so:
        ``ALREADY``.

        The patch carries the ``resourceVersion`` just read (409: read and decide again) and the ``uid``: a pod of
        that name with another uid (recreated since the tick read it), or none (404), is ``GONE``, nothing written. A
        cost on the pod that somebody else set (no mark of ours beside it: a person's, another tool's) is never
        overwritten nor removed: ``ChangedSinceRead``. ``can_write``: asked immediately before every PATCH. The
        ValidatingAdmissionPolicy (deploy/base/admissionpolicy.yaml) lets the controller change these two
        annotations of a pod and nothing else."""
        value = None if cost is None else str(int(cost))
        what = (
            f"remove the deletion-cost mark of pod {namespace}/{name}"
            if value is None
            else f"mark pod {namespace}/{name} with pod-deletion-cost {value}"
        )
        gone = [False]

        def read() -> JSON:
            return self._read(what, self._core.read_namespaced_pod, name, namespace)

        def decide(pod: JSON) -> JSON | None:
            meta = pod.get("metadata") or {}
            if uid and meta.get("uid") != uid:
                gone[0] = True
                return None
            annotations = meta.get("annotations") or {}
            ours = annotations.get(DELETION_COST_BY_ANNOTATION) == DELETION_COST_BY_US
            if POD_DELETION_COST_ANNOTATION in annotations and not ours:
                raise ChangedSinceRead(
                    f"{what}: not written: the pod carries a deletion cost somebody else set "
                    f"({annotations.get(POD_DELETION_COST_ANNOTATION)!r}); the next tick decides on fresh data"
                )
            if value is None:
                if not ours and DELETION_COST_BY_ANNOTATION not in annotations:
                    return None
                wanted: dict[str, str | None] = dict.fromkeys(
                    (POD_DELETION_COST_ANNOTATION, DELETION_COST_BY_ANNOTATION)
                )  # merge patch: null removes the key
            else:
                if ours and annotations.get(POD_DELETION_COST_ANNOTATION) == value:
                    return None
                wanted = {POD_DELETION_COST_ANNOTATION: value, DELETION_COST_BY_ANNOTATION: DELETION_COST_BY_US}
            body_meta: JSON = {"resourceVersion": meta["resourceVersion"], "annotations": wanted}
            if uid:
                body_meta["uid"] = uid  # immutable: a patch reaching another pod of that name is refused
            return {"metadata": body_meta}

        def write(body: JSON) -> JSON:
            return self._call(what, self._core.patch_namespaced_pod, name, namespace, body, _content_type=MERGE_PATCH)

        try:
            written = self._read_modify_write(what, read, decide, write, can_write)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            log.info("%s: no such pod: nothing written", what)
            return WriteOutcome.GONE
        if gone[0]:
            log.info("%s: not written: a new pod of that name holds another uid than %s", what, uid)
            return WriteOutcome.GONE
        if not written:
            log.info("%s: already so: nothing written", what)
            return WriteOutcome.ALREADY
        log.info("%s: done", what)
        return WriteOutcome.WROTE

    def emit_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        event_type: str = "Normal",
        *,
        action: str | None = None,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> None:
        """An Event on the object, deduplicated: the same (object, reason, message, type) bumps the existing Event's
        series count instead of creating another, like client-go's recorder. ``can_write``: asked immediately
        before the POST and before the PATCH of a bump (``WriteNotAllowed`` when it says no). ``uid``: the uid of
        the object meant (the pod a plan evicted): written into ``regarding``/``involvedObject`` as given, so the
        Event never attaches to another object of that name (a successor pod); part of the Event's identity, so a
        successor's own Event is another series. None: the uid looked up by name (best effort)."""
        api_version, _, namespaced = EVENT_TARGETS.get(kind, ("v1", "", True))
        event_ns = namespace if namespaced and namespace else "default"  # cluster-scoped objects: "default"
        identity = (kind, namespace, name, reason, message, event_type) + ((uid,) if uid else ())
        if not uid:
            uid = self._uid(kind, namespace if namespaced else "", name)
        now = self._clock()
        digest = hashlib.sha256("\x00".join(identity).encode()).hexdigest()[:16]
        # An RFC 1123 subdomain: a name cut at 200 characters can end in "-" or ".", and "x-.digest" or "x..digest"
        # is refused (422) on every Event of that object. Object names start with an alphanumeric character.
        event_name = f"{name[:200].rstrip('-.')}.{digest}"
        ref: JSON = {"apiVersion": api_version, "kind": kind, "name": name}
        if namespaced:
            ref["namespace"] = namespace
        if uid:
            ref["uid"] = uid
        reason = reason[:128]
        note = _truncate_utf8(message, NOTE_LIMIT)
        what = f"event {reason} on {kind} {namespace}/{name}"
        if self.config.event_api == "events.k8s.io/v1":
            body: JSON = {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": event_name, "namespace": event_ns},
                "eventTime": format_micro_time(now),
                "reportingController": self.config.reporting_controller,
                "reportingInstance": self.instance[:128],
                "action": (action or reason)[:128],
                "reason": reason,
                "note": note,
                "type": event_type,
                "regarding": ref,
            }
            create_fn: Callable[..., Any] = self._events.create_namespaced_event
        else:
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": event_name, "namespace": event_ns},
                "involvedObject": ref,
                "reason": reason,
                "message": note,
                "type": event_type,
                "action": (action or reason)[:128],
                "source": {"component": self.config.reporting_controller},
                "reportingComponent": self.config.reporting_controller,
                "reportingInstance": self.instance[:128],
                "firstTimestamp": format_time(now),
                "lastTimestamp": format_time(now),
                "count": 1,
            }
            create_fn = self._core.create_namespaced_event
        for attempt in range(2):
            may_write(what, can_write)
            try:
                self._call(what, create_fn, event_ns, body)
                return
            except ConflictError as exc:
                if exc.reason != "AlreadyExists":
                    raise
            try:
                self._bump_event(what, event_ns, event_name, now, can_write)
                return
            except KubeApiError as exc:
                # 404: the Event went away between the 409 and the bump (the API server's Event TTL, a cleanup);
                # this occurrence starts a new one (once: a second disappearance is left to the next call)
                if exc.status != 404 or attempt > 0:
                    raise
                log.info("%s: the Event went away before its count was bumped: creating it again", what)

    def _bump_event(
        self, what: str, namespace: str, name: str, now: float, can_write: WriteGuard | None = None
    ) -> None:
        v1 = self.config.event_api == "events.k8s.io/v1"

        def read() -> JSON:
            if v1:
                return self._read(what, self._events.read_namespaced_event, name, namespace)
            return self._read(what, self._core.read_namespaced_event, name, namespace)

        def decide(event: JSON) -> JSON | None:
            meta = {"resourceVersion": event["metadata"]["resourceVersion"]}
            if v1:
                count = ((event.get("series") or {}).get("count") or 1) + 1
                return {"metadata": meta, "series": {"count": count, "lastObservedTime": format_micro_time(now)}}
            return {"metadata": meta, "count": (event.get("count") or 1) + 1, "lastTimestamp": format_time(now)}

        def write(body: JSON) -> JSON:
            if v1:
                return self._call(
                    what, self._events.patch_namespaced_event, name, namespace, body, _content_type=MERGE_PATCH
                )
            return self._call(what, self._core.patch_namespaced_event, name, namespace, body, _content_type=MERGE_PATCH)

        self._read_modify_write(what, read, decide, write, can_write)

    def _uid(self, kind: str, namespace: str, name: str) -> str | None:
        """The object's uid, so that ``kubectl describe`` (which selects Events by uid) shows our Events."""
        key = (kind, namespace, name)
        if key in self._uids:
            self._uids.move_to_end(key)
            return self._uids[key] or None
        target = EVENT_TARGETS.get(kind)
        if target is None:
            return None
        api_version, plural, _ = target
        group, _, version = api_version.rpartition("/")
        what = f"read {kind} {namespace}/{name} for its uid"
        typed: dict[str, Callable[[], JSON]] = {
            "Pod": lambda: self._call(what, self._core.read_namespaced_pod, name, namespace),
            "Node": lambda: self._call(what, self._core.read_node, name),
            "Deployment": lambda: self._call(what, self._apps.read_namespaced_deployment, name, namespace),
            "Job": lambda: self._call(what, self._batch.read_namespaced_job, name, namespace),
        }
        try:
            if kind in typed:
                obj = typed[kind]()
            else:
                obj = self._call(
                    what, self._custom.get_namespaced_custom_object, group, version, namespace, plural, name
                )
        except PortError as exc:
            # Best effort: an Event without uid is still listed by `kubectl get events`, just not by describe.
            log.debug("%s: %s (event without uid)", what, exc)
            return None
        self._remember_uid(kind, namespace, name, obj)
        return self._uids.get(key)

    # -- GPUScalingPolicy status --

    def update_policy_status(
        self,
        namespace: str,
        name: str,
        update: StatusUpdate,
        *,
        generation: int | None = None,
        now: float | None = None,
        can_write: WriteGuard | None = None,
        uid: str | None = None,
    ) -> bool:
        """Merge ``update`` into the policy's status through the status subresource; False when nothing changed.

        ``generation``: the ``metadata.generation`` the caller's decision was based on, written as
        ``observedGeneration`` (default: the generation read now). Conditions keep their ``lastTransitionTime``
        unless their status flips. The write is a PUT carrying the resourceVersion just read, so a concurrent writer
        makes it 409 and it is recomputed from a fresh read. ``can_write``: asked immediately before every PUT
        (``WriteNotAllowed`` when it says no). A policy deleted since the tick listed it (404) is False: nothing to
        write, no error.

        ``uid``: the ``metadata.uid`` of the object the update was decided for. A policy deleted and created again
        under its name since then is another object: a read (the first, or a conflict retry's) that finds another
        uid writes nothing and returns False, no error (the next tick reads the new object and writes its own
        status). The PUT carries the uid in its metadata, which the apiserver checks as a precondition (409
        "Precondition failed: UID in precondition" when the object was re-created after the read; the retry's read
        then sees the new uid). None: whatever object has the name, as before.
        """
        when = self._clock() if now is None else now
        what = f"update status of {KIND} {namespace}/{name}"
        found: list[str] = []  # the uid a read found instead of ``uid`` (the object was re-created)

        def replaced(obj: JSON) -> bool:
            live = (obj.get("metadata") or {}).get("uid")
            if uid is None or not live or live == uid:
                return False
            found.append(str(live))
            return True

        def read() -> JSON:
            obj = self._read(
                what, self._custom.get_namespaced_custom_object, API_GROUP, API_VERSION, namespace, PLURAL, name
            )
            self._remember_uid(KIND, namespace, name, obj)
            return obj

        def decide(obj: JSON) -> JSON | None:
            if replaced(obj):
                return None
            current = obj.get("status") or {}
            observed = generation if generation is not None else (obj.get("metadata") or {}).get("generation")
            status = merge_status(current, update, generation=observed, now=when)
            if status == current:
                return None
            body = dict(obj, status=status)
            if uid is not None:
                body["metadata"] = dict(obj.get("metadata") or {}, uid=uid)  # the apiserver's uid precondition
            return body

        def write(body: JSON) -> JSON:
            return self._call(
                what,
                self._custom.replace_namespaced_custom_object_status,
                API_GROUP,
                API_VERSION,
                namespace,
                PLURAL,
                name,
                body,
            )

        try:
            written = self._read_modify_write(what, read, decide, write, can_write)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            # Deleted since the tick listed it (a 404 of the read, or of the PUT after it): no status left to write.
            # A 404 of the status subresource of a live object (a CRD without it) is still an error: ask again.
            try:
                live = read()
            except KubeApiError as again:
                if again.status == 404:
                    log.info("%s: the policy is gone: no status to write", what)
                    return False
            else:
                if replaced(live):  # deleted before the PUT and created again since: the object meant is gone
                    self._log_replaced(what, uid, found[-1])
                    return False
            raise
        if found:
            self._log_replaced(what, uid, found[-1])
        return written

    @staticmethod
    def _log_replaced(what: str, uid: str | None, live: str) -> None:
        log.info(
            "%s: not written: the policy was deleted and created again since it was read (uid %s, now %s); the next "
            "tick reads the new object and writes its status",
            what,
            uid,
            live,
        )
