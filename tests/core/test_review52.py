"""Review 52: a suspended workload's pods' labels and own anti-affinity (commits 6ba3efa, 90a86ed, dda29ae)."""

from __future__ import annotations

from autoscaler.core.cluster import NodeInfo, PodAntiAffinityTerm, PodInfo, WorkloadInfo
from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, _template_pods, plan_rebalance
from tests.core import test_rebalance as reb

HOST = "kubernetes.io/hostname"


def _suspended(kind: str, gang: str, terms: tuple[PodAntiAffinityTerm, ...], labels: dict[str, str]) -> WorkloadInfo:
    return WorkloadInfo(
        kind, "ml", "train", gang, True, 100, (4,), None, reb.NOW - 900,
        pod_labels=labels, pod_anti_affinity=terms,
    )  # fmt: skip


JOB = _suspended("Job", "job/ml/train", (), {"batch.kubernetes.io/job-name": "train"})
# a PyTorchJob of the same name in the same namespace, whose pods keep away from chat's
PYTORCH = _suspended(
    "PyTorchJob", "kubeflow/ml/train",
    (PodAntiAffinityTerm({"app": "chat"}, HOST, frozenset({"inf"})),),
    {"training.kubeflow.org/job-name": "train"},
)  # fmt: skip


def test_the_rebalancers_stand_ins_of_two_workloads_of_one_name_are_not_one_pod() -> None:
    """``workload_pod`` names a stand-in "<kind>/<name> (not created)" so that two workloads' stand-ins are never one
    pod; ``_template_pods`` renames them "<name> (suspended, pod i)", the kind dropped: a Job and a PyTorchJob of one
    name in one namespace give stand-ins of one (namespace, name) -- one answer in ``_Cluster._pod_kept_off``'s
    cache, and ``moves_with`` takes one for the other."""
    job_pods, torch_pods = _template_pods(JOB), _template_pods(PYTORCH)
    assert {(p.namespace, p.name) for p in job_pods}.isdisjoint((p.namespace, p.name) for p in torch_pods)


def test_a_workload_is_not_judged_by_the_pod_anti_affinity_of_another_of_its_name() -> None:
    """chat: 4 replicas on n1 and 4 on n2 (4 GPUs free on each). The Job (no terms; its target comes first by name)
    fits n1 as is. The PyTorchJob's pods keep away from chat, which runs on both nodes: it fits nowhere, and no move
    makes room (chat's replicas have nowhere to go) -- it is noted as not fitting. With the shared stand-in name
    the Job's empty answer is reused for it (and the Job's landing is taken for its own), so it is taken to fit n2
    beside chat, which kube-scheduler refuses."""
    nodes: list[NodeInfo] = [reb.node("n1"), reb.node("n2")]
    pods: list[PodInfo] = [reb.replica("chat", i, "n1") for i in range(4)]
    pods += [reb.replica("chat", i, "n2") for i in range(4, 8)]
    world = reb.snap(nodes, pods, workloads=(JOB, PYTORCH))
    plan, _ = plan_rebalance(world, reb.NOW, RebalanceConfig(), RebalanceState())
    assert reb.evicted(plan) == []
    assert any(n.startswith("PyTorchJob ml/train (suspended): 4 GPU(s) do not fit") for n in plan.notes), plan.notes
