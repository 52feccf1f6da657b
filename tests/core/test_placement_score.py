"""This project's placement scorer (autoscaler.core.placement_score, "FGD+"): the fill fragmentation, the node it
prefers on hand-built clusters, None where a pod does not fit, and the extender's 0..100 scale."""

from __future__ import annotations

import pytest

from autoscaler.core.fragmentation import GpuNode, Task, TaskMix, node_fragmentation
from autoscaler.core.placement_score import (
    MAX_SCORE,
    QUANTUM_MILLI,
    best_gain,
    combined_fragmentation,
    fill_capacity,
    fill_fragmentation,
    node_keys,
    placement_gain,
    quantise,
    score_nodes,
    task_fill_fragment_milli,
    typical_memory_mix,
)

SHARE = Task(3_152, 0, 810, 1)  # openb's most popular request: 0.81 GPU, ~3 CPUs
WHOLE = Task(11_300, 0, 1000, 1)  # one GPU, 11.3 CPUs
HALF = Task(8_000, 0, 470, 1)
CPU_ONLY = Task(32_000)
MIX = TaskMix.of([(SHARE, 3), (WHOLE, 4), (HALF, 2), (Task(12_500), 1)])


def node(name: str, cpu: int, gpus: tuple[int, ...], gpu_type: str | None = "G2", memory: int = 262_144) -> GpuNode:
    return GpuNode(name, cpu, memory, gpu_type if gpus else None, gpus)


@pytest.mark.parametrize(
    ("free", "cpu", "task", "expected"),
    [
        ((1000, 1000), 96_000, SHARE, 2),  # one per GPU, 190 left on each
        ((1000, 1000), 96_000, HALF, 4),  # two per GPU
        ((1000, 530, 190), 96_000, HALF, 3),
        ((1000,) * 8, 20_000, WHOLE, 1),  # CPU runs out first
        ((1000,) * 8, 96_000, Task(4_000, 0, 1000, 2), 4),
        ((1000, 1000, 1000), 96_000, Task(4_000, 0, 1000, 2), 1),
        ((1000,), 96_000, CPU_ONLY, 0),  # a task asking for no GPU uses none of it
        ((1000,), 96_000, Task(1_000, 0, 500, 1, frozenset({"T4"})), 0),  # wrong GPU type
    ],
)
def test_fill_capacity_counts_tasks_placed_one_after_another(
    free: tuple[int, ...], cpu: int, task: Task, expected: int
) -> None:
    n = node("n", cpu, free)
    assert fill_capacity(n, task) == expected
    assert task_fill_fragment_milli(n, task) == sum(free) - expected * task.total_gpu_milli


def test_fill_fragmentation_sees_cpu_stranding_before_fgd_does() -> None:
    rich, poor = node("rich", 96_000, (1000,) * 8), node("poor", 20_000, (1000,) * 8)
    mix = TaskMix.of([(WHOLE, 1)])
    assert node_fragmentation(poor, mix) == node_fragmentation(rich, mix) == 0  # FGD: the next task fits both
    assert fill_fragmentation(rich, mix) == 0
    assert fill_fragmentation(poor, mix) == 7_000  # only one 11.3-CPU task fits: 7 GPUs stranded
    assert combined_fragmentation(poor, mix) == 7_000


# (case, nodes, task, the node the scorer must prefer)
PREFERENCES = [
    (
        "a share fills a partly used GPU rather than open a fresh one",
        [node("fresh", 96_000, (1000, 1000)), node("partly", 96_000, (840, 1000))],
        SHARE,
        "partly",
    ),
    (
        "a CPU-only pod goes where it strands no GPU",
        [node("gpus", 40_000, (1000,) * 4), node("cpus", 64_000, ())],
        CPU_ONLY,
        "cpus",
    ),
    (
        "a whole GPU where CPU is plentiful keeps the CPU-poor node's GPUs for small-CPU shares",
        [node("poor", 14_000, (1000, 1000)), node("rich", 96_000, (1000, 1000))],
        WHOLE,
        "rich",
    ),
    (
        "a half-GPU pairs with the GPU already half used",
        [node("fresh", 96_000, (1000, 1000)), node("half", 96_000, (530, 1000))],
        HALF,
        "half",
    ),
]


