"""Required node affinity: where a pod may go, beside its nodeSelector (stop 48).

Until stop 47 only a pod's ``nodeSelector`` was read (and a required affinity pinning one GPU type). A GPU fleet
keeps work off nodes with ``requiredDuringSchedulingIgnoredDuringExecution`` as often: training kept off the burst
pools (``NotIn``), a service allowed two GPU types (``In`` on two values), a zone, a driver version (``Gt``). Read as
"anywhere", the victim search stopped a gang on a node the replicas could never use (training lost, the replicas
still Pending), the resume counted free GPUs the workload's pods could never take, and the rebalancer emptied nodes
for them. The rule is kube-scheduler's NodeAffinity filter: the nodeSelector and the required affinity must both
match; the terms are ORed, a term's requirements ANDed, an empty term matches nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.cluster import (
    ClusterSnapshot,
    NodeInfo,
    NodeRequirement,
    NodeSelector,
    PodInfo,
    Taint,
    Toleration,
    hole_node_for_waiting_work,
    labels_select,
    node_room,
    selected_by,
    selector_key,
    selector_with_affinity,
    waiting_for_room,
    waiting_gpu_work,
    without_label,
)
from tests.core import test_review34_arbitration as r34
from tests.core import test_suspended_workload_placement as swp

NOW = 100_000.0
LABELS = {"pool": "onprem", "zone": "a", "driver": "550", "gpu": "A100"}


def _req(key: str, operator: str, *values: str, on_name: bool = False) -> NodeRequirement:
    return NodeRequirement(key, operator, values, on_name)


@pytest.mark.parametrize(
    ("requirement", "holds"),
    [
        (_req("zone", "In", "a", "b"), True),
        (_req("zone", "In", "b"), False),
        (_req("rack", "In", "a"), False),  # no such label: In never holds
        (_req("zone", "NotIn", "b"), True),
        (_req("zone", "NotIn", "a"), False),
        (_req("rack", "NotIn", "a"), True),  # no such label: NotIn holds (the burst-pool exclusion on a bare node)
        (_req("zone", "Exists"), True),
        (_req("rack", "Exists"), False),
        (_req("rack", "DoesNotExist"), True),
        (_req("zone", "DoesNotExist"), False),
        (_req("driver", "Gt", "535"), True),
        (_req("driver", "Gt", "550"), False),
        (_req("driver", "Lt", "560"), True),
        (_req("driver", "Lt", "+550"), False),
        (_req("zone", "Gt", "1"), False),  # a label that is no integer: no match
        (_req("driver", "Gt", "x"), False),  # a bound that is no integer: the API refuses it; holds nowhere
        (_req("driver", "Gt", "1", "2"), False),  # Gt takes exactly one value
        (_req("zone", "Exists", "a"), False),  # Exists takes no value
        (_req("zone", "Equals", "a"), False),  # no such operator
        (_req("", "", ), False),  # what the reader keeps for a requirement it cannot read
        (_req("metadata.name", "In", "n1", on_name=True), True),
        (_req("metadata.name", "In", "n2", on_name=True), False),
        (_req("metadata.name", "NotIn", "n2", on_name=True), True),
        (_req("metadata.uid", "NotIn", "x", on_name=True), False),  # the only field is metadata.name
    ],
    ids=repr,
)
def test_a_requirement_holds_as_kube_schedulers_label_selector_says(requirement: NodeRequirement, holds: bool) -> None:
    assert requirement.holds(LABELS, "n1") is holds


@pytest.mark.parametrize(
    ("labels", "affinity", "selects"),
    [
        pytest.param({}, None, True, id="nothing asked: any node"),
        pytest.param({"zone": "a"}, None, True, id="nodeSelector alone, met"),
        pytest.param({}, ((_req("zone", "In", "b"),), (_req("pool", "In", "onprem"),)), True, id="terms are ORed"),
        pytest.param({}, ((_req("zone", "In", "a"), _req("pool", "In", "burst")),), False, id="requirements ANDed"),
        pytest.param({}, ((),), False, id="an empty term matches no node"),
        pytest.param({}, (), False, id="a required affinity without terms matches no node"),
        pytest.param({"zone": "b"}, ((_req("pool", "Exists"),),), False, id="the nodeSelector must match as well"),
        pytest.param({"zone": "a"}, ((_req("pool", "NotIn", "burst"),),), True, id="both met"),
    ],
)
def test_a_node_is_selected_by_its_nodeselector_and_one_affinity_term(
    labels: dict[str, str], affinity: tuple[tuple[NodeRequirement, ...], ...] | None, selects: bool
) -> None:
    selector = selector_with_affinity(labels, affinity)
    assert labels_select(LABELS, selector, "n1") is selects
    assert selected_by(NodeInfo("n1", 8, "A100", "onprem", True, labels=LABELS), selector) is selects


def test_a_selector_without_affinity_is_the_plain_dict_it_always_was() -> None:
    assert type(selector_with_affinity({"zone": "a"}, None)) is dict
    assert NodeSelector({"zone": "a"}) == {"zone": "a"}
    with_affinity = NodeSelector({"zone": "a"}, ((_req("pool", "Exists"),),))
    assert with_affinity != {"zone": "a"}
    assert bool(NodeSelector({}, ((_req("pool", "Exists"),),)))  # affinity alone still rules nodes out
    assert not NodeSelector({})


def test_caches_keyed_on_a_selector_tell_affinities_apart() -> None:
    plain = {"zone": "a"}
    fenced = NodeSelector(plain, ((_req("pool", "NotIn", "burst"),),))
    assert selector_key(plain) != selector_key(fenced)
    assert selector_key(fenced) == selector_key(NodeSelector(dict(plain), ((_req("pool", "NotIn", "burst"),),)))
    assert hash(fenced) == hash(NodeSelector(dict(plain), ((_req("pool", "NotIn", "burst"),),)))


def test_dropping_the_gpu_type_label_keeps_the_affinity() -> None:
    affinity = ((_req("zone", "In", "a"),),)
    dropped = without_label(NodeSelector({"gpu": "A100", "rack": "1"}, affinity), "gpu")
    assert dict(dropped) == {"rack": "1"}
    assert isinstance(dropped, NodeSelector) and dropped.affinity == affinity


# -- the victim search: a gang on a node the replicas' affinity rules out is no victim -------------------------------

NOT_ZONE_B = NodeSelector({}, ((_req("zone", "NotIn", "b"),),))


def test_a_gang_on_a_node_outside_the_replicas_required_affinity_is_not_stopped_for_them() -> None:
    """``cheap`` (least lost work) runs in zone b, which the replicas' affinity rules out: ``dear`` is stopped."""
    zone_b = replace(r34.onprem("n2"), labels={"zone": "b"})
    zone_a = replace(r34.onprem("n3"), labels={"zone": "a"})
    pinned = replace(r34.CHAT_DEPLOYMENT, node_selector=NOT_ZONE_B)
    assert r34.stopped(r34.tick(r34.two_gangs(zone_b, zone_a, pinned), None, r34.NO_POOL)[0]) == {"dear"}
    # sanity: without the affinity the cheaper gang is the one
    free = replace(r34.CHAT_DEPLOYMENT, node_selector={})
    assert r34.stopped(r34.tick(r34.two_gangs(zone_b, zone_a, free), None, r34.NO_POOL)[0]) == {"cheap"}


