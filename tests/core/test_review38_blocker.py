"""Review of c0453f0 (``_Blocker`` / ``_competes`` in ``autoscaler/core/arbitrate.py``): a lower-priority service
waits behind a higher one whose replicas get no GPUs this tick only where the higher one's pods could take what would
be freed or bought for the lower one.

The tests under "defects" were strict xfails on that change (WRONG: what happened, RIGHT: what should); all are fixed:
the block is judged on what the lower service would do -- the nodes its victims free, or the pool it would buy from
(``_takes_freed`` / ``_takes_bought``) -- with the blocker's GPUs per replica, leaving nodes skipped and a node not yet
labelled taken as its pool's GPU type. The other tests pin the behaviour checked and found right.

The world (``_world``): chat (priority 1000, A100) holds n1 and n3 and wants 4 more (first seen now: it confirms, so
it waits and blocks); an A100 training gang (a-gang) holds n2. embed (priority 500) holds n4 and wants 4 more, short
for a minute (confirmed); b-gang (8 GPUs) holds n5. Each test varies the nodes, selectors, taints and pools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo, Taint, Toleration
from autoscaler.core.model import CapacityState, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from tests.core.test_arbitrate import CHAT, NOW, gang_pods, job
from tests.core.test_shortfall_confirm import CONFIRM, EMBED, stops

RERANK = ServicePolicy("inference", "rerank", max_replicas=40, priority=700)
DEDICATED = Taint("dedicated", "embed")
TOLERATES = (Toleration("dedicated", value="embed"),)
TIER = {"tier": "embed"}


def _pod(policy: ServicePolicy, index: int, node_name: str, gpus: int = 1) -> PodInfo:
    return PodInfo(policy.namespace, f"{policy.name}-{index}", node_name, gpus, policy.priority, "Running", True,
                   "Deployment", policy.name, created_at=NOW - 3600)  # fmt: skip


def _gpu(name: str, kind: str | None = "A100", gpus: int = 8, **kw) -> NodeInfo:  # type: ignore[no-untyped-def]
    return NodeInfo(name, gpus, kind, kw.pop("pool", "onprem"), kw.pop("ready", True), **kw)


def _world(
    *,
    embed_nodes: Sequence[NodeInfo] | None = None,
    extra_nodes: Sequence[NodeInfo] = (),
    chat_type: str | None = "A100",
    embed: DeploymentInfo | None = None,
    a_gang_priority: int = 100,
    pools: tuple[BurstPool, ...] = (),
    preempt: bool = True,
    chat_gpus: int = 1,
    chat_wants: int = 4,
    extra_pods: Sequence[PodInfo] = (),
    extra_services: Sequence[tuple[ServicePolicy, DeploymentInfo, ScaleDecision]] = (),
    state: CapacityState | None = None,
    b_gang: bool = True,
):  # type: ignore[no-untyped-def]
    """chat fills n1 and n3 (``chat_gpus`` GPUs per replica), a-gang n2; embed fills n4 (8 x 1 GPU), b-gang n5 (8
    GPUs). ``embed_nodes``: n4 and n5 (default: untainted A100s of the on-prem pool)."""
    per_node = 8 // chat_gpus
    pods = [_pod(CHAT, i, "n1", chat_gpus) for i in range(per_node)]
    pods += [_pod(CHAT, per_node + i, "n3", chat_gpus) for i in range(per_node)]
    pods += [_pod(EMBED, i, "n4") for i in range(8)]
    pods += gang_pods("a-gang", ["n2"], gpus=8, priority=a_gang_priority)
    pods += gang_pods("b-gang", ["n5"], gpus=8) if b_gang else []
    pods += list(extra_pods)
    if embed_nodes is None:
        embed_nodes = (_gpu("n4"), _gpu("n5"))
    nodes = (_gpu("n1"), _gpu("n2"), _gpu("n3"), *embed_nodes, *extra_nodes)
    chat_held = 2 * per_node
    deployments = [
        DeploymentInfo("inference", "chat", chat_held, chat_held, gpu_product=chat_type, gpus_per_pod=chat_gpus),
        embed or DeploymentInfo("inference", "embed", 8, 8, gpu_product="A100", gpus_per_pod=1),
    ]
    policies = {CHAT.key: CHAT, EMBED.key: EMBED}
    decisions = [
        ScaleDecision(CHAT.key, chat_held, chat_held + chat_wants, Reason.METRIC_ABOVE_TARGET, ""),
        ScaleDecision(EMBED.key, 8, 12, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    for policy, deployment, decision in extra_services:
        deployments.append(deployment)
        policies[policy.key] = policy
        decisions.append(decision)
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(pods), nodes=nodes, workloads=(job("a-gang"), *((job("b-gang"),) if b_gang else ())),
        deployments=tuple(deployments),
    )
    config = CapacityConfig(shortfall_confirm_s=CONFIRM.shortfall_confirm_s, pools=pools, preempt=preempt)
    state = state or CapacityState(service_short_since={EMBED.key: NOW - 60.0})
    return arbitrate(ArbitrationInput(NOW, snapshot, policies, decisions), state, config)


def _chosen(report, service: str):  # type: ignore[no-untyped-def]
    return [o for o in report.options if o.chosen and o.service == service]


def _waits(report, service: str = EMBED.key) -> bool:  # type: ignore[no-untyped-def]
    return any(o.kind == "wait" for o in _chosen(report, service))


def _bought(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP]


def _dedicated_embed(selector: bool = True) -> tuple[tuple[NodeInfo, ...], DeploymentInfo]:
    """n4 and n5 labelled tier=embed and tainted dedicated=embed (only embed's pods tolerate it); embed selects them
    (``selector``) or only tolerates them."""
    nodes = tuple(_gpu(n, labels=TIER, taints=(DEDICATED,)) for n in ("n4", "n5"))
    deployment = DeploymentInfo(
        "inference", "embed", 8, 8, gpu_product="A100", gpus_per_pod=1, tolerations=TOLERATES,
        node_selector=TIER if selector else {},
    )  # fmt: skip
    return nodes, deployment


# -- the baseline: the block, and where it is lifted ----------------------------------------------------------------


def test_baseline_same_gpus_waits_dedicated_nodes_act() -> None:
    """Pinned: sharing A100 nodes, embed waits behind confirming chat (then: preempt); on nodes dedicated to it, it
    stops b-gang."""
    actions, report, _ = _world()
    assert stops(actions) == [] and _waits(report)
    (wait,) = _chosen(report, EMBED.key)
    assert "inference/chat (priority 1000)" in wait.detail and "(then: preempt)" in wait.detail
    nodes, embed = _dedicated_embed()
    actions, report, _ = _world(embed_nodes=nodes, embed=embed)
    assert stops(actions) == ["b-gang"] and not _waits(report)


def test_gpu_type_none_on_both_sides_still_waits_on_shared_nodes_and_acts_on_disjoint_ones() -> None:
    """Pinned: neither pins a GPU type (any): on shared nodes embed waits; chat kept off embed's nodes (taint) and
    embed off chat's (nodeSelector): embed acts."""
    embed_any = DeploymentInfo("inference", "embed", 8, 8, gpu_product=None, gpus_per_pod=1)
    actions, report, _ = _world(chat_type=None, embed=embed_any)
    assert stops(actions) == [] and _waits(report)
    nodes, embed = _dedicated_embed()
    actions, report, _ = _world(chat_type=None, embed_nodes=nodes, embed=replace(embed, gpu_product=None))
    assert stops(actions) == ["b-gang"] and not _waits(report)


def test_a_blocker_barred_from_every_node_blocks_nothing_without_a_pool() -> None:
    """Pinned: chat's pods select a label no node carries (every node barred to them) and no burst pool could bring
    one: nothing embed frees can go to them, embed acts (the gang it stops is its own choice)."""
    nowhere = DeploymentInfo("inference", "chat", 16, 16, gpu_product="A100", gpus_per_pod=1,
                             node_selector={"zone": "nowhere"})  # fmt: skip
    actions, report, _ = _world_with_chat(nowhere)
    assert _waits(report, CHAT.key)  # chat still confirms (its replicas Pending)
    assert stops(actions) != [] and not _waits(report)


def _world_with_chat(chat: DeploymentInfo, pools: tuple[BurstPool, ...] = ()):  # type: ignore[no-untyped-def]
    pods = [_pod(CHAT, i, "n1") for i in range(8)] + [_pod(CHAT, 8 + i, "n3") for i in range(8)]
    pods += [_pod(EMBED, i, "n4") for i in range(8)]
    pods += gang_pods("a-gang", ["n2"], gpus=8) + gang_pods("b-gang", ["n5"], gpus=8)
    nodes = tuple(_gpu(n) for n in ("n1", "n2", "n3", "n4", "n5"))
    deployments = (chat, DeploymentInfo("inference", "embed", 8, 8, gpu_product="A100", gpus_per_pod=1))
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(pods), nodes=nodes, workloads=(job("a-gang"), job("b-gang")), deployments=deployments
    )
    decisions = [
        ScaleDecision(CHAT.key, 16, 20, Reason.METRIC_ABOVE_TARGET, ""),
        ScaleDecision(EMBED.key, 8, 12, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    config = CapacityConfig(shortfall_confirm_s=30.0, pools=pools)
    state = CapacityState(service_short_since={EMBED.key: NOW - 60.0})
    return arbitrate(ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT, EMBED.key: EMBED}, decisions), state, config)


