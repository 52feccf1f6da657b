"""The controller's rebalance pass (issue 15, item 3): leader only, dry-run aware, through the same actuator, Events
and metrics as every other action; it moves nothing after a tick that could not read everything, leaves alone a
service that is growing, and counts only applied moves against the hourly bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.app import build_runtime
from autoscaler.controller import Controller, protected_owners
from autoscaler.core.cluster import NodeInfo, PodInfo
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.core.rebalance import RebalanceConfig
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import PortError
from autoscaler.settings import load_settings
from autoscaler.telemetry import Telemetry
from tests.runtime.runtime_fakes import FakePolicies, policy_object

T0 = 1_800_000_000.0
CHAT = ServicePolicy("inf", "chat", min_replicas=1, max_replicas=10, metric=MetricKind.REQUEST_RATE, target=10.0)
# chat needs both of its replicas (20 req/s at 10 per replica): these tests are of the pass's mechanics, so the
# spare-replica rule (tests/core/test_rebalance_spare.py) is off
CONFIG = RebalanceConfig(max_moves_per_pass=2, max_moves_per_hour=3, spare_replicas_only=False)


def training_pod(name: str, node: str | None, gpus: int) -> PodInfo:
    return PodInfo("ml", name, node, gpus, 100, "Running" if node else "Pending", node is not None, "Job", name,
                   gang=f"job/ml/{name}")


def world(*, dry_run: bool = False, rate: float = 20.0, config: RebalanceConfig = CONFIG):
    """chat has two replicas, one per node, on n1 (next to a 4-GPU job) and n2 (alone); n3 holds a 6-GPU job; an
    8-GPU job waits and fits nowhere until chat-1 leaves n2."""
    cluster = FakeCluster(nodes=[NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3")])
    cluster.add_deployment("inf", "chat", 2, selector={"app": "chat"})
    for i, node in enumerate(("n1", "n2")):
        cluster.add_pod(PodInfo("inf", f"chat-{i}", node, 1, 1000, "Running", True, "Deployment", "chat",
                                labels={"app": "chat"}))
    cluster.add_pod(training_pod("fixed", "n1", 4))
    cluster.add_pod(training_pod("big", "n3", 6))
    cluster.add_pod(training_pod("wait", None, 8))
    metrics = FakeMetricsSource()
    metrics.set_service(CHAT.key, spec_replicas=2, ready_replicas=2, metric_total=rate, request_rate=rate)
    controller = Controller(metrics=metrics, cluster=cluster, writer=cluster,
                            policies=FakePolicies([policy_object(CHAT)]), telemetry=Telemetry(), dry_run=dry_run,
                            rebalance=config)
    controller.acting_since = T0 - 3600
    return controller, cluster, metrics


def sample(c: Controller, name: str, **labels: str) -> float:
    value = c.telemetry.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def evicted(cluster: FakeCluster) -> list[str]:
    return [w.args[1] for w in cluster.writes if w.op == "evict_pod" and w.outcome == "evicted"]


def test_a_pass_after_a_good_tick_moves_the_stray_replica_with_an_event_and_metrics() -> None:
    c, cluster, _ = world()
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and report.result == "ok" and report.plan is not None
    assert evicted(cluster) == ["chat-1"]
    assert [r.result for r in report.results] == ["applied"]
    events = [e for e in cluster.events if e.kind == "Pod" and e.name == "chat-1"]
    assert len(events) == 1 and events[0].reason == "Rebalance" and "job/ml/wait" in events[0].message
    labels = {"kind": "EvictPod", "reason": "rebalance", "dry_run": "false", "result": "applied"}
    assert sample(c, "gpu_autoscaler_actions_total", **labels) == 1
    assert sample(c, "gpu_autoscaler_rebalance_passes_total", result="ok") == 1
    assert sample(c, "gpu_autoscaler_stranded_gpus") == 3 + 7 + 2
    assert sample(c, "gpu_autoscaler_rebalance_moves_last_hour") == 1


def test_dry_run_moves_nothing_says_what_it_would_do_and_spends_no_budget() -> None:
    c, cluster, _ = world(dry_run=True)
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["dry_run"]
    assert evicted(cluster) == [] and len(cluster.pods) == 5
    assert any("[dry-run] would evict pod/inf/chat-1" in e.message for e in cluster.events)
    assert c.rebalance_state.move_times == ()


@pytest.mark.parametrize("fault", ["metrics outage", "stale service", "cluster unreadable", "no tick"])
def test_no_move_follows_from_data_that_could_not_be_read(fault: str) -> None:
    c, cluster, metrics = world()
    if fault == "metrics outage":
        c.metrics = _Broken()  # type: ignore[assignment]
    if fault == "stale service":
        metrics.set_stale(CHAT.key, "no samples")
    if fault != "no tick":
        c.run_once(T0)
    if fault == "cluster unreadable":
        cluster.fail("snapshot", PortError("apiserver down"))
    report = c.rebalance(T0 + 1)
    assert report is not None
    assert evicted(cluster) == []
    if fault == "stale service":
        # the tick held the service: the pass holds (a tick that is not "ok" never leads to a move)
        assert report.result == "ok" and "deployment/inf/chat" in report.protected and report.results == []
    else:
        assert report.result == "held" and report.held_because
        assert sample(c, "gpu_autoscaler_rebalance_passes_total", result="held") == 1


class _Broken:
    def observe(self, services, now, *, cluster=None):
        raise PortError("prometheus down")

    def set_service_queries(self, service_queries):
        return None

    def history(self, *args, **kwargs):
        raise PortError("prometheus down")


def test_a_growing_service_is_left_alone() -> None:
    c, cluster, _ = world(rate=40.0)  # 4 replicas wanted: the tick scales chat up
    c.run_once(T0)
    assert "deployment/inf/chat" in protected_owners(c.last_report)
    c.rebalance(T0 + 1)
    assert evicted(cluster) == []


def test_a_refused_eviction_is_not_counted_and_the_hourly_bound_holds_over_passes() -> None:
    c, cluster, _ = world(config=replace(CONFIG, retry_after_s=0.0))  # no back-off: the bound alone holds it
    cluster.block_evictions("inf", "chat-1")
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["blocked"]
    assert c.rebalance_state.move_times == ()
    cluster.clear_faults()
    cluster._blocked.clear()
    moved = 0
    for i in range(12):  # an hour of passes; each time the replica is back where it was (the worst case)
        now = T0 + 300 * (i + 1)
        if "inf/chat-1" not in cluster.pods:
            cluster.add_pod(PodInfo("inf", "chat-1", "n2", 1, 1000, "Running", True, "Deployment", "chat",
                                    labels={"app": "chat"}))
        c.run_once(now)
        report = c.rebalance(now + 1)
        assert report is not None
        moved += sum(1 for r in report.results if r.result == "applied")
    assert moved == CONFIG.max_moves_per_hour


def test_only_the_leader_moves() -> None:
    c, cluster, _ = world()
    c.run_once(T0)
    c.can_act = lambda: False
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["not_leader"]
    assert evicted(cluster) == []


def test_settings_turn_the_pass_on_and_the_runtime_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().rebalance.to_config(300.0, ()) is None  # off by default: a move evicts a running pod
    monkeypatch.setenv("AUTOSCALER_REBALANCE__ENABLED", "true")
    monkeypatch.setenv("AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR", "5")
    monkeypatch.setenv("AUTOSCALER_CAPACITY__BURST_POOLS", '{"burst": {"gpus_per_node": 8}}')
    settings = load_settings()
    config = settings.rebalance.to_config(settings.rebalance_interval_seconds, settings.capacity.burst_pools)
    assert config is not None and config.max_moves_per_hour == 5
    assert config.burst_pools == frozenset({"burst"}) == config.training_excluded_pools


def test_bad_rebalance_settings_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.settings import SettingsError

    monkeypatch.setenv("AUTOSCALER_REBALANCE__BURST_EMPTY_BELOW", "1.5")
    with pytest.raises(SettingsError, match=r"rebalance\.burst_empty_below"):
        load_settings()


@pytest.mark.parametrize("enabled", [True, False])
def test_build_runtime_runs_the_controller_pass_only_when_enabled(enabled: bool) -> None:
    from autoscaler.app import Adapters
    from autoscaler.settings import Settings

    fake = FakeCluster()
    adapters = Adapters(metrics=FakeMetricsSource(), cluster=fake, writer=fake, policies=FakePolicies([]),
                        status_writer=None, node_pools=None)
    settings = Settings(leader_election={"enabled": False}, rebalance={"enabled": enabled},
                        rebalance_interval_seconds=120)
    runtime = build_runtime(settings, adapters, refit=lambda now: None, http=False)
    assert (runtime.controller.rebalance_config is not None) is enabled
    assert (runtime._rebalance == runtime.controller.rebalance) is enabled
    if enabled:
        assert runtime.controller.rebalance_config.interval_s == 120


def test_plan_prints_the_rebalance_section_with_each_move_and_what_it_is_for() -> None:
    import io

    from autoscaler.commands.plan import plan_document, print_table

    c, _, _ = world(dry_run=True)
    c.run_once(T0)
    report = c.rebalance(T0)
    doc = plan_document(c.last_report, (), report)
    section = doc["rebalance"]
    assert section["strandedGpus"] == 12 and section["strandedGpusAfter"] == 0
    [move] = section["moves"]
    assert move["pods"] == ["inf/chat-1"] and move["from"] == {"n2": 1} and move["for"] == "gang job/ml/wait"
    assert move["results"] == ["dry_run"]
    out = io.StringIO()
    print_table(doc, out)
    text = out.getvalue()
    assert "Rebalance (moves against fragmentation, burst nodes emptied):" in text
    assert "12 now, 0 after the moves" in text
    assert "move deployment/inf/chat: inf/chat-1 from n2 (1) to" in text
    assert plan_document(c.last_report, (), None)["rebalance"] is None  # off: no section


def test_a_target_still_waiting_after_its_move_is_not_moved_for_again_before_retry_after() -> None:
    c, cluster, _ = world(config=replace(CONFIG, retry_after_s=1800.0))
    moved_at = []
    for i in range(12):  # an hour of passes; the replica is put back where it was each time
        now = T0 + 300 * i
        if "inf/chat-1" not in cluster.pods:
            cluster.add_pod(PodInfo("inf", "chat-1", "n2", 1, 1000, "Running", True, "Deployment", "chat",
                                    labels={"app": "chat"}))
        c.run_once(now)
        report = c.rebalance(now + 1)
        assert report is not None and report.plan is not None
        if any(r.result == "applied" for r in report.results):
            moved_at.append(now)
        elif moved_at:
            assert any("still waiting" in n for n in report.plan.notes), report.plan.notes
    assert moved_at == [T0, T0 + 1800]


def test_the_put_back_hold_shows_as_a_gauge_and_holds_the_pass() -> None:
    """Stop 48: three targets in a row whose room the scheduler refilled hold every move for put_back_hold_s; the
    leader's pass moves nothing and ``gpu_autoscaler_rebalance_held_seconds`` says how long the hold still runs."""
    from autoscaler.core.rebalance import RebalanceState

    c, cluster, _ = world()
    c.run_once(T0)
    c.rebalance_state = RebalanceState(put_back=((T0 - 60.0, True), (T0 - 30.0, True), (T0, True)))
    report = c.rebalance(T0 + 1)
    assert report is not None and report.plan is not None and report.plan.actions == ()
    assert any(n.startswith("moves held for") for n in report.plan.notes), report.plan.notes
    assert evicted(cluster) == []
    assert sample(c, "gpu_autoscaler_rebalance_held_seconds") == CONFIG.put_back_hold_s - 1
    # not held: 0
    c2, cluster2, _ = world()
    c2.run_once(T0)
    c2.rebalance(T0 + 1)
    assert evicted(cluster2) == ["chat-1"] and sample(c2, "gpu_autoscaler_rebalance_held_seconds") == 0.0