def test_replicas_whose_affinity_admits_neither_gangs_node_stop_nothing() -> None:
    zone_b = replace(r34.onprem("n2"), labels={"zone": "b"})
    also_b = replace(r34.onprem("n3"), labels={"zone": "b"})
    pinned = replace(r34.CHAT_DEPLOYMENT, node_selector=NOT_ZONE_B)
    actions, report, _ = r34.tick(r34.two_gangs(zone_b, also_b, pinned), None, r34.NO_POOL)
    assert r34.stopped(actions) == set()
    assert any(o.kind == "preempt" and not o.chosen for o in report.options)


# -- the resume and the queued work: only nodes the template's affinity admits -------------------------------------

OFF_BURST = NodeSelector({}, ((_req("pool", "NotIn", "burst", "spot"),),))
TWO_ZONES = NodeSelector({}, ((_req("zone", "In", "a"),), (_req("zone", "In", "c"),)))


@pytest.mark.parametrize(
    ("n2_labels", "selector", "resumed"),
    [
        pytest.param({"pool": "spot"}, OFF_BURST, False, id="kept off spot nodes: the free spot node is no room"),
        pytest.param({"pool": "train"}, OFF_BURST, True, id="the free node is not a burst or spot node: resumed"),
        pytest.param({}, OFF_BURST, True, id="an unlabelled node meets NotIn"),
        pytest.param({"zone": "b"}, TWO_ZONES, False, id="zone a or c, the free node is in b: not resumed"),
        pytest.param({"zone": "c"}, TWO_ZONES, True, id="the second term admits zone c: resumed"),
    ],
)
def test_resume_counts_only_the_nodes_its_templates_affinity_admits(
    n2_labels: dict[str, str], selector: NodeSelector, resumed: bool
) -> None:
    got, notes = swp._resumes((swp._node("n1"), swp._node("n2", n2_labels)), swp._workload(selector))  # type: ignore[arg-type]
    assert got is resumed
    if not resumed:
        assert any("do not fit" in n for n in notes)


@pytest.mark.parametrize(("selector", "waits"), [({}, False), (OFF_BURST, True)], ids=["no affinity", "off spot"])
def test_a_queued_workload_kept_off_the_free_node_waits_for_room(selector: object, waits: bool) -> None:
    nodes = (swp._node("n1"), swp._node("n2", {"pool": "spot"}))
    workload = swp._workload(selector, by_us=None)  # type: ignore[arg-type]
    snapshot = ClusterSnapshot(swp.NOW, pods=tuple(swp._replicas("n1", 4)), nodes=nodes, workloads=(workload,))
    waiting = waiting_gpu_work(snapshot)
    assert bool(waiting_for_room(waiting, snapshot)) is waits


