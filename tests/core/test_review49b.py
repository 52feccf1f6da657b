"""Review 49b: hard topology spread constraints in the capacity arbitration (``core.topology_spread``,
``core.arbitrate``, ``core.victims``, ``core.rebalance``) -- cases where it disagreed with kube-scheduler's
PodTopologySpread filter."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.model import ScaleNodePool
from autoscaler.core.reasons import Reason
from tests.core import test_topology_spread as tsc

# -- two give-backs in one tick --------------------------------------------------------------------------------------


def test_two_pools_do_not_each_give_back_a_node_whose_replica_may_go_only_where_the_other_went() -> None:
    """chat (spread by zone, maxSkew 1) runs one replica in a (a1, 7 GPUs free), one in c (c1, full) and two in b,
    each alone on a burst node of its own pool (b0: burst, s0: spot; b1 is full). Either give-back alone is sound:
    b keeps one, and the replica goes to a1 (a two, b one). Not both: b would hold none, and neither replacement may
    go to a -- two ahead of b. Each was judged on the snapshot's counts, not on those the other give-back left."""
    burst = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, max_nodes=4)
    spot = replace(burst, name="spot")
    config = CapacityConfig(pools=(burst, spot), burst_idle_cooldown_s=0.0)
    nodes = (tsc._node("a1", "a"), tsc._node("b1", "b"), tsc._node("c1", "c"), tsc._node("b0", "b", pool="burst"),
             tsc._node("s0", "b", pool="spot"))  # fmt: skip
    pods = (tsc._replica(0, "a1"), tsc._gang("full", "b1", 8, 60.0), tsc._replica(1, "c1"),
            tsc._gang("fill-c", "c1", 7, 60.0), tsc._replica(2, "b0"), tsc._replica(3, "s0"))  # fmt: skip

    def given_back(deployment):  # type: ignore[no-untyped-def]
        actions, _, _ = tsc._tick(pods, nodes, deployment, 4, config, {"burst": 1, "spot": 1})
        return sorted(
            a.remove_node for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_DOWN
        )

    assert given_back(tsc.PLAIN) == ["b0", "s0"], "sanity: unspread, both replicas fit a1"
    assert given_back(tsc.SPREAD) == ["b0"]
