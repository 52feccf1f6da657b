"""The contended hold counts the whole gang a hole would start, not its one pod (stop 43).

The contended hold (``core.tick.read_forecasts``) keeps a forecasting service from a scale-down that opens a hole for
waiting lower-priority GPU work when the replicas the forecast wants back within the window would then find no free
GPUs: the work started in the hole would be stopped at the next rise. It counted the work as the one pod the hole
fits (``hole_for_waiting_work``'s size). A gang starts whole: a 2 x 8-GPU job whose second pod already had a node
took the hole *and* that node, every free GPU, and the next window edge preempted it -- in the mixed scenario with
``capacity.choose_scale_down_replicas`` on, a 16-GPU gang started and stopped at every 10-minute window edge for
hours. Now the hold counts the largest waiting gang with pods of the hole's size that the hole completes (its pods
need a node each with that room: the hole and the nodes that have it already).
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo, waiting_gpu_work
from autoscaler.core.model import ControllerState
from autoscaler.core.tick import ForecastReadConfig, TickConfig, decide_tick
from forecast.types import Forecast
from tests.core.test_review39_predictive import CHAT, CHAT_NO_WINDOW, _desired, _earned, _tick

# 24 req/s now and within the cold start (8 replicas at 3.2), 38 req/s from minute 20 (12 replicas): the service runs
# 10, the floor and the metric ask for 8, the forecast wants 12 within the contended window (1,800 s).
RISE = Forecast(start=0.0, step_s=60.0, quantiles={0.5: [24.0] * 20 + [38.0] * 10, 0.99: [24.0] * 20 + [38.0] * 10},
                model="rise")  # fmt: skip
NODES = tuple(NodeInfo(n, 8, "A100", None, True) for n in ("n1", "n2", "n3"))


def _chat(node: str, count: int, first: int, cost: int = 0) -> tuple[PodInfo, ...]:
    return tuple(
        PodInfo("ml", f"chat-{first + i}", node, 1, 1000, "Running", True, "Deployment", "chat", ready_at=0.0,
                deletion_cost=cost)
        for i in range(count)
    )  # fmt: skip


def _job(name: str, pods: tuple[int, ...]) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", name, f"job/ml/{name}", True, 100, pods, suspended_by_us_at=-60.0)


def _decide(workloads: tuple[WorkloadInfo, ...], n3_used: int = 0) -> int:
    """chat: 8 replicas on n1 (full), 2 on n2 (6 free) marked to go first; n3 has ``8 - n3_used`` free GPUs (the rest
    held by a higher-priority job). Removing n2's 2 replicas opens an 8-GPU hole there."""
    pods = (*_chat("n1", 8, 0), *_chat("n2", 2, 8, cost=-1))
    if n3_used:
        pods += (PodInfo("ml", "other", "n3", n3_used, 5000, "Running", True, "Job", "other"),)
    snapshot = ClusterSnapshot(0.0, pods=pods, nodes=NODES, workloads=workloads)
    tick = _tick({CHAT.key: CHAT_NO_WINDOW}, {CHAT.key: _earned(CHAT, RISE)}, {CHAT.key: (10, 24.0)}, snapshot)
    plan, _ = decide_tick(tick, ControllerState(), TickConfig(ForecastReadConfig(contended_hold_s=1800.0)))
    return _desired(plan, CHAT.key)


