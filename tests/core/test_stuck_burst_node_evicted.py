"""A burst node that went NotReady with GPU pods bound, once those pods are being deleted (stop 43).

Before: a stuck burst node (not ready past the provision limit) was never given back while any GPU pod was bound to
it. When a node stays NotReady, the node lifecycle controller evicts its pods once their ``unreachable``/``not-ready``
toleration runs out (300 s by default): their owners re-create them elsewhere, and the evicted pods stay Terminating
until the kubelet answers or the node is gone. Nothing on such a node comes back, and its Machine is billed -- all
night, for a burst node. Now the node is given back once every GPU pod bound to it is being deleted; a pod not being
deleted (its toleration not run out, or tolerating for ever) still keeps it. Either way a node that served once
neither closes its pool nor counts as a provisioning failure.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import NodeInfo, PodInfo
from autoscaler.core.model import ScaleNodePool
from autoscaler.core.reasons import Reason
from tests.core.test_burst_provisioning import LONG, NOW, POOL, booting_node, full, tick


def bound(name: str, terminating: bool, gpus: int = 1, phase: str = "Running") -> PodInfo:
    pod = PodInfo("inference", name, "burst-a", gpus, 1000, phase, False, "Deployment", "chat")
    return replace(pod, terminating=terminating)


def not_ready_give_backs(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_NODE_NOT_READY]


@pytest.mark.parametrize(
    ("pods", "given_back"),
    [
        pytest.param((bound("chat-9", terminating=True),), True, id="its one GPU pod evicted"),
        pytest.param(
            (bound("chat-9", terminating=True), bound("chat-10", terminating=True)), True, id="every GPU pod evicted"
        ),
        pytest.param(
            (bound("chat-9", terminating=True), bound("chat-10", terminating=False)),
            False,
            id="one GPU pod not evicted yet",
        ),
        pytest.param((bound("chat-9", terminating=False),), False, id="its GPU pod not evicted yet"),
        pytest.param(
            (bound("chat-9", terminating=True), bound("done", terminating=False, phase="Succeeded")),
            True,
            id="evicted, beside a finished pod",
        ),
    ],
)
def test_a_stuck_burst_node_is_given_back_once_every_gpu_pod_on_it_is_being_deleted(
    pods: tuple[PodInfo, ...], given_back: bool
) -> None:
    # no shortfall (review 43b: a pool grown in the tick gives its stuck node back at a later one)
    actions, report, state = tick(full(booting_node(900.0), extra_pods=pods), {"burst": 1}, want=8)
    backs = not_ready_give_backs(actions)
    if given_back:
        (back,) = backs
        assert (back.previous_nodes, back.nodes, back.remove_node) == (1, 0, "burst-a")
        assert any("being deleted" in n and n.endswith("given back") for n in report.notes)
        # it served once: no sign that the pool's new nodes fail
        assert state.provision_failures == {}
    else:
        assert backs == []
        assert any("not given back, and its pool not closed: GPU pods are bound to it" in n for n in report.notes)
        assert state.provision_failures == {}


def test_an_evicted_stuck_node_does_not_close_its_pool_to_a_shortfall() -> None:
    """Its pods' replacements are short: the pool is grown for them (one that served once is not a broken image), not
    backed off; the stuck node is given back at a later tick (review 43b: one resize per pool and tick -- both writes
    expect the size read, and the second was refused as changed since the read)."""
    actions, report, state = tick(
        full(booting_node(900.0), extra_pods=(bound("chat-9", terminating=True),)), {"burst": 1}
    )
    assert [a.reason for a in actions if isinstance(a, ScaleNodePool)] == [Reason.BURST_SCALE_UP]
    assert any("not given back this tick: its pool is grown this tick" in n for n in report.notes)
    burst = next(o for o in report.options if o.kind == "burst")
    assert "never became ready" not in burst.detail
    assert state.provision_failures == {}


def test_a_stuck_node_with_evicted_pods_within_the_provision_limit_is_still_waited_for() -> None:
    """Not ready for less than the limit: it may still come back (a kubelet restart); nothing given back."""
    actions, _, _ = tick(full(booting_node(300.0), extra_pods=(bound("chat-9", terminating=True),)), {"burst": 1})
    assert not_ready_give_backs(actions) == []


def test_an_evicted_stuck_node_at_its_pool_minimum_is_kept() -> None:
    pool_min = {"burst": 1}
    config: CapacityConfig = replace(LONG, pools=(replace(POOL, min_nodes=1),))
    actions, report, _ = tick(
        full(booting_node(900.0), extra_pods=(bound("chat-9", terminating=True),)), pool_min, config=config
    )
    assert not_ready_give_backs(actions) == []
    assert any("the pool is at its minimum size 1" in n for n in report.notes)


# -- a burst node broken after it served (its kubelet lost): read as out of service, and never given back ------------
#
# Before: the reader reads a node whose kubelet is lost (Ready Unknown), or that went NotReady long after it registered
# its GPUs, as leaving and out of service; the stuck-node path skipped leaving nodes and the give-back only looks at
# ready ones, so such a burst node was billed until somebody removed it. Now it is given back like a stuck one: past
# the provision limit since its Ready condition changed, one per pool and tick, with no live GPU pod on it, without
# counting a provisioning failure.


def broken_node(age_s: float, name: str = "burst-a", **kw: object) -> NodeInfo:
    node = NodeInfo(name, 0, "A100", "burst", False, leaving=True, out_of_service=True, broken=True)
    return replace(node, state_since=NOW - age_s, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("node", "pods", "given_back"),
    [
        pytest.param(broken_node(900.0), (), True, id="broken past the limit, empty"),
        pytest.param(broken_node(300.0), (), False, id="broken within the limit"),
        pytest.param(broken_node(900.0), (bound("chat-9", terminating=False),), False, id="a GPU pod not deleted"),
        pytest.param(broken_node(900.0), (bound("chat-9", terminating=True),), True, id="its GPU pod evicted"),
        pytest.param(
            broken_node(900.0, out_of_service=False), (), False, id="broken and being removed (a removal taint)"
        ),
        pytest.param(broken_node(900.0, broken=False), (), False, id="cordoned by hand, not broken"),
    ],
)
def test_a_broken_burst_node_is_given_back_past_the_limit(
    node: NodeInfo, pods: tuple[PodInfo, ...], given_back: bool
) -> None:
    actions, report, state = tick(full(node, extra_pods=pods), {"burst": 1}, want=8)  # no shortfall (review 43b)
    backs = not_ready_give_backs(actions)
    assert [b.remove_node for b in backs] == (["burst-a"] if given_back else [])
    # it served once: no provisioning failure, its pool not closed to the shortfall
    assert state.provision_failures == {}
    assert not any("never became ready" in o.detail for o in report.options if o.kind == "burst")


def test_a_broken_node_is_noted_as_broken_not_as_booting() -> None:
    """``autoscaler plan``'s note names what is wrong: a broken node's kubelet or runtime, not a device plugin that
    never reported GPUs."""
    _, report, _ = tick(full(broken_node(900.0)), {"burst": 1}, want=8)
    assert any(n.startswith("burst-a (burst): broken for 900s") and n.endswith("given back") for n in report.notes)
    assert not any("no GPUs reported" in n for n in report.notes)
