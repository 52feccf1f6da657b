"""Defect review 39 of applying plans: ``autoscaler/actuator.py`` and ``autoscaler/adapters/kubernetes/writer.py``.

Defects found (each an ``xfail(strict=True)`` test below, with WRONG/RIGHT in its docstring; 2, 3 and 4 fixed in the
same stop, their tests say "Fixed"; 1 was kept as a strict xfail, then fixed too: the plan's evictions name the budgets
covering several of the gang's pods, read fresh before the first eviction):

1. ``Actuator._apply_gang``: a gang's pods are dry-run evicted one at a time. A dry run changes no budget, so a
   PodDisruptionBudget covering several pods of the gang passes each dry run with ``disruptionsAllowed`` 1, and the
   real evictions then stop the first pod and get 429 for the next: the gang is broken (its work is lost, the pods
   left hold their GPUs for a job that cannot progress) although the dry runs were there to prevent exactly that.
2. ``Actuator.event`` (dry run): the dry-run Event memo keys on the whole message, which carries the tick's metric
   value (``gpu_utilization 130 per pod ...``). Real metrics move every tick, so a recommendation that stands
   (2 -> 4, every tick) writes a new Event (a new object: the writer's Event name digests the message) every tick.
3. ``Actuator.event`` / ``_apply_gang``: the evictions that finish a gang during a shutdown go out under
   ``can_finish``, but their Events (on each pod, and the "evicted gang" Event on the service) are asked ``can_act``,
   which a shutdown turns False: a gang evicted then leaves no Event at all, and none is written later.
4. ``forget_unapplied``: a plan naming the same scale twice has it applied once and the repeat ``skipped``
   (``_contradictions``); ``forget_unapplied`` keys "not applied" by Deployment, so the skipped repeat erases the
   scale event of the one that was applied, and the rate policies forget a change that happened.

Pins of right behaviour checked here and not pinned elsewhere: a dry run over the real writer sends no request but
Event POSTs (not even the gang's dry-run evictions, nor a node-pool call); an eviction refused by a budget, then made,
then repeated, is blocked / applied / gone with exactly one Event and one eviction per tick; a budget covering a whole
gang and allowing it is spent by the gang's evictions exactly; an applied action with a very long multi-byte detail
gets an Event the API accepts; every reason's Event reason is a valid CamelCase reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext, event_reason, forget_unapplied
from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.core.cluster import PodInfo
from autoscaler.core.model import (
    Action,
    ControllerState,
    EvictPod,
    ResumeWorkload,
    ScaleDeployment,
    ScaleNodePool,
    ServiceState,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import EvictionOutcome, PortError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.runtime.test_controller import make

NOW = 1_800_000_000.0
NS = "train"
GANG_LABEL = "training.kubeflow.org/job-name"
GANG = f"kubeflow/{NS}/g1"
EVENTS = "events.k8s.io/v1"


# ---- fixtures: the fake API server and a client built as the controller builds it (as tests/kube/conftest.py) ----


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_client(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    api = load_api_client("kubeconfig", apiserver.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield api
    finally:
        api.close()


def kube_writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), clock=lambda: NOW, sleep=lambda s: None)


def uid_of(apiserver: FakeApiServer, name: str) -> str:
    pod = apiserver.get("v1", "Pod", name, NS)
    assert pod is not None
    return str(pod["metadata"]["uid"])


def evictions_sent(apiserver: FakeApiServer) -> list[tuple[str, bool, int]]:
    """(pod, dry run?, status) of every eviction POST, in order."""
    out = []
    for r in apiserver.requests:
        if r.method == "POST" and r.path.endswith("/eviction"):
            dry = (r.body.get("deleteOptions") or {}).get("dryRun") == ["All"] or "dryRun" in r.query
            out.append((r.path.split("/")[-2], dry, r.status))
    return out


def events_about(apiserver: FakeApiServer, kind: str, name: str, namespace: str = NS) -> list[dict[str, Any]]:
    return [
        e
        for e in apiserver.objects(EVENTS, "Event", namespace)
        if (e["regarding"]["kind"], e["regarding"]["name"]) == (kind, name)
    ]


def seed_gang_under_one_budget(apiserver: FakeApiServer, names: list[str], disruptions_allowed: int) -> None:
    """The gang's pods all carry ``app=trainer``, which one PodDisruptionBudget selects."""
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", NS, replicas=1))
    for name in names:
        apiserver.seed(o.pod(name, NS, labels={GANG_LABEL: "g1", "app": "trainer"}))
    apiserver.seed(
        o.pdb("trainer", NS, selector={"app": "trainer"}, disruptions_allowed=disruptions_allowed, current=len(names))
    )


