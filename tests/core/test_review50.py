"""Review of stop 50 (a running pod's own required anti-affinity in the symmetric check, ``PodInfo.anti_affinity``).

The rule ``core.cluster.anti_affinity_barred`` states: a pod whose own terms were read is judged by them, whoever owns
it, and its Deployment's template only when they were not read (None). Every other place that applies the symmetric
check must say the same.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.cluster import (
    HOSTNAME_LABEL,
    ClusterSnapshot,
    DeploymentInfo,
    PodAntiAffinityTerm,
    PodInfo,
    WorkloadInfo,
    anti_affinity_barred,
    pods_with_own_anti_affinity,
)
from autoscaler.core.rebalance import RebalanceConfig, _Cluster
from tests.core.test_pod_anti_affinity import (
    AWAY_FROM_CODE,
    CODE,
    CODE_LABELS,
    CODE_POLICY,
    NOW,
    PLAIN,
    _gang,
    _node,
    _replica,
    _snapshot,
    stopped_for,
)

CHAT_AWAY_FROM_CODE = replace(PLAIN, anti_affinity=(AWAY_FROM_CODE,))


def _code_pod(node: str) -> PodInfo:
    return replace(_replica(5, node), name="code-5", owner_name="code", labels=CODE_LABELS)


# -- the rebalancer: a landing pod of a Deployment is judged by its own terms where they were read -------------------


@pytest.mark.parametrize(
    ("chat", "own_terms", "code_kept_off_n3"),
    [
        pytest.param(PLAIN, None, False, id="not read, the template keeps nothing"),
        pytest.param(CHAT_AWAY_FROM_CODE, None, True, id="not read, the template keeps code away"),
        pytest.param(PLAIN, (AWAY_FROM_CODE,), True, id="read: its own terms keep code away, the template none"),
        pytest.param(CHAT_AWAY_FROM_CODE, (AWAY_FROM_CODE,), True, id="read, same as the template"),
    ],
)  # fmt: skip
def test_a_landing_deployment_pod_keeps_the_replicas_its_own_terms_select_off(
    chat: DeploymentInfo, own_terms: tuple[PodAntiAffinityTerm, ...] | None, code_kept_off_n3: bool
) -> None:
    """A Pending replica of chat (a waiting target) is expected on n3. Its own terms, as read, are the spec it is
    scheduled with (a webhook's, or its ReplicaSet's during a rollout): once bound, kube-scheduler keeps code's next
    replica off n3 by them -- as ``anti_affinity_barred`` counts the running pods' own terms."""
    waiting = replace(_replica(1, None), anti_affinity=own_terms)
    snapshot = replace(_snapshot(waiting, _code_pod("n2")), deployments=(chat, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert cluster.allowed("n3", None, False, [_code_pod("n2")])
    cluster.lands([waiting], ["n3"])
    assert cluster.allowed("n3", None, False, [_code_pod("n2")]) is not code_kept_off_n3


def test_a_landing_deployment_pod_whose_own_terms_were_read_empty_is_judged_by_them() -> None:
    """As ``anti_affinity_barred``: read without terms (``()``) is no term, whatever the template says -- with both
    a running chat pod read so and one landing, code may go on either node."""
    running = replace(_replica(0, "n1"), anti_affinity=())
    snapshot = replace(_snapshot(running, _code_pod("n2")), deployments=(CHAT_AWAY_FROM_CODE, CODE))
    cluster = _Cluster(snapshot, RebalanceConfig())
    assert cluster.allowed("n1", None, False, [_code_pod("n2")]), "the running pod: its own (no) terms"
    cluster.lands([replace(_replica(1, None), anti_affinity=())], ["n3"])
    assert cluster.allowed("n3", None, False, [_code_pod("n2")])


# -- the victim search: a gang whose own pods alone keep the replica off a node opens it when it is stopped ---------

TEAM_ML = {"team": "ml"}
AWAY_FROM_ML = PodAntiAffinityTerm(TEAM_ML, HOSTNAME_LABEL, frozenset({"ml"}))
AWAY_FROM_CODE_BY_ZONE = replace(AWAY_FROM_CODE, topology_key="zone")


def _job(name: str, node: str, gpus: int, age: float, terms: tuple[PodAntiAffinityTerm, ...] | None = None) -> PodInfo:
    return replace(_gang(name, node, gpus, age), labels=TEAM_ML, anti_affinity=terms)


@pytest.mark.parametrize(
    ("code", "pods", "stopped"),
    [
        pytest.param(
            CODE, (_job("cheap", "n1", 7, 60.0), _job("dear", "n2", 8, 3000.0)), {"cheap"},
            id="sanity: no term, the cheaper gang",
        ),
        pytest.param(
            CODE, (_job("cheap", "n1", 7, 60.0, (AWAY_FROM_CODE,)), _job("dear", "n2", 8, 3000.0)), {"cheap"},
            id="its own terms keep code off n1: stopping it opens n1",
        ),
        pytest.param(
            replace(CODE, anti_affinity=(AWAY_FROM_ML,)),
            (_job("cheap", "n1", 7, 60.0), replace(_job("dear", "n2", 8, 3000.0), labels={})), {"cheap"},
            id="code's own term selects it: stopping it opens n1",
        ),
        pytest.param(
            CODE,
            (
                _job("cheap", "n1", 4, 400.0, (AWAY_FROM_CODE,)), _job("mid", "n1", 3, 60.0),
                _job("dear", "n2", 8, 3000.0),
            ),
            {"cheap"}, id="another gang on n1 alone opens nothing: the one keeping code off is stopped",
        ),
        pytest.param(
            CODE,
            (
                _job("cheap", "n1", 4, 60.0, (AWAY_FROM_CODE,)), _job("mid", "n1", 3, 60.0, (AWAY_FROM_CODE,)),
                _job("dear", "n2", 8, 3000.0),
            ),
            {"dear"}, id="two gangs keep code off n1: neither alone opens it (fewer GPUs seen, never more)",
        ),
        pytest.param(
            CODE,
            (
                _job("cheap", "n1", 7, 60.0, (AWAY_FROM_CODE,)),
                replace(_replica(1, "n1"), name="guard", owner_kind="StatefulSet", owner_name="guard",
                        anti_affinity=(AWAY_FROM_CODE,)),
                _job("dear", "n2", 8, 3000.0),
            ),
            {"dear"}, id="a pod no victim keeps code off n1 too: it stays closed",
        ),
        pytest.param(
            CODE,
            (_job("cheap", "n1", 7, 60.0, (AWAY_FROM_CODE_BY_ZONE,)), _job("dear", "n3", 8, 3000.0)), {"cheap"},
            id="a zone term: stopping it opens its zone",
        ),
        pytest.param(
            CODE,
            (
                _job("cheap", "n1", 7, 60.0, (AWAY_FROM_CODE_BY_ZONE,)),
                replace(_job("dear", "n2", 8, 3000.0), anti_affinity=(AWAY_FROM_CODE_BY_ZONE,)),
                _job("far", "n3", 8, 6000.0),
            ),
            {"far"}, id="two gangs keep code off a zone: neither alone opens it",
        ),
    ],
)  # fmt: skip
def test_a_gang_that_alone_keeps_the_replica_off_a_node_may_be_stopped_for_it(
    code: DeploymentInfo, pods: tuple[PodInfo, ...], stopped: set[str]
) -> None:
    """chat-0 (1 GPU) and a gang on n1, other gangs on n2 (zone a) and n3 (zone b); code wants one 1-GPU replica.
    kube-scheduler's preemption judges a node without its victims: a node that only the victim's own pods keep
    code off (their terms selecting code, or code's selecting them) is room once it is stopped -- the cheaper stop,
    as it was before the gangs' own terms were read. A node another pod keeps code off as well stays closed."""
    nodes = (_node("n1", "a"), _node("n2", "a"), _node("n3", "b"))
    gangs = {p.gang.rsplit("/", 1)[-1]: p.gpus for p in pods if p.gang is not None}
    jobs = tuple(WorkloadInfo("Job", "ml", n, f"job/ml/{n}", False, 100, (g,), None, None) for n, g in gangs.items())
    # n3 full unless a gang holds it
    filler = () if any(p.node == "n3" for p in pods) else (replace(_replica(9, "n3"), name="chat-9", gpus=8),)
    snapshot = ClusterSnapshot(
        NOW, deployments=(PLAIN, code), pods=(_replica(0, "n1"), *pods, *filler), nodes=nodes, workloads=jobs
    )
    assert stopped_for(snapshot, (CODE_POLICY, 0, 1)) == stopped


# -- what was checked and found right: pinned -------------------------------------------------------------------------


def _embed(node: str | None, terms: tuple[PodAntiAffinityTerm, ...] | None = (AWAY_FROM_CODE,)) -> PodInfo:
    """A StatefulSet's GPU pod with its own terms as read."""
    return replace(
        _replica(7, node), name="embed-0", owner_kind="StatefulSet", owner_name="embed", labels={"app": "embed"},
        anti_affinity=terms, phase="Running" if node else "Pending",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "barred"),
    [
        pytest.param(_embed(None), set(), id="a Pending pod is bound nowhere: keeps nothing"),
        pytest.param(replace(_embed(None), phase="Running", node="gone"), set(), id="bound to a node not read"),
        pytest.param(_embed("n4", (AWAY_FROM_CODE_BY_ZONE,)), set(), id="a zone term on a node without the label"),
        pytest.param(_embed("n4"), {"n4"}, id="a hostname term on a node without the label: its name"),
        pytest.param(
            _embed("n1", (replace(AWAY_FROM_CODE, namespaces=frozenset({"ml"})),)), set(),
            id="its term's namespaces are not the replica's",
        ),
        pytest.param(
            _embed("n1", (replace(AWAY_FROM_CODE, namespaces=None),)), {"n1"}, id="a namespaceSelector: every one",
        ),
        pytest.param(
            _embed("n1", (replace(AWAY_FROM_CODE, selector={}),)), set(), id="a null selector selects nothing",
        ),
        pytest.param(
            replace(_embed("n1"), owner_kind=None, owner_name=None), {"n1"}, id="a bare pod",
        ),
    ],
)  # fmt: skip
def test_a_running_pods_own_terms_as_kube_scheduler_counts_them(pod: PodInfo, barred: set[str]) -> None:
    snapshot = replace(_snapshot(pod), deployments=(PLAIN, CODE))
    assert anti_affinity_barred(CODE, snapshot) == barred


def test_the_own_terms_cache_never_answers_a_new_pod_tuple_from_an_old_one() -> None:
    """Keyed on the tuple's identity, which the entry keeps alive: a new snapshot's pods (an equal tuple that is
    another object, or the same pods with other terms) are looked at afresh, and a third tuple evicts the oldest
    without a wrong answer."""
    with_terms = (_embed("n1"),)
    without = (_embed("n1", ()),)
    assert pods_with_own_anti_affinity(with_terms) == with_terms
    assert pods_with_own_anti_affinity(without) == ()
    equal = (*with_terms,)
    assert equal is not with_terms and pods_with_own_anti_affinity(equal) == with_terms
    for _ in range(3):  # alternating more tuples than are remembered
        for pods, found in ((with_terms, with_terms), (without, ()), ((_replica(0, "n2"),), ())):
            assert pods_with_own_anti_affinity(pods) == found
    snapshot = replace(_snapshot(*with_terms), deployments=(PLAIN, CODE))
    assert anti_affinity_barred(CODE, snapshot) == {"n1"}
    assert anti_affinity_barred(CODE, replace(snapshot, pods=without)) == set()
    assert anti_affinity_barred(CODE, snapshot) == {"n1"}
