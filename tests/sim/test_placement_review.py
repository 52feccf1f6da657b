"""Review of the FGD reproduction and this project's scorer and migration planner: each test reproduces one defect
found in ``autoscaler/sim/placement.py``, ``autoscaler/core/placement_score.py`` or
``autoscaler/core/fragmentation.py``."""

from __future__ import annotations

import numpy as np

from autoscaler.core.fragmentation import GpuNode, Task, TaskMix
from autoscaler.sim.placement import Migrations, NodeTable, PodTable, replay


def test_a_smaller_pod_of_the_failed_pods_gpu_shape_is_moved_to_make_room() -> None:
    """The migration planner pruned every placed pod with the failed pod's GPU request and *no more* CPU and memory
    ("fits nowhere else either"), but such a pod fits wherever the failed one lacked only CPU or memory: moving it
    there frees its node for the failed pod. Only a pod *at least as large* (same GPU request and types) is sure to
    fit nowhere."""
    nodes = NodeTable.of(
        [GpuNode("n0", 8_000, 65_536, "A", (1000,)), GpuNode("n1", 12_000, 65_536, "A", (1000,))]
    )
    q = Task(2_000, 0, 500, 1)  # BestFit puts it on n0 (the tighter node)
    z = Task(8_000)  # CPU only: fits n1 alone, leaving it 4,000 CPU
    f = Task(7_000, 0, 500, 1)  # fits neither n0 (6,000 CPU free) nor n1 (4,000); n0 without q: 8,000
    pods = PodTable.of([q, z, f])
    mix = TaskMix.of([(f, 1.0)])
    without = replay(nodes, pods, "BestFit", 0, mix=mix, sequence=np.arange(3))
    assert list(without.nodes) == [0, 1, -1]
    moved = replay(nodes, pods, "BestFit", 0, mix=mix, sequence=np.arange(3), migrations=Migrations(1, total=5))
    assert moved.placed.all()
    assert moved.moves == 1
    assert list(moved.nodes) == [1, 1, 0]  # q went to n1 (4,000 CPU is enough for it), f took its place on n0


def test_the_replays_fill_term_honours_a_gpu_type_only_the_scoring_mix_names() -> None:
    """``FGD+`` scored with a mix (``ours_mix``) one of whose classes asks for a GPU type no pod and no class of the
    recorded mix names: the fill term looked the constraint up with ``constraint_id.get(types, 0)`` -- "any type" --
    so a node of another type counted as able to host that class, and the replay's keys left the core's."""
    from autoscaler.core.placement_score import node_keys
    from autoscaler.sim.placement import _Cluster, _Fill

    state = [GpuNode("a", 8_000, 65_536, "A", (1000,)), GpuNode("b", 8_000, 65_536, "B", (1000,))]
    share = Task(1_000, 0, 500, 1)
    recorded = TaskMix.of([(share, 1.0)])
    scoring = TaskMix.of([(Task(1_000, 0, 1000, 1, frozenset({"B"})), 1.0)])
    c = _Cluster(NodeTable.of(state), recorded, [None], np.arange(2))
    c.fill = _Fill(c, scoring)
    keys, _ = c.fill.scores(c, np.arange(2), share.cpu_milli, share.memory_mib, share.gpu_milli, share.gpu_count)
    assert node_keys(state, share, scoring) == [10, -10]  # on "a" the class has no access: all free GPU is fragment
    assert keys.tolist() == [10, -10]


def test_a_task_asking_for_no_gpu_is_not_held_to_a_gpu_type() -> None:
    """The authors' GPU filter (``open_gpu_share.go`` ``Filter``) passes every pod that asks for no GPU, whatever
    GPU model it names, and the replay's ``feasible`` does the same; the core's ``fits`` refused such a task on a
    node of another GPU type, so the core's scorer (``node_keys``) and the replay's (``ours_node_keys``) disagreed on
    where it may go."""
    from autoscaler.core.fragmentation import fits
    from autoscaler.core.placement_score import node_keys
    from autoscaler.sim.placement import ours_node_keys

    state = [GpuNode("a", 8_000, 65_536, "A", (1000,)), GpuNode("b", 8_000, 65_536, "B", (1000, 500))]
    cpu_only = Task(2_000, 0, 0, 0, frozenset({"A"}))
    mix = TaskMix.of([(Task(1_000, 0, 500, 1), 1.0), (cpu_only, 1.0)])
    assert fits(state[1], cpu_only)
    assert node_keys(state, cpu_only, mix) == ours_node_keys(state, cpu_only, mix)
    assert None not in node_keys(state, cpu_only, mix)