@pytest.mark.parametrize(
    ("workloads", "n3_used", "desired", "why"),
    [
        pytest.param(
            (_job("gang", (8, 8)),),
            0,
            10,
            "the 2-pod gang would start on the hole and n3, taking all 16 free GPUs: the 2 replicas wanted back would "
            "stop it; held at 9, one replica short of opening the hole, which is within the scale-down tolerance of "
            "10: no scale-down (defect: scaled to 8)",
            id="a gang the hole completes",
        ),
        pytest.param(
            (_job("solo", (8,)),),
            0,
            8,
            "a one-pod job takes the hole's 8 GPUs and leaves n3's 8 for the comeback: nothing to hold",
            id="a one-pod job",
        ),
        pytest.param(
            (_job("big", (8, 8, 8)),),
            0,
            8,
            "a 3-pod gang needs three nodes with 8 free: the hole and n3 are two, it cannot start; the comeback finds "
            "room",
            id="a gang the hole does not complete",
        ),
        pytest.param(
            (_job("gang", (8, 8)),),
            4,
            8,
            "n3 has only 4 free: the hole is the gang's only node with 8, it cannot start; the hole's 8 and the "
            "comeback's 2 fit the 10 free GPUs",
            id="a gang without a second node",
        ),
        pytest.param(
            (_job("solo", (8,)), _job("gang", (8, 8))),
            0,
            10,
            "either may start in the hole: the larger one is what the comeback would have to stop",
            id="the largest gang that could start",
        ),
    ],
)
def test_the_contended_hold_counts_the_gang_the_hole_would_start(
    workloads: tuple[WorkloadInfo, ...], n3_used: int, desired: int, why: str
) -> None:
    assert _decide(workloads, n3_used) == desired, why


def test_without_waiting_work_the_service_follows_its_floor() -> None:
    """The reference: nothing waits, no hole, no contended hold."""
    assert _decide(()) == 8


def test_waiting_gpu_work_carries_the_gpus_of_the_whole_gang() -> None:
    """A suspended workload takes all its pods' GPUs; the pending pods of one gang take theirs together; a lone
    pending pod its own."""
    gang_pods = tuple(
        dataclasses.replace(
            PodInfo("ml", f"g-{i}", None, 8, 100, "Pending", False, "Job", "g"), gang="job/ml/g"
        )
        for i in range(2)
    )  # fmt: skip
    lone = PodInfo("ml", "lone", None, 4, 100, "Pending", False, "Job", "lone")
    snapshot = ClusterSnapshot(0.0, pods=(*gang_pods, lone), nodes=NODES, workloads=(_job("suspended", (8, 8, 4)),))
    works = waiting_gpu_work(snapshot)
    assert sorted((w.gpus, w.takes) for w in works) == [(4, 4), (8, 16), (8, 16), (8, 20)]


def _pending(gang: str, sizes: tuple[int, ...], min_available: int | None = None) -> tuple[PodInfo, ...]:
    return tuple(
        dataclasses.replace(
            PodInfo("ml", f"{gang}-{i}", None, gpus, 100, "Pending", False, "Job", gang),
            gang=f"job/ml/{gang}", gang_min_available=min_available,
        )
        for i, gpus in enumerate(sizes)
    )  # fmt: skip


def test_a_gang_one_of_whose_pods_no_node_could_hold_waits_for_no_hole() -> None:
    """A 2-pod gang whose second pod asks for 16 GPUs on 8-GPU nodes never starts: neither of its pods is waiting
    work (it used to keep its 8-GPU pod, counted as a gang of 8 + 16 the hole completes)."""
    works = waiting_gpu_work(ClusterSnapshot(0.0, pods=_pending("g", (8, 16)), nodes=NODES))
    assert works == []


@pytest.mark.parametrize(
    ("min_available", "running", "needed"),
    [(None, 0, 3), (2, 0, 2), (2, 1, 1), (3, 2, 1), (1, 0, 1), (2, 2, 1)],
)
def test_a_pending_gang_needs_its_min_available_less_its_pods_placed(
    min_available: int | None, running: int, needed: int
) -> None:
    pods = _pending("g", (8, 8, 8), min_available)
    placed = tuple(
        dataclasses.replace(p, name=f"run-{i}", node="n1", phase="Running") for i, p in enumerate(pods[:running])
    )
    works = waiting_gpu_work(ClusterSnapshot(0.0, pods=(*pods[running:], *placed), nodes=NODES))
    assert {w.needed_pods for w in works} == {needed}
    assert {w.gang for w in works} == {(8,) * (3 - running)}
