"""Acting on capacity arbitration (issue 12): a gang is evicted whole or not at all, Events land on the workload and
on the service, the controller's metrics count stops and lost work, settings build the core's config, and
``autoscaler plan`` shows the options with their costs."""

from __future__ import annotations

import io

import pytest

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.commands.plan import capacity_document, print_table
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.cluster import NodeInfo, PodDisruptionBudgetInfo, PodInfo
from autoscaler.core.model import EvictPod, ScaleDeployment, SuspendWorkload
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.reporting import TickReport, TickReporter
from autoscaler.settings import SettingsError, load_settings
from autoscaler.telemetry import Telemetry

NOW = 1_800_000_000.0


def gang_pod(index: int, labels: dict[str, str] | None = None) -> PodInfo:
    return PodInfo("ml", f"w{index}", f"n{index}", 8, 100, "Running", True, "Job", "train", gang="job/ml/train",
                   labels=labels or {})


def evictions(count: int = 3) -> list[EvictPod]:
    return [
        EvictPod("ml", f"w{i}", Reason.PREEMPT_FOR_INFERENCE, "for inference/chat", gang="job/ml/train",
                 service="inference/chat", lost_work_gpu_s=3600.0)
        for i in range(count)
    ]


def test_a_gang_whose_one_pod_a_pdb_protects_is_left_running_whole() -> None:
    pods = [gang_pod(0), gang_pod(1, {"keep": "yes"}), gang_pod(2)]
    cluster = FakeCluster(pods=pods, pdbs=[PodDisruptionBudgetInfo("ml", "keep", {"keep": "yes"}, 0)])
    results = Actuator(cluster).apply(evictions(), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["blocked"] * 3
    assert all("gang job/ml/train left running" in r.message for r in results)
    assert len(cluster.pods) == 3  # nothing half done
    assert not [w for w in cluster.writes if w.op == "evict_pod" and w.outcome == "evicted"]


def test_a_gang_without_a_blocking_pdb_is_evicted_whole_with_one_event_on_the_service() -> None:
    cluster = FakeCluster(pods=[gang_pod(i) for i in range(3)])
    results = Actuator(cluster).apply(evictions(), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["applied"] * 3
    assert not cluster.pods
    on_service = [e for e in cluster.events if (e.kind, e.namespace, e.name) == ("Deployment", "inference", "chat")]
    assert len(on_service) == 1 and on_service[0].reason == "PreemptForInference"
    assert "job/ml/train" in on_service[0].message
    assert len([e for e in cluster.events if e.kind == "Pod"]) == 3


def test_stale_metrics_hold_every_eviction_of_the_gang() -> None:
    cluster = FakeCluster(pods=[gang_pod(i) for i in range(3)])
    context = GuardContext(NOW, {}, stale={"inference/chat": ("no samples",)})
    results = Actuator(cluster).apply(evictions(), context)
    assert [r.result for r in results] == ["held"] * 3 and len(cluster.pods) == 3


def test_dry_run_evicts_nothing_and_says_what_it_would_do() -> None:
    cluster = FakeCluster(pods=[gang_pod(i) for i in range(3)])
    results = Actuator(cluster, dry_run=True).apply(evictions(), GuardContext(NOW, {}))
    assert [r.result for r in results] == ["dry_run"] * 3 and len(cluster.pods) == 3


def test_suspend_emits_events_on_the_workload_and_the_service_and_counts_lost_work() -> None:
    cluster = FakeCluster()
    telemetry = Telemetry()
    actuator = Actuator(cluster)
    reporter = TickReporter(telemetry, actuator, None)
    action = SuspendWorkload("Job", "ml", "train", Reason.PREEMPT_FOR_INFERENCE, "for inference/chat",
                             service="inference/chat", lost_work_gpu_s=2 * 3600.0)
    results = actuator.apply([action, *evictions(2)], GuardContext(NOW, {}))
    reporter.actions(results, TickReport(NOW, None))  # type: ignore[arg-type]
    assert [(e.kind, e.name) for e in cluster.events if e.reason == "PreemptForInference"][:2] == [
        ("Job", "train"), ("Deployment", "chat")]
    text = telemetry.render().decode()
    assert 'gpu_autoscaler_training_gangs_stopped_total{how="suspend"} 1.0' in text
    # 2 GPU-hours for the suspension; the evicted pods were gone already (``gone``: no eviction of ours lost their
    # work, so their share does not count, and no Event names them)
    assert "gpu_autoscaler_training_gpu_hours_lost_total 2.0" in text
    assert [r.result for r in results] == ["applied", "gone", "gone"]


def test_capacity_settings_build_the_core_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().capacity.to_config() is None  # off by default: preemption is opt-in
    monkeypatch.setenv("AUTOSCALER_CAPACITY__ENABLED", "true")
    monkeypatch.setenv("AUTOSCALER_CAPACITY__EXPANDERS", "priority,cheapest")
    monkeypatch.setenv(
        "AUTOSCALER_CAPACITY__BURST_POOLS",
        '{"cloud": {"gpus_per_node": 8, "boot_seconds": 240, "price_per_gpu_hour": 3.5, "max_nodes": 4}}',
    )
    config = load_settings().capacity.to_config()
    assert isinstance(config, CapacityConfig)
    assert config.expanders == ("priority", "cheapest")
    assert [(p.name, p.gpus_per_node, p.boot_s, p.max_nodes) for p in config.pools] == [("cloud", 8, 240.0, 4)]
    assert config.consolidate_horizon_s == 1800.0
    monkeypatch.setenv("AUTOSCALER_CAPACITY__CONSOLIDATE_HORIZON_SECONDS", "0")
    assert load_settings().capacity.to_config().consolidate_horizon_s == 0.0
    monkeypatch.setenv("AUTOSCALER_CAPACITY__CONSOLIDATE_HORIZON_SECONDS", "-1")
    with pytest.raises(SettingsError, match=r"capacity\.consolidate_horizon_seconds"):
        load_settings()
    monkeypatch.delenv("AUTOSCALER_CAPACITY__CONSOLIDATE_HORIZON_SECONDS")
    monkeypatch.setenv("AUTOSCALER_CAPACITY__EXPANDERS", "random")
    with pytest.raises(SettingsError, match=r"capacity\.expanders"):
        load_settings()


def test_plan_prints_the_capacity_options_and_gangs() -> None:
    from autoscaler.core.arbitrate import ArbitrationInput, arbitrate
    from autoscaler.core.cluster import ClusterSnapshot, WorkloadInfo
    from autoscaler.core.model import CapacityState, ScaleDecision, ServicePolicy

    chat = ServicePolicy("inference", "chat", max_replicas=20, priority=1000)
    pods = [PodInfo("inference", f"c{i}", "n0", 1, 1000, "Running", True, "Deployment", "chat") for i in range(8)]
    pods.append(PodInfo("ml", "w0", "n1", 8, 100, "Running", True, "Job", "train", gang="job/ml/train",
                        created_at=NOW - 7200, ready_at=NOW - 7000, last_checkpoint_at=NOW - 600))
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=(NodeInfo("n0", 8, "A100", "p", True),
                                                             NodeInfo("n1", 8, "A100", "p", True)),
                               workloads=(WorkloadInfo("Job", "ml", "train", "job/ml/train", False, 100, (8,)),))
    arb = ArbitrationInput(NOW, snapshot, {chat.key: chat},
                           [ScaleDecision(chat.key, 8, 12, Reason.METRIC_ABOVE_TARGET, "")])
    actions, report, _ = arbitrate(arb, CapacityState(), CapacityConfig())
    assert [type(a) for a in actions] == [SuspendWorkload]
    doc = capacity_document(report)
    assert doc is not None and doc["trainingGangs"][0]["gang"] == "job/ml/train"
    assert doc["trainingGangs"][0]["lostWorkGpuHours"] == pytest.approx(8 * 600 / 3600, abs=1e-3)
    out = io.StringIO()
    document = {"time": "t", "heldBecause": None, "decisions": [], "actions": [], "invalidPolicies": [],
                "errors": [], "events": [], "capacity": doc}
    print_table(document, out)
    text = out.getvalue()
    assert "Capacity (preempt training / burst nodes / give back):" in text
    assert "CHOSEN preempt" in text and "job/ml/train" in text


def test_a_scale_deployment_between_two_gangs_keeps_its_place() -> None:
    cluster = FakeCluster(pods=[gang_pod(i) for i in range(2)])
    scale = ScaleDeployment("inference", "chat", 3, 2, Reason.METRIC_ABOVE_TARGET, "")
    results = Actuator(cluster).apply([evictions(1)[0], scale, evictions(2)[1]], GuardContext(NOW, {}))
    assert [type(r.action).__name__ for r in results] == ["EvictPod", "ScaleDeployment", "EvictPod"]
