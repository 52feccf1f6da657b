"""Suspended training and a burst pool held for a waited-out shortfall (stop 47; stop 46's leftover).

Stop 46 kept a burst pool's timer while a service whose replicas could run there waits out its shortfall. The
resume still followed the rule "burst nodes are given back first": any pool above its minimum -- the held one too --
kept every suspended workload suspended, for as long as the wait-out lasted (hours), even on GPUs the waiting
service cannot use. A held pool is not waiting to be given back: it is kept for the waiting replicas, which were
placed first, so what is left free is room they cannot use. Pools that are merely not given back yet (their idle
timer running) still keep training suspended.
"""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision
from autoscaler.core.reasons import Reason
from tests.core.test_arbitrate import NOW, full_cluster, job, replica
from tests.core.test_arbitrate_wait_out import RATE_CHAT, RISK_10, flat

A100_POOL = BurstPool("a100", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, min_nodes=0, max_nodes=2)
H100_POOL = replace(A100_POOL, name="h100", gpu_type="H100")
STOPPED = "Job/ml/stopped"


def _tick(pool: BurstPool) -> tuple[list[str], list[str], str]:
    """chat (A100, 8 GPUs a replica) one replica short at its P99, cheaper to wait out; a node ``b0`` of ``pool``
    runs one 1-GPU pod that would fit in the 4 GPUs free on on-prem ``n4`` (spare, were nothing short); a gang this
    controller suspended an hour ago fits on the idle on-prem H100 node ``h4``. The resumed workloads, the notes and
    the detail of chat's chosen option."""
    base = full_cluster()
    big = replace(RATE_CHAT, gpus_per_replica=8)
    chat = replace(replica(0, "n1"), gpus=8)
    filler = PodInfo("ml", "filler", "n4", 4, 100, "Running", True, "Deployment", "filler")
    stray = PodInfo("inference", "embed-0", "b0", 1, 1000, "Running", True, "Deployment", "embed")
    snapshot = replace(
        base,
        pods=(chat, *(p for p in base.pods if p.owner_kind != "Deployment"), filler, stray),
        nodes=(
            *base.nodes,
            NodeInfo("n4", 8, "A100", "onprem", True),
            NodeInfo("h4", 8, "H100", "onprem", True),
            NodeInfo("b0", 8, pool.gpu_type, pool.name, True),
        ),
        deployments=(DeploymentInfo("inference", "chat", 2, 1, gpu_product="A100", gpus_per_pod=8),),
        workloads=(*base.workloads, replace(job("stopped", suspended=True, by_us=NOW - 3600.0), gpu_product="H100")),
    )
    # waiting costs 1 a GPU-hour: an hour of 8 GPUs short is cheaper than stopping a gang
    config = replace(RISK_10, slo_risk_per_gpu_hour=1.0, pools=(pool,), burst_idle_cooldown_s=600.0)
    decision = ScaleDecision(big.key, 1, 2, Reason.FORECAST_FLOOR, "")
    arb = ArbitrationInput(NOW, snapshot, {big.key: big}, [decision], {big.key: (flat(2.0, NOW), 0.99, 90.0)})
    state = replace(CapacityState(), resumable_since={STOPPED: NOW - 7200.0})
    actions, report, _ = arbitrate(arb, state, config)
    [option] = [o for o in report.options if o.chosen and o.service == big.key]
    resumed = [f"{a.kind}/{a.namespace}/{a.name}" for a in actions if isinstance(a, ResumeWorkload)]
    return resumed, list(report.notes), option.detail


def test_training_resumes_on_gpus_the_waiting_service_cannot_use_while_its_pool_is_held() -> None:
    resumed, notes, detail = _tick(A100_POOL)
    assert "waited out" in detail
    assert any("a100: its nodes could host inference/chat" in n for n in notes), notes
    assert resumed == [STOPPED], notes


def test_a_pool_only_not_given_back_yet_still_keeps_training_suspended() -> None:
    """The control: an H100 burst node is no room for chat (not held); it is spare, its 600 s idle timer just
    started, and the rule stands -- burst nodes are given back first: the gang waits until the node is gone (resumed
    now, it would take free GPUs the node's pod could move to)."""
    resumed, notes, _ = _tick(H100_POOL)
    assert resumed == []
    assert any("burst nodes are given back first" in n for n in notes), notes