def test_a_chain_of_waits_still_blocks_through_a_service_that_takes_any_gpu() -> None:
    """Pinned: chat (A100) confirms; rerank (700, any GPU type, confirmed) waits behind it on the A100s both use;
    embed (H100) does not compete with chat but does with rerank, whose Pending pods would take the H100s stopping
    b-gang frees: embed waits behind rerank, and says so."""
    h100 = (_gpu("n4", "H100"), _gpu("n5", "H100"))
    embed = DeploymentInfo("inference", "embed", 8, 8, gpu_product="H100", gpus_per_pod=1)
    rerank = DeploymentInfo("inference", "rerank", 8, 8, gpu_product=None, gpus_per_pod=1)
    service = (RERANK, rerank, ScaleDecision(RERANK.key, 8, 12, Reason.METRIC_ABOVE_TARGET, ""))
    state = CapacityState(service_short_since={EMBED.key: NOW - 60.0, RERANK.key: NOW - 60.0})
    actions, report, _ = _world(
        embed_nodes=h100, embed=embed, extra_nodes=(_gpu("n6"),),
        extra_pods=[_pod(RERANK, i, "n6") for i in range(8)], extra_services=(service,), state=state,
    )  # fmt: skip
    assert stops(actions) == []
    (r_wait,) = _chosen(report, RERANK.key)
    assert r_wait.kind == "wait" and "inference/chat (priority 1000)" in r_wait.detail
    (e_wait,) = _chosen(report, EMBED.key)
    assert e_wait.kind == "wait" and "inference/rerank (priority 700)" in e_wait.detail
    assert "(it waits)" in e_wait.detail


