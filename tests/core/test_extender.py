"""The scheduler extender's pure part: a filter that passes every node, FGD scores spread to 0..10, fail open."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.extender import (
    MAX_EXTENDER_PRIORITY,
    ExtenderConfig,
    FailOpen,
    PlacementView,
    PodRequest,
    fgd_scores,
    fgd_scores_per_node,
    filter_nodes,
    once_per_node_state,
    prioritize_nodes,
    spread,
)
from autoscaler.core.fragmentation import GpuNode, Task, TaskMix
from autoscaler.core.placement_score import score_nodes

A100 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"
NOW = 1_000_000.0
CONFIG = ExtenderConfig(max_snapshot_age_s=60)


def node(name: str, gpus: int, product: str | None) -> NodeInfo:
    return NodeInfo(name, gpus, product, pool=None, ready=True)


def pod(name: str, node_name: str | None, gpus: int, phase: str = "Running", owner: str | None = None) -> PodInfo:
    return PodInfo("ml", name, node_name, gpus, 0, phase, phase == "Running", "Deployment" if owner else None, owner)


def snapshot(time: float = NOW) -> ClusterSnapshot:
    """a100-0: 1 of 8 GPUs free; a100-1: 4 of 8; l4-0: 4 of 4. The mix: 7-GPU and 4-GPU tasks, once each."""
    return ClusterSnapshot(
        time,
        nodes=(node("a100-0", 8, A100), node("a100-1", 8, A100), node("l4-0", 4, L4), node("cpu-0", 0, None)),
        pods=(
            pod("big", "a100-0", 7),
            pod("half", "a100-1", 4),
            pod("done", "l4-0", 4, phase="Succeeded"),  # gone: frees its GPUs, not in the mix
            pod("web", "cpu-0", 0),
        ),
    )


NODES = ("a100-0", "a100-1", "l4-0", "cpu-0")


def want(gpus: int, products: Sequence[str] | None = None) -> PodRequest:
    return PodRequest("ml", "p", gpus, None if products is None else frozenset(products))


@pytest.mark.parametrize(
    ("case", "request_"),
    [
        ("any type, 1 GPU", want(1)),
        # kube-scheduler's NodeAffinity already passed l4-0 on its newer cache: relabelled since our read
        ("A100 only", want(1, [A100])),
        # its NodeResourcesFit already found 8 GPUs on l4-0: more GPUs reported since our read
        ("8 GPUs on a node the snapshot shows with 4", want(8)),
        ("free GPUs are never filtered on", want(4, [A100])),
        ("a pod asking for no GPU", want(0, [L4])),
    ],
)
def test_filter_passes_every_node_the_scheduler_sends(case: str, request_: PodRequest) -> None:
    """The scheduler sends only nodes its own filters passed on a cache newer than the snapshot: a rule of ours could
    only turn one away where the snapshot is behind."""
    out = filter_nodes(PlacementView.of(snapshot()), request_, NODES, NOW, CONFIG)
    assert out.passed == NODES, case
    assert out.fail_open is None


def test_nodes_the_snapshot_does_not_know_pass_and_score_zero() -> None:
    view = PlacementView.of(snapshot())
    assert filter_nodes(view, want(1, [A100]), ["new-node"], NOW, CONFIG).passed == ("new-node",)
    scores = dict(prioritize_nodes(view, want(1), ["new-node", "a100-0"], NOW, CONFIG).scores)
    assert scores == {"new-node": 0, "a100-0": MAX_EXTENDER_PRIORITY}


@pytest.mark.parametrize(
    ("case", "view_time", "request_", "why"),
    [
        ("no snapshot yet", None, want(1, [A100]), FailOpen.NO_SNAPSHOT),
        ("snapshot older than the max age", NOW - 61, want(1, [A100]), FailOpen.STALE_SNAPSHOT),
        ("unreadable pod", NOW, None, FailOpen.BAD_POD),
    ],
)
def test_fails_open(case: str, view_time: float | None, request_: PodRequest | None, why: FailOpen) -> None:
    view = None if view_time is None else PlacementView.of(snapshot(view_time))
    filtered = filter_nodes(view, request_, NODES, NOW, CONFIG)
    assert filtered.passed == NODES and filtered.fail_open is why, case
    scored = prioritize_nodes(view, request_, NODES, NOW, CONFIG)
    assert scored.scores == tuple((n, 0) for n in NODES) and scored.fail_open is why, case


def test_a_snapshot_at_the_max_age_is_still_used() -> None:
    view = PlacementView.of(snapshot(NOW - 60))
    assert filter_nodes(view, want(1, [A100]), NODES, NOW, CONFIG).fail_open is None


def test_non_gpu_pod_all_nodes_equal() -> None:
    out = prioritize_nodes(PlacementView.of(snapshot()), want(0), NODES, NOW, CONFIG)
    assert out.fail_open is None and {s for _, s in out.scores} == {0}


def test_the_less_fragmenting_node_scores_higher() -> None:
    # A 1-GPU pod: on a100-0 it uses the last GPU no 7- or 4-GPU task could use (fragmentation -1000 milli-GPU); on
    # a100-1 or l4-0 it leaves 3 GPUs where a 4-GPU task fitted (+1000). Least-allocated would pick the emptiest.
    out = dict(prioritize_nodes(PlacementView.of(snapshot()), want(1), NODES, NOW, CONFIG).scores)
    assert out["a100-0"] == MAX_EXTENDER_PRIORITY
    assert out["a100-0"] > out["a100-1"] and out["a100-0"] > out["l4-0"]
    assert out["cpu-0"] == 0  # no GPU: does not fit
    # a 4-GPU pod: l4-0 and a100-1 are filled whole (no fragment left). a100-0 shows 1 GPU free, but the scheduler
    # sent it, so 3 more were freed since the read: scored with exactly 4 free, it is filled whole too -- not last
    four = dict(prioritize_nodes(PlacementView.of(snapshot()), want(4), NODES, NOW, CONFIG).scores)
    assert four["a100-0"] == four["a100-1"] == four["l4-0"] == MAX_EXTENDER_PRIORITY
    assert four["cpu-0"] == 0  # no GPUs in all: does not fit even so
    # 8 GPUs: only the A100s have 8 GPUs in all in the snapshot; both are scored as emptied for the pod. l4-0 (4) is
    # offered anyway: the scheduler found 8 allocatable there on its newer cache (GPUs unhealthy at the read), so it
    # is scored with them (stop 38 review), not as "does not fit"; cpu-0, with no GPU in the snapshot, still is
    eight = dict(prioritize_nodes(PlacementView.of(snapshot()), want(8), NODES, NOW, CONFIG).scores)
    assert eight["l4-0"] > 0 and eight["a100-0"] > 0 and eight["a100-1"] > 0 and eight["cpu-0"] == 0


def test_gpu_types_of_the_mix_come_from_the_owning_deployment() -> None:
    snap = ClusterSnapshot(
        NOW,
        deployments=(DeploymentInfo("ml", "chat", 1, 1, gpu_product=L4),),
        nodes=(node("l4-0", 4, L4),),
        pods=(pod("chat-1", "l4-0", 1, owner="chat"),),
    )
    (cls,) = PlacementView.of(snap).mix.classes
    assert cls.task.gpu_types == frozenset({L4}) and cls.task.gpu_count == 1


def test_the_scorer_is_one_swappable_call() -> None:
    seen: list[tuple[tuple[str, ...], Task, TaskMix]] = []

    def prefer_last(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
        seen.append((tuple(n.name for n in nodes), task, mix))
        return [i * 10 for i in range(len(nodes))]

    out = prioritize_nodes(PlacementView.of(snapshot()), want(2), NODES, NOW, CONFIG, scorer=prefer_last)
    assert [s for _, s in out.scores] == [1, 4, 7, 10]
    assert len(seen) == 1 and seen[0][0] == NODES and seen[0][1].gpu_count == 2


def test_an_empty_mix_uses_the_pod_itself() -> None:
    snap = ClusterSnapshot(NOW, nodes=(node("a", 8, A100), node("b", 2, A100)))
    # nothing runs: the only known task is the pod itself, and whole 2-GPU blocks fragment neither node
    out = dict(prioritize_nodes(PlacementView.of(snap), want(2), ["a", "b"], NOW, CONFIG).scores)
    assert out == {"a": 10, "b": 10}


def test_spread() -> None:
    assert spread([None, None]) == [0, 0]
    assert spread([50, 50, None]) == [10, 10, 0]
    assert spread([26, 73, 50]) == [1, 10, 6]
    assert all(0 <= s <= MAX_EXTENDER_PRIORITY for s in spread([0, 100, 37, None]))


def test_config_and_request_validation() -> None:
    with pytest.raises(ValueError):
        ExtenderConfig(max_snapshot_age_s=0)
    with pytest.raises(ValueError):
        PodRequest("ml", "p", -1)
    with pytest.raises(ValueError):
        PodRequest("ml", "p", 1, frozenset())


def test_scores_once_per_node_state_equal_per_node() -> None:
    import random

    rng = random.Random(3)
    nodes = [
        GpuNode(f"n{i}", 10**9, 10**9, rng.choice([A100, L4]), tuple(rng.choice([0, 1000]) for _ in range(8)))
        for i in range(200)
    ]
    mix = TaskMix.of([(Task(0, 0, 1000, 1), 3.0), (Task(0, 0, 1000, 4, frozenset({A100})), 1.0)])
    fgd_plus = once_per_node_state(score_nodes)
    for task in (Task(0, 0, 1000, 1), Task(0, 0, 1000, 2, frozenset({L4})), Task(0, 0, 1000, 8)):
        assert fgd_scores(nodes, task, mix) == fgd_scores_per_node(nodes, task, mix)
        assert fgd_plus(nodes, task, mix) == score_nodes(nodes, task, mix)  # the FGD+ scorer, rescaled over the set


def test_the_fgd_plus_scorer_plugs_in() -> None:
    out = prioritize_nodes(
        PlacementView.of(snapshot()), want(1), NODES, NOW, CONFIG, scorer=once_per_node_state(score_nodes)
    )
    scores = dict(out.scores)
    assert scores["cpu-0"] == 0 and max(scores.values()) == MAX_EXTENDER_PRIORITY
