"""The rebalancer moves a Deployment's replica only when the service can spare one (stop 41).

A move evicts a replica, which comes back after a cold start. Measured on the mixed scenario (bench_rebalance, three
seeds): under the default spreading scheduler the rebalancer's 47 moves in 3 days cost 0.26 points of requests within
the SLO (99.66 -> 99.40 %), since most moved replicas of a service that needed every one of them. Now a replica moves
only when the latest tick recommended fewer replicas than the Deployment runs (forecast floor included):
``RebalanceConfig.spare_replicas_only`` (``rebalance.spare_replicas_only``, on by default).
"""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.core.model import MetricKind, ScaleDecision, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import RebalanceConfig, protected_owners
from autoscaler.sim.cluster import Scoring, SimCluster
from autoscaler.sim.engine import simulate
from autoscaler.sim.policies import CorePolicy, SimService
from autoscaler.sim.scenario import NodePool
from tests.sim.test_rebalance_sim import _job


def _decision(current: int, desired: int, recommended: int | None, reason: Reason) -> ScaleDecision:
    return ScaleDecision("inf/chat", current, desired, reason, "", recommended_replicas=recommended)


@pytest.mark.parametrize(
    ("current", "desired", "recommended", "reason", "spare_only", "protected"),
    [
        (3, 3, 2, Reason.SCALE_DOWN_STABILISED, True, False),  # needs 2 of 3: one to spare
        (3, 3, 3, Reason.WITHIN_TOLERANCE, True, True),  # needs every replica
        (3, 3, 3, Reason.WITHIN_TOLERANCE, False, False),  # ... moved all the same with the rule off
        (3, 3, 4, Reason.WITHIN_TOLERANCE, True, True),  # would want more (within the tolerance)
        (3, 2, 2, Reason.METRIC_BELOW_TARGET, True, False),  # scaling down
        (3, 3, None, Reason.WITHIN_TOLERANCE, True, False),  # no recommendation known: as before the rule
        (2, 3, 3, Reason.METRIC_ABOVE_TARGET, False, True),  # growing: protected whatever the rule
        (3, 3, 2, Reason.SLO_BREACH, False, True),  # guarded on latency: protected whatever the rule
    ],
)
def test_a_service_with_no_replica_to_spare_is_protected(
    current: int, desired: int, recommended: int | None, reason: Reason, spare_only: bool, protected: bool
) -> None:
    decision = _decision(current, desired, recommended, reason)
    assert ("deployment/inf/chat" in protected_owners([decision], spare_only=spare_only)) is protected


def _service(name: str, replicas: int, needed: int, steps: int = 240) -> SimService:
    """``replicas`` replicas pinned (min = max) serving a constant load that ``needed`` of them carry (3 req/s each)."""
    policy = ServicePolicy("inference", name, min_replicas=replicas, max_replicas=replicas,
                           metric=MetricKind.REQUEST_RATE, target=3.0, cold_start_s=60.0, priority=1000)
    return SimService(policy, np.full(steps, 2.5 * needed), throughput=3.5, base_latency_s=1.0, slo_s=3.0,
                      quantile=0.95)


def _run(replicas: int, needed: int, spare_only: bool):
    def spread(cluster: SimCluster) -> None:  # the replicas one per node, as a spreading scheduler left them
        names = sorted(name for (_, name), p in cluster.pods.items() if p.owner)
        for index, name in enumerate(names):
            cluster.place_pod("inference", name, f"onprem-{index % 4}")

    config = RebalanceConfig(interval_s=60.0, spare_replicas_only=spare_only)
    return simulate(CorePolicy("reactive"), [_service("a", replicas, needed), _service("b", replicas, needed)],
                    [NodePool(name="onprem", nodes=4, gpusPerNode=8)], 0.0, 15.0, 240, 0.0,
                    scoring=Scoring.MOST_ALLOCATED, jobs=[_job("t1"), _job("t2")], rebalance=config,
                    fragmentation=config, prepare=spread)


def test_replicas_a_service_needs_are_not_moved_and_spare_ones_are() -> None:
    needs_all = _run(2, 2, spare_only=True)
    assert needs_all.rebalance_moves == 0 and needs_all.training_gpu_seconds == 0.0
    moved_anyway = _run(2, 2, spare_only=False)
    assert moved_anyway.rebalance_moves > 0 and moved_anyway.training_gpu_seconds > 0.0
    spare = _run(3, 2, spare_only=True)  # three replicas each where two carry the load
    assert spare.rebalance_moves > 0 and spare.training_gpu_seconds > 0.0


def test_the_settings_and_the_scenario_carry_the_rule_on_by_default() -> None:
    from autoscaler.settings import RebalanceSettings
    from autoscaler.sim.scenario import SCENARIO_DIR, load_scenario
    from autoscaler.sim.training import rebalance_config

    assert RebalanceSettings(enabled=True).to_config(300.0, ()).spare_replicas_only is True
    assert RebalanceSettings(enabled=True, spare_replicas_only=False).to_config(300.0, ()).spare_replicas_only is False
    scenario, _ = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    assert rebalance_config(scenario).spare_replicas_only is True
    off = scenario.rebalance.model_validate({"spareReplicasOnly": False})
    assert rebalance_config(scenario.model_copy(update={"rebalance": off})).spare_replicas_only is False


def test_plan_names_the_services_whose_replicas_were_not_candidates() -> None:
    """``autoscaler plan``: a target that found no movable pods is explained by the services left alone this pass."""
    import io
    from dataclasses import replace

    from autoscaler.commands.plan import plan_document, print_table
    from tests.runtime.test_rebalance_pass import CONFIG, T0, world

    c, _, _ = world(dry_run=True, config=replace(CONFIG, spare_replicas_only=True))  # chat needs both replicas
    c.run_once(T0)
    doc = plan_document(c.last_report, (), c.rebalance(T0))
    assert doc["rebalance"]["moves"] == [] and doc["rebalance"]["protected"] == ["deployment/inf/chat"]
    out = io.StringIO()
    print_table(doc, out)
    assert "not moved this pass (growing, guarded on latency, at maxReplicas, metrics stale or partial, or no " \
        "replica to spare): deployment/inf/chat" in out.getvalue()