@pytest.mark.parametrize(("case", "nodes", "task", "preferred"), PREFERENCES, ids=[p[0] for p in PREFERENCES])
def test_the_scorer_prefers_the_less_fragmenting_node(
    case: str, nodes: list[GpuNode], task: Task, preferred: str
) -> None:
    scores = score_nodes(nodes, task, MIX)
    best = max((s, n.name) for s, n in zip(scores, nodes, strict=True) if s is not None)
    assert best[1] == preferred, (case, scores)
    assert scores[[n.name for n in nodes].index(preferred)] == MAX_SCORE
    others = [s for s, n in zip(scores, nodes, strict=True) if n.name != preferred]
    assert all(s is not None and s < MAX_SCORE for s in others), (case, scores)
    gains = {n.name: placement_gain(n, task, MIX) for n in nodes}
    assert gains[preferred] == max(gains.values())  # the preference is the combined fragmentation's


@pytest.mark.parametrize(
    ("blocked", "task"),
    [
        (node("no-cpu", 1_000, (1000, 1000)), SHARE),
        (node("no-memory", 96_000, (1000,), memory=1), Task(1_000, 4_096, 500, 1)),
        (node("no-gpu", 96_000, (800, 100)), SHARE),
        (node("too-few-gpus", 96_000, (1000, 900)), Task(1_000, 0, 1000, 2)),
        (node("wrong-type", 96_000, (1000,), gpu_type="P100"), Task(1_000, 0, 500, 1, frozenset({"T4"}))),
        (node("cpu-node", 96_000, ()), WHOLE),
    ],
)
def test_none_where_the_task_does_not_fit(blocked: GpuNode, task: Task) -> None:
    roomy = node("roomy", 96_000, (1000, 1000), gpu_type="T4")
    assert score_nodes([blocked, roomy], task, MIX) == [None, MAX_SCORE]
    assert node_keys([blocked], task, MIX) == [None] and best_gain(blocked, task, MIX) is None
    assert score_nodes([blocked], task, MIX) == [None]


def test_scores_are_integers_0_to_100_ordered_as_the_gains() -> None:
    nodes = [
        node("a", 96_000, (1000,) * 8),
        node("b", 96_000, (840,) + (1000,) * 7),
        node("c", 12_000, (1000, 1000)),
        node("d", 96_000, (190, 190)),
        node("e", 4_000, (1000, 530)),
    ]
    scores = score_nodes(nodes, SHARE, MIX)
    keys = node_keys(nodes, SHARE, MIX)
    assert scores[3] is None and keys[3] is None
    present = [(k, s) for k, s in zip(keys, scores, strict=True) if s is not None]
    assert all(isinstance(s, int) and 0 <= s <= MAX_SCORE for _, s in present)
    assert max(s for _, s in present) == MAX_SCORE and min(s for _, s in present) == 0
    for k1, s1 in present:
        for k2, s2 in present:
            if k1 > k2:
                assert s1 >= s2
    assert score_nodes(nodes[:1], SHARE, MIX) == [MAX_SCORE]  # one node, or all tied: 100


def test_gains_are_quantised_to_a_tenth_of_a_gpu() -> None:
    assert QUANTUM_MILLI == 100
    assert [quantise(g) for g in (0, 99.999, 100, -0.5, -100, 250)] == [0, 0, 1, -1, -1, 2]
    n = node("n", 96_000, (840, 1000))
    key, gpus = best_gain(n, SHARE, MIX) or (None, None)
    assert gpus == (0,)  # the partly used GPU
    assert key == quantise(placement_gain(n, SHARE, MIX, (0,)))


def test_typical_memory_mix_sets_each_class_to_its_pods_median_memory() -> None:
    mix = TaskMix.of([(Task(3_152, 0, 810, 1), 3), (Task(11_300, 0, 1000, 1), 1), (Task(500, 0, 100, 1), 1)])
    seen = [Task(3_152, m, 810, 1) for m in (1_000, 3_000, 9_000)] + [Task(11_300, m, 1000, 1) for m in (10, 20)]
    typical = typical_memory_mix(mix, seen)
    assert [t.memory_mib for t, _ in typical.popularities()] == [3_000, 15, 0]  # median; unseen class unchanged
    assert [p for _, p in typical.popularities()] == [p for _, p in mix.popularities()]
    assert [(t.cpu_milli, t.gpu_milli, t.gpu_count) for t, _ in typical.popularities()] == [
        (t.cpu_milli, t.gpu_milli, t.gpu_count) for t, _ in mix.popularities()
    ]
    # memory now counts: a node with GPUs and CPU but 2 GiB left fits no 0.81-GPU pod of the typical mix
    short = node("short", 96_000, (1000, 1000), memory=2_000)
    assert fill_capacity(short, typical.classes[0].task) == 0 < fill_capacity(short, mix.classes[0].task)