def gang_evictions(apiserver: FakeApiServer, names: list[str]) -> list[Action]:
    """The gang's evictions as the planner writes them: each names the budget covering the gang's pods, and how many
    (``core.arbitrate._stop_actions``, from the victim's ``pdb_use``)."""
    return [
        EvictPod(
            NS, n, Reason.PREEMPT_FOR_INFERENCE, "for train/chat", gang=GANG, service=f"{NS}/chat",
            lost_work_gpu_s=1800.0, uid=uid_of(apiserver, n), budgets=((f"{NS}/trainer", len(names)),),
        )
        for n in names
    ]  # fmt: skip


# ---- defect 1: a budget shared by the gang's pods ----------------------------------------------------------------


def test_a_gang_whose_shared_budget_cannot_cover_it_is_left_running_whole(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail): the budgets covering several pods are read and checked before the first
    eviction.

    WRONG: ``autoscaler/actuator.py`` ``Actuator._apply_gang`` asks each eviction of the gang as a dry run, one pod
    at a time. The API server's dry run checks the pod's PodDisruptionBudget and spends nothing, so two pods under one
    budget with ``disruptionsAllowed: 1`` (it allowed 2 when the tick read it, and the planner's ``pdbs_covering``
    counted both pods against it; since then one disruption was spent elsewhere) both pass. The real evictions then
    evict ``w-0`` (the budget drops to 0) and get 429 for ``w-1``: results ``applied, blocked``, the gang is broken
    -- its work since the checkpoint is lost and ``w-1`` keeps its GPU for a job that cannot progress -- which is what
    the dry runs promise to prevent ("one refused ... and none is made").
    RIGHT: before the first real eviction, check the gang against its budgets as a whole: per PodDisruptionBudget
    read fresh, the pods of the gang it covers must not exceed its ``disruptionsAllowed`` (e.g. a writer method
    that reads the namespace's PDBs at act time); otherwise every pod is ``blocked`` and none is evicted."""
    names = ["w-0", "w-1"]
    seed_gang_under_one_budget(apiserver, names, disruptions_allowed=1)
    results = Actuator(kube_writer(api_client)).apply(gang_evictions(apiserver, names), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["blocked", "blocked"], [(r.result, r.message) for r in results]
    assert [apiserver.get("v1", "Pod", n, NS) is not None for n in names] == [True, True]
    assert not [e for e in evictions_sent(apiserver) if not e[1]]  # no real eviction sent


def test_a_gang_whose_shared_budget_covers_it_is_evicted_whole_and_spends_the_budget_exactly(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The other side of defect 1 (a fix must not refuse this): a budget allowing as many disruptions as it covers
    pods of the gang lets the whole gang go, dry runs first, and the real evictions spend it to 0."""
    names = ["w-0", "w-1"]
    seed_gang_under_one_budget(apiserver, names, disruptions_allowed=2)
    results = Actuator(kube_writer(api_client)).apply(gang_evictions(apiserver, names), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied", "applied"]
    assert [(n, dry) for n, dry, _ in evictions_sent(apiserver)] == [
        ("w-0", True), ("w-1", True), ("w-0", False), ("w-1", False),
    ]  # fmt: skip
    pdb = apiserver.get("policy/v1", "PodDisruptionBudget", "trainer", NS)
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0
    assert [e["reason"] for e in events_about(apiserver, "Deployment", "chat")] == ["PreemptForInference"]


# ---- defect 2: dry-run Events repeated with every tick's numbers ---------------------------------------------------


def test_a_dry_run_recommendation_that_stands_is_one_event_while_its_metric_moves() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/actuator.py`` ``Actuator.apply_one`` writes the dry-run Event through ``Actuator.event``
    with ``topic="action"``, deduplicated on ``reason|message``; the message ends with the decision's detail
    (``gpu_utilization 130 per pod vs target 70 (ratio 1.86)``). A service whose utilisation reads 130, 131, 132 on
    three ticks is recommended the same scale (2 -> 4) each time, yet gets three Events (against the API server,
    three Event objects: the writer's Event name digests the message). Real metrics change every tick: a dry run --
    the README's recommended first install -- writes an Event per recommending service per tick (240 an hour at
    15 s), what the memo exists to prevent ("recommend-only plans repeat every tick and would flood the API").
    RIGHT: deduplicate the dry-run Event on what would be done (``describe_action`` and the reason), not on the
    numbers behind it: the same recommendation is one Event until it changes (the test with a constant utilisation
    in tests/runtime/test_controller.py only shows the memo works when nothing moves)."""
    c, cluster, metrics, _, _ = make(replicas=2, util=130.0, dry_run=True)
    for i, util in enumerate((130.0, 131.0, 132.0)):
        metrics.util["ml/chat"] = util
        plan = c.run_once(NOW + 15 * i)
        assert [(a.previous_replicas, a.replicas) for a in plan.actions if isinstance(a, ScaleDeployment)] == [(2, 4)]
    assert cluster.writes == []
    scaled = [e for e in cluster.events if e["kind"] == "Deployment"]
    assert len(scaled) == 1, [e["message"] for e in scaled]


# ---- defect 3: the Events of a gang finished during a shutdown ------------------------------------------------------


def test_review_setup_a_gang_finished_during_a_shutdown_is_evicted_whole() -> None:
    """The premise of defect 3, right as it is: a shutdown after the gang's first eviction does not leave it half
    evicted (``can_finish``)."""
    cluster, actuator = _shutdown_after_first_eviction()
    results = actuator.apply(_fake_gang_evictions(), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied"] * 3
    assert not cluster.pods


def test_the_events_of_a_gang_finished_during_a_shutdown_are_written() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/actuator.py`` ``Actuator._apply_gang`` makes the evictions that complete a gang under
    ``can_finish`` (leadership without the shutdown: the Lease is still held and released only after the tick), but
    ``Actuator.event`` (through ``apply_one`` -> ``event_for`` and the gang's ``service_event``) asks ``can_act``,
    which the shutdown turned False: the three pods are evicted and reported ``applied``, and not one Event is written
    -- none on the pods, no "evicted gang" Event on the Deployment. ``event`` says "the leader's next tick writes
    it", but nothing re-emits an applied action's Event: the preemption leaves no trace in ``kubectl describe``.
    RIGHT: the Events of writes made under ``can_finish`` are written under ``can_finish`` too (pass the write
    guard used for the action to ``event_for`` / ``service_event``)."""
    cluster, actuator = _shutdown_after_first_eviction()
    results = actuator.apply(_fake_gang_evictions(), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied"] * 3
    assert sorted(e.name for e in cluster.events if e.kind == "Pod") == ["w-0", "w-1", "w-2"]
    assert [e.name for e in cluster.events if e.kind == "Deployment"] == ["chat"]


def _fake_gang_evictions() -> list[Action]:
    return [
        EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang=GANG, service="ml/chat", uid=f"uid-{n}")
        for n in ("w-0", "w-1", "w-2")
    ]


def _shutdown_after_first_eviction() -> tuple[FakeCluster, Actuator]:
    """A FakeCluster whose first real eviction is followed by SIGTERM: ``can_act`` False from then on, the Lease
    still held (``can_finish`` True), as ``Runtime.can_act`` / ``can_finish`` answer during ``stop()``."""
    pods = [PodInfo(NS, n, "gpu-0", 1, 0, "Running", True, gang=GANG, uid=f"uid-{n}") for n in ("w-0", "w-1", "w-2")]
    cluster = FakeCluster(pods=pods)
    cluster.add_deployment("ml", "chat", 2)
    stopping = [False]
    evict = cluster.evict_pod

    def evict_then_stop(namespace: str, name: str, **kwargs: Any) -> EvictionOutcome:
        outcome = evict(namespace, name, **kwargs)
        if not kwargs.get("dry_run"):
            stopping[0] = True
        return outcome

    cluster.evict_pod = evict_then_stop  # type: ignore[method-assign]
    actuator = Actuator(cluster, cluster, can_act=lambda: not stopping[0], can_finish=lambda: True)
    return cluster, actuator


# ---- defect 4: a skipped repeat erases the applied scale's rate event ---------------------------------------------


def test_a_scale_named_twice_keeps_the_scale_event_of_the_one_applied() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/actuator.py`` ``forget_unapplied`` collects the Deployments of every ``ScaleDeployment``
    result that is not ``applied`` and drops their scale events stamped ``now``. A plan naming the same scale twice
    (2 -> 4, twice) is applied once and the repeat is ``skipped`` by ``_contradictions`` ("applied once"); the
    skipped repeat puts ``ml/chat`` in the set, so the scale event of the scale that *was* written is erased: the
    rate policies (and the HPA-like scale-up/down limits) count no change this tick, and the next tick's allowance
    is taken from the new replicas as if none had been made -- up to twice the configured rate. (Reachable only
    through a plan that repeats an action, which ``_contradictions`` exists to absorb; today's ``decide`` makes one
    scale per service.)
    RIGHT: a Deployment whose scale was ``applied`` this tick keeps its event: forget only the Deployments with no
    applied scale in the results (or skip the duplicates ``_contradictions`` marked)."""
    cluster = FakeCluster()
    cluster.add_deployment("ml", "chat", 2)
    scale = ScaleDeployment("ml", "chat", 4, 2, Reason.METRIC_ABOVE_TARGET, "up")
    results = Actuator(cluster, cluster).apply([scale, scale], GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied", "skipped"]
    previous = ControllerState({"ml/chat": ServiceState(scale_events=((NOW - 60, 1),))})
    decided = ControllerState({"ml/chat": ServiceState(scale_events=((NOW - 60, 1), (NOW, 2)))})
    state = forget_unapplied(decided, previous, results, NOW)
    assert state.services["ml/chat"].scale_events == ((NOW - 60, 1), (NOW, 2))


# ---- pins -----------------------------------------------------------------------------------------------------------


class RecordingPools:
    """A node-pool scaler that records every call (none may come in a dry run)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def node_count(self, pool: str) -> int:
        self.calls.append(("node_count", pool))
        return 1

    def scale(self, pool: str, nodes: int, expected: int | None = None, **options: Any) -> None:
        self.calls.append(("scale", pool, nodes, expected))


def test_a_dry_run_over_the_real_writer_sends_nothing_but_event_posts(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Every kind of action in one dry-run plan: the only requests are Event POSTs (the gang's evictions are not even
    dry-run against the API server, no scale read or PATCH, no workload patch, no node-pool call), every result is
    ``dry_run``, and every object is as it was; a second tick of the same plan writes no second Event."""
    names = ["w-0", "w-1"]
    seed_gang_under_one_budget(apiserver, names, disruptions_allowed=2)
    apiserver.seed(o.job("train-a", NS, suspend=False, gpus=1), o.job("train-b", NS, suspend=True, gpus=1))
    pools = RecordingPools()
    plan: list[Action] = [
        ScaleDeployment(NS, "chat", 3, 1, Reason.METRIC_ABOVE_TARGET, "up"),
        *gang_evictions(apiserver, names),
        SuspendWorkload("Job", NS, "train-a", Reason.PREEMPT_FOR_INFERENCE, "for train/chat", f"{NS}/chat"),
        ResumeWorkload("Job", NS, "train-b", Reason.RESUME_TRAINING, "GPUs free again"),
        ScaleNodePool("burst", 2, 1, Reason.BURST_SCALE_UP, "shortfall", services=(f"{NS}/chat",)),
    ]
    apiserver.clear_requests()
    actuator = Actuator(kube_writer(api_client), pools, dry_run=True)  # type: ignore[arg-type]
    for tick in range(2):
        results = actuator.apply(plan, GuardContext(NOW + 15 * tick, {}))
        assert [r.result for r in results] == ["dry_run"] * len(plan)
    sent = {(r.method, r.path.rsplit("/", 1)[-1]) for r in apiserver.requests if r.method != "GET"}
    assert sent == {("POST", "events")}, sent
    assert pools.calls == []
    assert apiserver.get("apps/v1", "Deployment", "chat", NS)["spec"]["replicas"] == 1  # type: ignore[index]
    assert all(apiserver.get("v1", "Pod", n, NS) is not None for n in names)
    assert apiserver.get("batch/v1", "Job", "train-a", NS)["spec"]["suspend"] is False  # type: ignore[index]
    notes = [e["note"] for e in apiserver.objects(EVENTS, "Event", NS)]
    assert len(notes) == 5 and all(n.startswith("[dry-run] would ") for n in notes), notes  # one per object
    assert all(e.get("series") is None for e in apiserver.objects(EVENTS, "Event", NS))  # not even bumped


def test_an_eviction_blocked_then_made_then_repeated_writes_one_eviction_and_one_event(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A rebalance move of one pod, re-planned on three ticks: refused by its budget (429: ``blocked``, no Event, the
    pod stays, one eviction POST, no retry within the tick), allowed (``applied``, one Event carrying its uid), and
    repeated once more (404: ``gone``, no second Event, no error)."""
    apiserver.seed(o.node("gpu-0"), o.pod("chat-0", NS, labels={"app": "chat"}))
    apiserver.seed(o.pdb("chat", NS, selector={"app": "chat"}, disruptions_allowed=0, current=1))
    uid = uid_of(apiserver, "chat-0")
    move = EvictPod(NS, "chat-0", Reason.REBALANCE, "defragment gpu-0", uid=uid)
    errors: list[str] = []
    actuator = Actuator(kube_writer(api_client), on_error=errors.append)

    (first,) = actuator.apply([move], GuardContext(NOW, {}))
    assert first.result == "blocked"
    assert [(n, s) for n, _, s in evictions_sent(apiserver)] == [("chat-0", 429)]
    assert apiserver.get("v1", "Pod", "chat-0", NS) is not None
    assert apiserver.objects(EVENTS, "Event", NS) == []

    pdb = apiserver.get("policy/v1", "PodDisruptionBudget", "chat", NS)
    assert pdb is not None
    apiserver.update_object(dict(pdb, status=dict(pdb["status"], disruptionsAllowed=1)))
    (second,) = actuator.apply([move], GuardContext(NOW + 15, {}))
    assert second.result == "applied"
    assert apiserver.get("v1", "Pod", "chat-0", NS) is None
    (event,) = events_about(apiserver, "Pod", "chat-0")
    assert event["reason"] == "Rebalance" and event["regarding"]["uid"] == uid

    (third,) = actuator.apply([move], GuardContext(NOW + 30, {}))
    assert third.result == "gone"
    assert [(n, s) for n, _, s in evictions_sent(apiserver)] == [("chat-0", 429), ("chat-0", 201), ("chat-0", 404)]
    (again,) = events_about(apiserver, "Pod", "chat-0")
    assert again.get("series") is None  # not written again, not even counted again
    assert errors == []


def test_an_applied_action_with_a_huge_multibyte_detail_gets_an_event_the_api_accepts(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The detail is the planner's free text; the Event's note is cut to the API's 1,024 bytes on a character
    boundary, so the Event is created (not refused with 422 and counted as an event_write error)."""
    apiserver.seed(o.deployment("chat", NS, replicas=2))
    errors: list[str] = []
    scale = ScaleDeployment(NS, "chat", 4, 2, Reason.SLO_BREACH, "latency 🐢 " * 800)
    (result,) = Actuator(kube_writer(api_client), on_error=errors.append).apply([scale], GuardContext(NOW, {}))
    assert result.result == "applied" and errors == []
    (event,) = events_about(apiserver, "Deployment", "chat")
    assert event["reason"] == "SloBreach"
    assert event["note"].startswith(f"Scale deployment/{NS}/chat from 2 to 4: ")
    assert len(event["note"].encode()) <= 1024 and event["note"].endswith("...")


def test_every_reason_is_a_valid_event_reason() -> None:
    """Each reason an action can carry becomes an Event reason the API accepts and ``kubectl`` shows as upstream's
    are: CamelCase letters and digits, at most 128 characters, and two reasons never share one."""
    reasons = {r: event_reason(r) for r in Reason}
    for reason, camel in reasons.items():
        assert camel[:1].isupper() and camel.isalnum() and len(camel) <= 128, (reason, camel)
    assert len(set(reasons.values())) == len(reasons)
    assert event_reason(Reason.PREEMPT_FOR_INFERENCE) == "PreemptForInference"


def test_a_gang_is_left_running_whole_when_its_budgets_cannot_be_read() -> None:
    """The fresh budget read failing is an API error: the gang stays running (``failed``, nothing evicted), never
    half stopped."""
    pods = [PodInfo(NS, n, "gpu-0", 1, 0, "Running", True, gang=GANG, uid=f"uid-{n}") for n in ("w-0", "w-1")]
    cluster = FakeCluster(pods=pods)

    def unreadable(namespace: str) -> dict[str, int]:
        raise PortError("list poddisruptionbudgets: HTTP 503")

    cluster.disruptions_allowed = unreadable  # type: ignore[method-assign]
    evictions = [
        EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang=GANG, uid=f"uid-{n}",
                 budgets=((f"{NS}/trainer", 2),))
        for n in ("w-0", "w-1")
    ]  # fmt: skip
    results = Actuator(cluster, cluster).apply(evictions, GuardContext(NOW, {}))
    assert [r.result for r in results] == ["failed", "failed"]
    assert "could not be read" in results[0].message
    assert not [w for w in cluster.writes if w.op == "evict_pod"]


def test_a_budget_covering_one_pod_of_the_gang_is_left_to_its_dry_run() -> None:
    """Only a budget covering several of the gang's pods is read: one pod's budget is what the dry run checks."""
    pods = [PodInfo(NS, n, "gpu-0", 1, 0, "Running", True, gang=GANG, uid=f"uid-{n}") for n in ("w-0", "w-1")]
    cluster = FakeCluster(pods=pods)
    reads: list[str] = []
    cluster.disruptions_allowed = lambda namespace: reads.append(namespace) or {}  # type: ignore[method-assign]
    evictions = [
        EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "for ml/chat", gang=GANG, uid=f"uid-{n}",
                 budgets=((f"{NS}/one", 1),))
        for n in ("w-0", "w-1")
    ]  # fmt: skip
    results = Actuator(cluster, cluster).apply(evictions, GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied", "applied"] and reads == []
