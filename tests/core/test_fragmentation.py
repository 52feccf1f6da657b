"""FGD's fragmentation measure (autoscaler.core.fragmentation): hand-computed cases, one per case of the paper, and
properties over random nodes and tasks."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.fragmentation import (
    GPU_MILLI,
    FragmentCase,
    GpuNode,
    Task,
    TaskMix,
    allocate,
    candidate_gpus,
    cluster_fragmentation,
    default_gpus,
    fgd_placement,
    fgd_score,
    fits,
    fragment_case,
    fragmentation_by_case,
    fragmentation_ratio,
    learn_task_mix,
    move_delta,
    node_fragmentation,
    parse_gpu_types,
    placement_delta,
    release,
    task_fragment_milli,
)

# A T4 node with 16 CPUs, 64 GiB free and four GPUs: one whole, one half, 0.3 of one and one fully used.
NODE = GpuNode("n1", cpu_milli=16_000, memory_mib=65_536, gpu_type="T4", gpu_free_milli=(1000, 500, 300, 0))
FREE = 1800

HALF = Task.of(4_000, 8_192, 0.5)
ONE = Task.of(4_000, 8_192, 1)

# (case name, task, expected case, expected fragment in milli-GPU) -- each computed by hand on NODE.
CASES = [
    ("half GPU fits: GPUs under 0.5 free are fragments", HALF, FragmentCase.SATISFIED, 300 + 0),
    ("0.2 GPU fits: every GPU with any free holds it", Task.of(4_000, 0, 0.2), FragmentCase.SATISFIED, 0),
    ("0.3 GPU fits exactly on the 0.3 GPU", Task.of(4_000, 0, 0.3), FragmentCase.SATISFIED, 0),
    ("one whole GPU fits: partly used GPUs are fragments", ONE, FragmentCase.SATISFIED, 500 + 300),
    ("two whole GPUs: only one is free (lack GPU)", Task.of(4_000, 0, 2), FragmentCase.LACK_GPU, FREE),
    ("0.6 GPU: no GPU has 0.6 left beside the whole one", Task.of(4_000, 0, 0.6), FragmentCase.SATISFIED, 800),
    ("GPUs fit, CPU does not (lack CPU)", Task.of(32_000, 0, 0.5), FragmentCase.LACK_CPU, FREE),
    ("GPUs fit, memory does not (lack CPU/memory)", Task.of(4_000, 131_072, 0.5), FragmentCase.LACK_CPU, FREE),
    ("neither fits (lack both)", Task.of(32_000, 0, 2), FragmentCase.LACK_BOTH, FREE),
    ("wrong GPU type (no access)", Task.of(4_000, 0, 0.5, "V100M32"), FragmentCase.NO_ACCESS, FREE),
    ("one of the accepted types", Task.of(4_000, 0, 0.5, "V100M32|T4"), FragmentCase.SATISFIED, 300),
    ("a task asking for no GPU sees all free GPU as fragment", Task.of(1_000, 0, 0), FragmentCase.NO_GPU_REQUEST, FREE),
]


@pytest.mark.parametrize(("name", "task", "case", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_fragment_of_one_task_on_one_node(name: str, task: Task, case: FragmentCase, fragment: int) -> None:
    assert fragment_case(NODE, task) is case
    assert task_fragment_milli(NODE, task) == fragment
    assert fits(NODE, task) == (case in (FragmentCase.SATISFIED, FragmentCase.NO_GPU_REQUEST))  # CPU fits here


def test_cpu_only_node_has_nothing_to_fragment() -> None:
    cpu_node = GpuNode("cpu", 32_000, 131_072)
    assert fragment_case(cpu_node, HALF) is FragmentCase.LACK_GPU
    assert fragment_case(cpu_node, Task.of(1_000, 0, 0.5, "T4")) is FragmentCase.NO_ACCESS
    assert task_fragment_milli(cpu_node, HALF) == 0
    assert fits(cpu_node, Task.of(1_000))  # a CPU task runs there


MIX = TaskMix.of([(HALF, 3.0), (ONE, 1.0)])  # popularity 0.75 and 0.25


def test_node_fragmentation_is_the_popularity_weighted_fragment() -> None:
    assert node_fragmentation(NODE, MIX) == pytest.approx(0.75 * 300 + 0.25 * 800)  # 425
    assert node_fragmentation(NODE, TaskMix(())) == 0
    by_case = fragmentation_by_case(NODE, MIX)
    assert sum(by_case.values()) == pytest.approx(FREE)
    assert by_case[FragmentCase.LACK_GPU] == pytest.approx(425)  # satisfied tasks' too-small GPUs
    assert by_case[FragmentCase.SATISFIED] == pytest.approx(FREE - 425)


def test_cluster_total_and_ratio() -> None:
    empty = GpuNode("n2", 16_000, 65_536, "T4", (1000, 1000))
    assert node_fragmentation(empty, MIX) == 0  # both tasks fit whole free GPUs
    assert cluster_fragmentation([NODE, empty], MIX) == pytest.approx(425)
    assert fragmentation_ratio([NODE, empty], MIX) == pytest.approx(425 / (FREE + 2000))
    assert fragmentation_ratio([GpuNode("full", 1, 1, "T4", (0,))], MIX) == 0.0


@pytest.mark.parametrize(
    ("gpus", "delta"),
    [
        ((2,), 0.75 * 0 + 0.25 * 500 - 425),  # 0.3 GPU filled: [1000, 500, 0, 0]
        ((1,), 0.75 * 500 + 0.25 * 500 - 425),  # [1000, 200, 300, 0]: the half GPU is broken
        ((0,), 0.75 * 300 + 0.25 * 1500 - 425),  # [700, 500, 300, 0]: no whole GPU left for ONE
    ],
)
def test_placement_delta_per_gpu(gpus: tuple[int, ...], delta: float) -> None:
    assert placement_delta(NODE, Task.of(1_000, 0, 0.3), MIX, gpus) == pytest.approx(delta)


def test_fgd_picks_the_gpu_that_fragments_least_and_scores_it_like_the_authors() -> None:
    placement = fgd_placement(NODE, Task.of(1_000, 0, 0.3), MIX)
    assert placement is not None
    assert placement.gpus == (2,)
    assert placement.delta_milli == pytest.approx(-300)
    assert fgd_score(placement.delta_milli) == 57  # int(100 * sigmoid(0.3))
    assert fgd_score(0.0) == 50
    assert fgd_score(2_000.0) == 11  # int(100 * sigmoid(-2))
    assert fgd_placement(NODE, Task.of(1_000, 0, 4), MIX) is None


def test_cpu_taken_by_a_placement_counts() -> None:
    # the node keeps 16 CPUs; a 14-CPU task leaves 2, and then neither mix task (4 CPUs) fits: all free is fragment
    big_cpu = Task.of(14_000, 0, 0)
    assert placement_delta(NODE, big_cpu, MIX) == pytest.approx(FREE - 425)


def test_default_gpus_are_the_tightest_share_and_the_first_whole_ones() -> None:
    assert default_gpus(NODE, Task.of(0, 0, 0.25)) == (2,)
    assert default_gpus(NODE, Task.of(0, 0, 0.5)) == (1,)
    two = GpuNode("n", 1_000, 1_000, "T4", (0, 1000, 400, 1000, 1000))
    assert default_gpus(two, Task.of(0, 0, 2)) == (1, 3)
    assert candidate_gpus(two, Task.of(0, 0, 0.4)) == ((1,), (2,), (3,), (4,))
    assert default_gpus(two, Task.of(0, 0, 4)) is None


def test_move_delta() -> None:
    mix = TaskMix.of([(Task.of(1_000, 0, 0.5), 1.0)])
    task = Task.of(1_000, 0, 0.3)
    source = GpuNode("s", 8_000, 8_000, "T4", (700, 1000))  # the task runs on GPU 0
    target = GpuNode("t", 8_000, 8_000, "T4", (300, 0))  # 0.3 free that no 0.5 task can use
    assert node_fragmentation(source, mix) == 0
    assert node_fragmentation(target, mix) == 300
    assert move_delta(source, target, task, (0,), mix) == pytest.approx(-300)
    with pytest.raises(ValueError):
        move_delta(source, source, task, (0,), mix)


def test_task_and_node_constructors() -> None:
    assert Task.of(1_000, 0, 0.5) == Task(1_000, 0, 500, 1)
    assert Task.of(1_000, 0, 2).total_gpu_milli == 2 * GPU_MILLI
    assert Task.of(1_000, 0, 0.25).gpu == 0.25 and Task.of(1_000, 0, 4).gpu == 4.0
    assert Task.of(1_000, 0, 1, ["A100", " "]).gpu_types == frozenset({"A100"})
    assert parse_gpu_types("") is None and parse_gpu_types("a|b") == frozenset({"a", "b"})
    for bad in (1.5, -1.0, 0.0001):
        with pytest.raises(ValueError):
            Task.of(1_000, 0, bad)
    with pytest.raises(ValueError):
        Task(1_000, 0, 500, 2)  # a share is on one GPU only
    with pytest.raises(ValueError):
        Task(1_000, 0, 0, 1)
    node = GpuNode.from_fractions("f", 1_000, 1_000, "T4", [1.0, 0.25, 0.0])
    assert node.gpu_free_milli == (1000, 250, 0) and node.gpu_free == (1.0, 0.25, 0.0)
    assert node.whole_free_gpus == 1
    with pytest.raises(ValueError):
        GpuNode("bad", 1, 1, "T4", (1200,))


def test_learn_task_mix_keeps_the_most_popular_until_the_coverage() -> None:
    a, b = Task.of(4_000, 0, 0.5), Task.of(8_000, 0, 1)
    c_small, c_large = Task.of(1_000, 0, 0.25), Task.of(2_000, 0, 0.25)
    tasks = [a] * 5 + [b] * 3 + [c_small] + [c_large]
    mix = learn_task_mix(tasks, coverage=0.85)
    # 0.5 + 0.3 = 0.8 < 0.85, so one of the equally rare ones joins: the larger CPU, as the authors order them
    assert [t for t, _ in mix.popularities()] == [a, b, c_large]
    assert [p for _, p in mix.popularities()] == pytest.approx([5 / 9, 3 / 9, 1 / 9])
    assert len(learn_task_mix(tasks, coverage=1.0).classes) == 4
    no_cpu = learn_task_mix([*tasks, Task.of(1_000)], include_cpu_only=False, coverage=1.0)
    assert all(t.wants_gpu for t, _ in no_cpu.popularities())
    weighted = learn_task_mix([a, b], weights=[1.0, 9.0], coverage=0.5)
    assert [t for t, _ in weighted.popularities()] == [b]
    assert learn_task_mix([]).classes == ()


# --- properties ------------------------------------------------------------------------------------------------------

TYPES = ("A", "B")


@st.composite
def nodes(draw: st.DrawFn) -> GpuNode:
    gpu_type = draw(st.sampled_from((*TYPES, None)))
    count = draw(st.integers(0, 8)) if gpu_type else 0
    free = st.one_of(st.sampled_from((0, 250, 500, 1000)), st.integers(0, GPU_MILLI))
    return GpuNode(
        "p",
        draw(st.integers(0, 64_000)),
        draw(st.integers(0, 262_144)),
        gpu_type,
        tuple(draw(free) for _ in range(count)),
    )


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    kind = draw(st.sampled_from(("none", "share", "whole")))
    types = draw(st.one_of(st.none(), st.sets(st.sampled_from((*TYPES, "C")), min_size=1).map(frozenset)))
    cpu, mem = draw(st.integers(0, 32_000)), draw(st.integers(0, 131_072))
    if kind == "none":
        return Task(cpu, mem)
    if kind == "share":
        return Task(cpu, mem, draw(st.integers(1, GPU_MILLI - 1)), 1, types)
    return Task(cpu, mem, GPU_MILLI, draw(st.integers(1, 8)), types)


mixes = st.lists(st.tuples(tasks(), st.floats(0.01, 10.0)), min_size=1, max_size=5).map(TaskMix.of)


@settings(max_examples=200, deadline=None)
@given(nodes(), mixes)
def test_fragmentation_is_between_zero_and_the_free_gpu(node: GpuNode, mix: TaskMix) -> None:
    frag = node_fragmentation(node, mix)
    assert -1e-9 <= frag <= node.free_gpu_milli + 1e-9
    for task, _ in mix.popularities():
        assert 0 <= task_fragment_milli(node, task) <= node.free_gpu_milli
    assert sum(fragmentation_by_case(node, mix).values()) == pytest.approx(node.free_gpu_milli, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(nodes(), tasks(), mixes)
def test_placing_a_task_never_makes_free_resources_negative(node: GpuNode, task: Task, mix: TaskMix) -> None:
    if not fits(node, task):
        with pytest.raises(ValueError):
            allocate(node, task)
        assert fgd_placement(node, task, mix) is None
        return
    for gpus in candidate_gpus(node, task) or ((),):
        after = allocate(node, task, gpus)
        assert min(after.gpu_free_milli, default=0) >= 0
        assert after.cpu_milli >= 0 and after.memory_mib >= 0
        assert after.free_gpu_milli == node.free_gpu_milli - task.total_gpu_milli
        assert release(after, task, gpus) == node
        assert math.isfinite(placement_delta(node, task, mix, gpus))
    best = fgd_placement(node, task, mix)
    assert best is not None
    assert best.delta_milli == pytest.approx(placement_delta(node, task, mix, best.gpus))
    assert all(best.delta_milli <= placement_delta(node, task, mix, g) + 1e-9 for g in candidate_gpus(node, task))