def test_a_typeless_burst_pool_does_not_join_two_gpu_types() -> None:
    """Pinned: a burst pool of no GPU type with no registered node: chat (A100) and embed (H100) still never compete
    -- whatever the pool boots, at most one of them can use it."""
    pool = BurstPool("burst", 8, None, boot_s=300.0, price_per_gpu_hour=1000.0, nodes=0, min_nodes=0, max_nodes=4)
    h100 = (_gpu("n4", "H100"), _gpu("n5", "H100"))
    embed = DeploymentInfo("inference", "embed", 8, 8, gpu_product="H100", gpus_per_pod=1)
    actions, report, _ = _world(embed_nodes=h100, embed=embed, pools=(pool,))
    assert stops(actions) == ["b-gang"] and not _waits(report)


def test_a_blocker_of_one_type_and_a_service_of_any_type_compete_only_where_that_type_is_shared() -> None:
    """Pinned: chat pins A100, embed takes any type but selects the tier=embed nodes (H100s, tainted): no A100 both
    may use, embed acts; with one untainted A100 labelled tier=embed that both may use, what embed would free there
    goes to chat first: embed waits. (Since the review's fix the block is judged on the nodes embed would free: with
    b-gang on its own H100 to stop as well, embed acted there before and still does.)"""
    nodes = tuple(_gpu(n, "H100", labels=TIER, taints=(DEDICATED,)) for n in ("n4", "n5"))
    embed = DeploymentInfo("inference", "embed", 8, 8, gpu_product=None, gpus_per_pod=1, tolerations=TOLERATES,
                           node_selector=TIER)  # fmt: skip
    actions, report, _ = _world(embed_nodes=nodes, embed=embed)
    assert stops(actions) == ["b-gang"] and not _waits(report)
    shared = _gpu("n6", labels=TIER)
    # the only training embed may stop runs there (no n5, no b-gang)
    c_gang = gang_pods("c-gang", ["n6"], gpus=8)
    actions, report, _ = _world(embed_nodes=nodes[:1], embed=embed, extra_nodes=(shared,), extra_pods=c_gang,
                                b_gang=False)  # fmt: skip
    assert stops(actions) == [] and _waits(report)
    (wait,) = _chosen(report, EMBED.key)
    assert "would give the GPUs freed now to its pods first" in wait.detail and "(then: preempt)" in wait.detail


