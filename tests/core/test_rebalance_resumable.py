"""The rebalancer moves for a workload this controller suspended only when gathered GPUs would get it resumed
(issue 15, stop 41).

Traced on the mixed scenario (seed 14, rebalancer on): the rebalancer moved a chat replica for a suspended 8-GPU Job
again and again, and at every tick after each move the capacity arbitration answered "8 GPU(s) do not fit in the free
GPUs with 2-17 reserved for coming replicas": the Job was kept suspended for inference's reserve, not for where its
GPUs lay, so the moves could not get it resumed, whatever the scheduler did. Now the arbitration reports the
suspended workloads that would be resumed but for the shape of the free GPUs (``resumable_once_gathered``), and the
rebalancer moves only for those.
"""

from __future__ import annotations

from autoscaler.core.cluster import ClusterSnapshot, WorkloadInfo
from autoscaler.core.model import CapacityState, Plan, ResumeWorkload
from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance, resumable_suspended
from tests.core import test_arbitrate as arb
from tests.core import test_rebalance as reb

PAUSED = "Job/ml/paused"


def paused(pods: int = 1) -> WorkloadInfo:
    return WorkloadInfo("Job", "ml", "paused", "job/ml/paused", True, 100, (8,) * pods, None, arb.NOW - 900)


def scattered(now: float = arb.NOW) -> ClusterSnapshot:
    """chat: 7 replicas on n1, 1 on n2 -- 8 GPUs free, 1 + 7, where the suspended 8-GPU Job fits on neither node."""
    pods = [arb.replica(i, "n1") for i in range(7)] + [arb.replica(7, "n2")]
    return ClusterSnapshot(now, pods=tuple(pods), nodes=(arb.node("n1"), arb.node("n2")), workloads=(paused(),))


def _report(snapshot: ClusterSnapshot, desired: int, demand: float | None = None):
    config = arb.CapacityConfig(resume_after_s=0.0)
    actions, report, _ = arb.run(snapshot, desired, config, CapacityState(free_since=arb.NOW - 999), demand=demand)
    return actions, report


def test_a_suspended_job_kept_out_only_by_scattered_gpus_is_reported_as_resumable_once_gathered() -> None:
    actions, report = _report(scattered(), 8)
    assert not any(isinstance(a, ResumeWorkload) for a in actions)
    assert report.resumable_once_gathered == (PAUSED,)
    assert resumable_suspended(Plan(arb.NOW, capacity=report)) == frozenset({PAUSED})


def test_a_suspended_job_kept_out_by_the_reserve_for_coming_replicas_is_not() -> None:
    # the forecast wants 12 replicas soon (8 run): 4 GPUs reserved, 8 - 4 free is short of the Job's 8, however
    # gathered -- the case traced in the mixed scenario
    actions, report = _report(scattered(), 8, demand=12.0)
    assert not any(isinstance(a, ResumeWorkload) for a in actions)
    assert any("do not fit" in n and "reserved" in n for n in report.notes)
    assert report.resumable_once_gathered == ()


def test_nothing_is_resumable_once_gathered_while_inference_is_short() -> None:
    _, report = _report(scattered(), 20)  # chat wants 20, 8 run, 8 GPUs free: short; no give-back (nor resume) runs
    assert report.shortfalls and report.resumable_once_gathered == ()


def test_a_job_that_fits_as_things_are_is_resumed_not_listed() -> None:
    pods = [arb.replica(i, "n1") for i in range(8)]  # n2 empty: it fits whole
    snapshot = ClusterSnapshot(arb.NOW, pods=tuple(pods), nodes=(arb.node("n1"), arb.node("n2")),
                               workloads=(paused(),))
    actions, report = _report(snapshot, 8)
    assert [a.name for a in actions if isinstance(a, ResumeWorkload)] == ["paused"]
    assert report.resumable_once_gathered == ()


def test_no_arbitration_means_no_restriction() -> None:
    assert resumable_suspended(Plan(arb.NOW)) is None


def _rebalance_world() -> ClusterSnapshot:
    pods = [reb.replica("chat", i, "n1") for i in range(7)] + [reb.replica("chat", 7, "n2")]
    return reb.snap([reb.node("n1"), reb.node("n2")], pods, workloads=(paused(),))


def test_the_rebalancer_moves_for_a_suspended_job_only_when_gathering_would_resume_it() -> None:
    config = RebalanceConfig()
    for resumable in (None, frozenset({PAUSED})):
        plan, _ = plan_rebalance(_rebalance_world(), reb.NOW, config, RebalanceState(), resumable=resumable)
        assert reb.evicted(plan) == ["inf/chat-7"], resumable
        assert plan.moves[0].target == "Job ml/paused (suspended)"
    for resumable in (frozenset(), frozenset({"Job/ml/other"})):
        plan, state = plan_rebalance(_rebalance_world(), reb.NOW, config, RebalanceState(), resumable=resumable)
        assert plan.actions == ()
        assert any("ml/paused (suspended): not moved for" in n and "reserved" in n for n in plan.notes), plan.notes
        assert state.moved_for == ()  # not moved for: no wait starts
    # the GPUs stranded are measured as before: the Job still waits and fits nowhere
    assert plan.stranded_gpus == 8