@pytest.mark.parametrize(
    ("n2_labels", "moved"),
    [
        pytest.param({"pool": "train"}, ["inf/chat-7"], id="n2 admitted: chat-7 moves to n1, n2 emptied for the Job"),
        pytest.param({"pool": "spot"}, [], id="n2 is a spot node the Job is kept off: emptying it starts nothing"),
    ],
)
def test_the_rebalancer_gathers_room_only_where_the_affinity_admits(
    n2_labels: dict[str, str], moved: list[str]
) -> None:
    from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    world = swp._rebalance_world(n2_labels, OFF_BURST)  # type: ignore[arg-type]
    plan, _ = plan_rebalance(world, reb.NOW, RebalanceConfig(), RebalanceState())
    assert reb.evicted(plan) == moved


# -- the contended hold's hole: only on a node the waiting pod's selector, affinity and tolerations admit -----------


def _hold_world(n1_taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], selector: object = None):
    """chat's 8 replicas fill n1; n2 is full of other training; one 8-GPU training pod is Pending (its spec read:
    its tolerations and its selector)."""
    chat = [
        PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600)
        for i in range(8)
    ]
    other = PodInfo("ml", "other-0", "n2", 8, 50, "Running", True, "Job", "other", gang="job/ml/other")
    pending = PodInfo("ml", "waits-0", None, 8, 100, "Pending", False, "Job", "waits", gang="job/ml/waits",
                      tolerations=tolerations, node_selector=selector or {})  # type: ignore[arg-type]  # fmt: skip
    nodes = (
        NodeInfo("n1", 8, "A100", "onprem", True, labels={"pool": "serve"}, taints=n1_taints),
        NodeInfo("n2", 8, "A100", "onprem", True, labels={"pool": "train"}),
    )
    return ClusterSnapshot(NOW, pods=(*chat, other, pending), nodes=nodes)


SERVE_ONLY = (Taint("dedicated", "serve", "NoSchedule"),)


@pytest.mark.parametrize(
    ("taints", "tolerations", "selector", "hole"),
    [
        pytest.param((), (), None, (8, 8, "n1", 8), id="untainted n1: chat's 8 replicas make the hole"),
        pytest.param(SERVE_ONLY, (), None, None, id="n1 tainted for serving, the pod does not tolerate it: no hole"),
        pytest.param(SERVE_ONLY, (Toleration("dedicated", "Equal", "serve", "NoSchedule"),), None, (8, 8, "n1", 8),
                     id="tolerated: the hole"),
        pytest.param((), (), NodeSelector({}, ((NodeRequirement("pool", "NotIn", ("serve",)),),)), None,
                     id="its required affinity keeps it off the serving pool: no hole"),
    ],
)  # fmt: skip
def test_a_hole_opens_only_on_a_node_the_waiting_pod_may_use(
    taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], selector: object, hole: object
) -> None:
    """Until stop 48 the hole search read the waiting pod's nodeSelector but not its tolerations: the contended hold
    kept chat's replicas (GPUs billed) for a pod that could never take their GPUs."""
    snapshot = _hold_world(taints, tolerations, selector)
    waiting = waiting_for_room(waiting_gpu_work(snapshot), snapshot)
    assert [w.takes for w in waiting] == [8]
    assert hole_node_for_waiting_work(node_room(snapshot), "inference/chat", waiting) == hole


# -- the rebalancer and the resume agree on burst pools -----------------------------------------------------------


@pytest.mark.parametrize(
    ("n2_pool", "moved"),
    [
        pytest.param("onprem", ["inf/chat-7"], id="n2 on-prem: chat-7 moves to n1, n2 emptied for the Job"),
        pytest.param("burst", [], id="n2 a burst node: the resume never puts training there, no move"),
    ],
)
def test_room_for_suspended_training_is_never_gathered_on_a_burst_node(n2_pool: str, moved: list[str]) -> None:
    """``rebalance.training_on_burst_pools: true`` (``training_excluded_pools`` empty) lets pending training land on
    the burst pools, but the capacity arbitration resumes the training it suspended only onto the cluster's own nodes:
    the rebalancer emptied a burst node for a suspended Job the resume would never put there (chat-7 evicted for
    nothing). The burst node is not emptied as a burst node either here (``burst_empty_below`` 0)."""
    from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance
    from tests.core import test_rebalance as reb

    world = swp._rebalance_world({}, {})
    world = replace(world, nodes=(world.nodes[0], replace(world.nodes[1], pool=n2_pool)))
    config = RebalanceConfig(burst_pools=frozenset({"burst"}), training_excluded_pools=frozenset(),
                             burst_empty_below=0.0)  # fmt: skip
    plan, _ = plan_rebalance(world, reb.NOW, config, RebalanceState())
    assert reb.evicted(plan) == moved