# -- defects (fixed) ---------------------------------------------------------------------------------------------


def test_an_idle_burst_pool_does_not_bring_back_the_block_on_dedicated_nodes() -> None:
    """Fixed (was a strict xfail).

    WRONG: any configured burst pool with no registered node (a pool scaled to zero: the usual idle state) of a
    type both may use makes ``_competes`` true, whatever the lower service actually does. embed, on nodes dedicated
    to it, would stop b-gang on n5 (preempt is far cheaper than the pool, "then: preempt"): chat's pods can never
    take n5, yet embed waits behind chat -- the fix of c0453f0 is void in any cluster with an idle burst pool.
    RIGHT: the block is judged on what the lower service would do: its victims' nodes (here n5, barred to chat) or
    the pool it would buy (unknown labels: compete); preempting on n5 goes ahead."""
    nodes, embed = _dedicated_embed()
    idle = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=1000.0, nodes=0, min_nodes=0, max_nodes=4)
    actions, report, _ = _world(embed_nodes=nodes, embed=embed, pools=(idle,))
    assert all("(then: burst)" not in o.detail for o in _chosen(report, EMBED.key))  # it would preempt, not buy
    assert stops(actions) == ["b-gang"]


def test_a_shared_node_where_nothing_is_freed_does_not_block() -> None:
    """Fixed (was a strict xfail).

    WRONG: embed tolerates its dedicated nodes without selecting them (toleration, no nodeSelector), so it may
    also use n1-n3, which chat fills. The only training embed may stop is b-gang on n5 (a-gang on n2 runs above
    embed's priority), tainted against chat: nothing freed can go to chat's Pending pods, yet embed waits, because
    the two "share" n1-n3 -- where nothing is freed or bought.
    RIGHT: only the GPUs the lower service's choice frees (its victims' nodes) or buys (its pool) count: embed stops
    b-gang."""
    nodes, embed = _dedicated_embed(selector=False)
    actions, report, _ = _world(embed_nodes=nodes, embed=embed, a_gang_priority=600)
    assert stops(actions) == ["b-gang"]
    assert not _waits(report)


def test_a_blocker_whose_replicas_need_more_gpus_than_the_shared_nodes_have_does_not_block() -> None:
    """Fixed (was a strict xfail).

    WRONG: chat's replicas take 8 GPUs each (one whole 8-GPU node); embed's nodes n4 and n5 are 4-GPU A100s that
    chat's pods are not kept off (no taint), and embed selects them. No chat replica can ever fit on n4 or n5, yet
    the shared 4-GPU nodes make embed wait behind chat instead of stopping b-gang (4 GPUs on n5).
    RIGHT: a node (or a pool's node) with fewer GPUs than one of the blocker's replicas requests is no room for it:
    embed stops b-gang."""
    small = tuple(_gpu(n, gpus=4, labels=TIER) for n in ("n4", "n5"))
    embed = DeploymentInfo("inference", "embed", 4, 4, gpu_product="A100", gpus_per_pod=1, node_selector=TIER)
    actions, report, _ = _world_small(small, embed)
    assert stops(actions) == ["b-gang"]
    assert not _waits(report)


def _world_small(nodes: tuple[NodeInfo, ...], embed: DeploymentInfo):  # type: ignore[no-untyped-def]
    """chat: 2 replicas x 8 GPUs on n1, n3, wants 3; a-gang n2; embed: 4 x 1 GPU on the 4-GPU n4, wants 8; b-gang
    (4 GPUs) on the 4-GPU n5."""
    pods = [_pod(CHAT, 0, "n1", 8), _pod(CHAT, 1, "n3", 8)] + [_pod(EMBED, i, "n4") for i in range(4)]
    pods += gang_pods("a-gang", ["n2"], gpus=8) + gang_pods("b-gang", ["n5"], gpus=4)
    all_nodes = (_gpu("n1"), _gpu("n2"), _gpu("n3"), *nodes)
    deployments = (DeploymentInfo("inference", "chat", 2, 2, gpu_product="A100", gpus_per_pod=8), embed)
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(pods), nodes=all_nodes, workloads=(job("a-gang"), job("b-gang")), deployments=deployments
    )
    decisions = [
        ScaleDecision(CHAT.key, 2, 3, Reason.METRIC_ABOVE_TARGET, ""),
        ScaleDecision(EMBED.key, 4, 8, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    state = CapacityState(service_short_since={EMBED.key: NOW - 60.0})
    return arbitrate(
        ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT, EMBED.key: EMBED}, decisions), state, CONFIRM
    )


def test_a_shared_node_being_removed_does_not_block() -> None:
    """Fixed (was a strict xfail).

    WRONG: the only node both may use is n6, cordoned for a drain (leaving): it takes no new pods, nothing freed
    or bought lands there, yet it makes ``_competes`` true and embed (on its tainted, dedicated n4/n5) waits behind
    chat instead of stopping b-gang.
    RIGHT: a leaving node (cordoned, tainted for removal, being deleted) is room for neither: embed stops b-gang."""
    nodes, embed = _dedicated_embed()
    draining = _gpu("n6", ready=False, labels=TIER, leaving=True, out_of_service=True)
    actions, report, _ = _world(embed_nodes=nodes, embed=embed, extra_nodes=(draining,))
    assert stops(actions) == ["b-gang"]
    assert not _waits(report)


def test_a_pool_whose_only_node_is_booting_unlabelled_still_competes() -> None:
    """Fixed (was a strict xfail).

    WRONG (a regression: before c0453f0 embed waited): the burst pool (A100) has one registered node, b1, booting
    -- NotReady, no GPUs reported, no ``nvidia.com/gpu.product`` label yet (GPU feature discovery labels it once
    up). chat's replicas take b1's room and are still short (chat confirms); embed, dedicated to tainted n4 with no
    training to stop, buys a node of the pool. ``_competes`` skips b1 (its ``gpu_product`` None is not "A100") and,
    the pool having a registered node, skips the pool too: no block. The node embed buys is untainted, an A100: the
    scheduler gives it to chat's Pending pods first -- the very case the block exists for.
    RIGHT: a booting pool node is of its pool's GPU type (as ``_free_by_node`` already takes it), so chat and embed
    compete on the pool: embed waits (then: burst), nothing bought."""
    n4 = _gpu("n4", labels=TIER, taints=(DEDICATED,))
    pool = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=1, min_nodes=0, max_nodes=4)
    embed = DeploymentInfo("inference", "embed", 8, 8, gpu_product="A100", gpus_per_pod=1, tolerations=TOLERATES,
                           node_selector=TIER)  # fmt: skip

    def with_b1(kind: str | None):  # type: ignore[no-untyped-def]
        b1 = NodeInfo("b1", 0, kind, "burst", False)
        return _world(embed_nodes=(n4,), embed=embed, extra_nodes=(b1,), pools=(pool,), preempt=False, chat_wants=12,
                      b_gang=False)  # fmt: skip

    # control: b1 already labelled A100, the block holds (then: burst)
    actions, report, _ = with_b1("A100")
    assert _bought(actions) == [] and _waits(report)
    actions, report, _ = with_b1(None)
    assert _waits(report, CHAT.key)  # (chat confirms: the blocker)
    assert _bought(actions) == []
    assert _waits(report)
