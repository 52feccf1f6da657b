"""Controller.run_once with in-memory ports: holds on bad reads, survives bad writes, dry-run, leadership."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object

from autoscaler.controller import Controller
from autoscaler.core.model import Mode, ScaleDeployment, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.ports import PolicyObject, PortError
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
KEY = "ml/chat"


def make(
    replicas: int = 2,
    util: float | None = 70.0,
    dry_run: bool = False,
    mode: Mode = Mode.ACTIVE,
    **policy_kw: object,
) -> tuple[Controller, FakeCluster, FakeMetrics, FakePolicies, FakeStatus]:
    cluster = FakeCluster(deployments={KEY: [replicas, replicas]})
    metrics = FakeMetrics(cluster)
    if util is not None:
        metrics.util[KEY] = util
    policy = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0, mode=mode, **policy_kw)  # type: ignore[arg-type]
    policies = FakePolicies([policy_object(policy)])
    status = FakeStatus()
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=policies,
        status_writer=status,
        telemetry=Telemetry(identity="test"),
        dry_run=dry_run,
    )
    return controller, cluster, metrics, policies, status


def sample(c: Controller, name: str, **labels: str) -> float:
    value = c.telemetry.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def scales(cluster: FakeCluster) -> list[tuple[object, ...]]:
    return [w.args for w in cluster.writes if w.op == "scale"]


def test_scale_up_is_applied_with_event_status_and_metrics() -> None:
    c, cluster, _, _, status = make(replicas=2, util=140.0)
    plan = c.run_once(T0)
    assert [type(a) for a in plan.actions] == [ScaleDeployment]
    assert scales(cluster) == [("ml", "chat", 4)]
    assert cluster.events and cluster.events[0]["kind"] == "Deployment"
    assert cluster.events[0]["reason"] == "MetricAboveTarget"
    assert "from 2 to 4" in cluster.events[0]["message"] and "[dry-run]" not in cluster.events[0]["message"]
    written = status.status[("ml", "chat-policy")]
    assert written["currentReplicas"] == 2 and written["desiredReplicas"] == 4
    assert written["lastAction"]["reason"] == "metric_above_target"
    assert {c["type"]: c["status"] for c in written["conditions"]} == {
        "Ready": "True",
        "MetricsStale": "False",
        "AtMaxReplicas": "False",
        "InvalidSpec": "False",
    }
    assert written["observedGeneration"] == 1
    labels = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "false", "result": "applied"}
    assert sample(c, "gpu_autoscaler_actions_total", **labels) == 1
    assert sample(c, "gpu_autoscaler_ticks_total", result="ok") == 1
    assert sample(c, "gpu_autoscaler_desired_replicas", namespace="ml", service="chat") == 4
    assert sample(c, "gpu_autoscaler_current_replicas", namespace="ml", service="chat") == 2


def test_status_is_not_rewritten_when_nothing_changed() -> None:
    c, cluster, _, _, status = make(replicas=2, util=70.0)
    c.run_once(T0)
    c.run_once(T0 + 15)
    c.run_once(T0 + 30)
    assert status.writes == 1
    assert scales(cluster) == []


def test_stale_metrics_hold_and_say_so_once() -> None:
    c, cluster, metrics, _, status = make(replicas=6, util=10.0)
    c.acting_since = T0 - 3600  # past the takeover grace, so only staleness can hold the scale-down
    metrics.stale[KEY] = ("empty result",)
    for i in range(3):
        plan = c.run_once(T0 + 15 * i)
        assert plan.actions == ()
        assert plan.decisions[0].reason is Reason.METRICS_STALE
    assert scales(cluster) == []
    stale_events = [e for e in cluster.events if e["reason"] == "MetricsStale"]
    assert len(stale_events) == 1 and stale_events[0]["type"] == "Warning"
    assert stale_events[0]["kind"] == "GPUScalingPolicy" and "empty result" in stale_events[0]["message"]
    assert sample(c, "gpu_autoscaler_stale_services", namespace="ml", service="chat", reason="no_data") == 1
    conditions = {c["type"]: c for c in status.status[("ml", "chat-policy")]["conditions"]}
    assert conditions["MetricsStale"]["status"] == "True"
    # recovery clears the gauge and the condition, and scales down on fresh data
    del metrics.stale[KEY]
    c.run_once(T0 + 60)
    assert sample(c, "gpu_autoscaler_stale_services", namespace="ml", service="chat", reason="no_data") == 0
    conditions = {c["type"]: c for c in status.status[("ml", "chat-policy")]["conditions"]}
    assert conditions["MetricsStale"]["status"] == "False"


@pytest.mark.parametrize(
    ("failing", "component"),
    [("metrics", "metrics_read"), ("cluster", "cluster_read"), ("policies", "policy_read")],
)
def test_port_error_on_read_holds_and_never_scales_down(failing: str, component: str) -> None:
    c, cluster, metrics, policies, _ = make(replicas=8, util=5.0)
    c.acting_since = T0 - 3600
    c.run_once(T0 - 600)  # a warm controller: its first tick only seeds the history (upstream's initial recommendation)
    assert cluster.writes == []
    target = {"metrics": metrics, "cluster": cluster, "policies": policies}[failing]
    if failing == "cluster":
        cluster.fail_reads = PortError("connection refused")
    else:
        target.fail = PortError("connection refused")  # type: ignore[union-attr]
    for i in range(3):
        plan = c.run_once(T0 + 15 * i)
        assert plan.actions == ()
        assert c.last_report is not None and c.last_report.result == "hold"
    assert cluster.writes == []
    assert sample(c, "gpu_autoscaler_errors_total", component=component) == 3
    assert sample(c, "gpu_autoscaler_ticks_total", result="hold") == 3
    # once the read works again, the same low load does scale down
    cluster.fail_reads = None
    metrics.fail = None
    policies.fail = None
    plan = c.run_once(T0 + 60)
    assert [a.replicas for a in plan.actions if isinstance(a, ScaleDeployment)] == [1]


def test_metrics_outage_holds_even_if_decide_misbehaves() -> None:
    """Defence in depth: a scale-down planned on a tick whose metrics read failed is never applied."""
    c, cluster, metrics, _, _ = make(replicas=8, util=5.0)
    c.acting_since = T0 - 3600
    from autoscaler.core.model import Plan

    def reckless(tick, state, config):  # type: ignore[no-untyped-def]
        action = ScaleDeployment("ml", "chat", 1, 8, Reason.METRIC_BELOW_TARGET, "ignores staleness")
        return Plan(tick.now, (), (action,)), state

    c._decide = reckless
    metrics.fail = PortError("prometheus down")
    c.run_once(T0)
    assert cluster.writes == []
    assert c.last_report is not None and [r.result for r in c.last_report.results] == ["held"]


def test_forecasts_that_cannot_be_read_leave_the_tick_reactive() -> None:
    from autoscaler.core.tick import ForecastReadConfig

    class BrokenForecasts:
        leads_recorded = False

        @property
        def published(self) -> dict[str, object]:
            raise RuntimeError("published fits unreadable")

        def read_config(self) -> ForecastReadConfig:
            return ForecastReadConfig()

        def record_leads(self, views: object) -> None:
            self.leads_recorded = True

        def start_term(self) -> None:
            pass

    c, cluster, _, _, _ = make(replicas=2, util=140.0)
    broken = BrokenForecasts()
    c.forecasts = broken  # type: ignore[assignment]
    c.run_once(T0)
    assert scales(cluster) == [("ml", "chat", 4)]  # decided reactively, and applied
    assert c.last_report is not None and c.last_report.result == "ok"
    assert c.last_report.errors == ["forecast_read: RuntimeError: published fits unreadable"]
    assert c.last_report.floors == {} and c.last_report.forecasts == {}
    assert not broken.leads_recorded
    assert sample(c, "gpu_autoscaler_errors_total", component="decide") == 1


def test_unexpected_exception_from_a_read_is_a_hold_not_a_crash() -> None:
    c, cluster, metrics, _, _ = make(replicas=8, util=5.0)
    metrics.fail = ValueError("adapter bug")
    c.run_once(T0)
    assert c.last_report is not None and c.last_report.result == "hold"
    assert cluster.writes == []


def test_failed_write_is_counted_and_retried_next_tick_at_full_rate() -> None:
    c, cluster, _, _, status = make(replicas=2, util=210.0)  # wants 6: the scale-up limit (4 pods/15 s) allows 6
    cluster.fail_writes = 1
    c.run_once(T0)
    assert scales(cluster) == []
    assert c.last_report is not None and [r.result for r in c.last_report.results] == ["failed"]
    assert sample(c, "gpu_autoscaler_errors_total", component="cluster_write") == 1
    assert "lastAction" not in status.status.get(("ml", "chat-policy"), {})
    # 5 s later, inside the same rate period: the failed change must not count against the limit
    c.run_once(T0 + 5)
    assert scales(cluster) == [("ml", "chat", 6)]
    last = status.status[("ml", "chat-policy")]["lastAction"]
    assert (last["fromReplicas"], last["toReplicas"], last["reason"]) == (2, 6, "metric_above_target")


def test_event_failure_does_not_fail_the_action() -> None:
    c, cluster, _, _, _ = make(replicas=2, util=140.0)
    cluster.fail_events = True
    c.run_once(T0)
    assert scales(cluster) == [("ml", "chat", 4)]
    assert sample(c, "gpu_autoscaler_errors_total", component="event_write") == 1


def test_status_failure_is_retried() -> None:
    c, _, _, _, status = make(replicas=2, util=70.0)
    status.fail = True
    c.run_once(T0)
    assert sample(c, "gpu_autoscaler_errors_total", component="status_write") == 1
    status.fail = False
    c.run_once(T0 + 15)
    assert ("ml", "chat-policy") in status.status


def test_dry_run_writes_nothing_but_marked_events() -> None:
    c, cluster, _, _, status = make(replicas=2, util=140.0, dry_run=True)
    for i in range(3):
        plan = c.run_once(T0 + 15 * i)
        assert len(plan.actions) == 1
    assert cluster.writes == []
    assert status.writes == 0
    assert cluster.deployments[KEY] == [2, 2]
    assert len(cluster.events) == 1  # the same recommendation is not repeated every tick
    assert cluster.events[0]["message"].startswith("[dry-run] would scale deployment/ml/chat from 2 to 4")
    labels = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "true", "result": "dry_run"}
    assert sample(c, "gpu_autoscaler_actions_total", **labels) == 3
    assert sample(c, "gpu_autoscaler_dry_run") == 1


def test_recommend_only_service_is_decided_not_acted_on() -> None:
    c, cluster, _, _, status = make(replicas=2, util=140.0, mode=Mode.RECOMMEND_ONLY)
    plan = c.run_once(T0)
    assert plan.actions == ()
    assert plan.decisions[0].desired_replicas == 4 and plan.decisions[0].recommend_only
    assert cluster.writes == []
    conditions = {c["type"]: c for c in status.status[("ml", "chat-policy")]["conditions"]}
    assert conditions["Ready"]["reason"] == "RecommendOnly"


def test_follower_does_not_act_and_a_lease_lost_mid_tick_stops_the_rest() -> None:
    cluster = FakeCluster(deployments={"ml/a": [2, 2], "ml/b": [2, 2]})
    metrics = FakeMetrics(cluster)
    metrics.util.update({"ml/a": 140.0, "ml/b": 140.0})
    objects = [policy_object(ServicePolicy("ml", n, max_replicas=20)) for n in ("a", "b")]
    leader = {"value": True}

    def can_act() -> bool:
        return leader["value"]

    c = Controller(metrics=metrics, cluster=cluster, writer=cluster, policies=FakePolicies(objects), can_act=can_act)
    original = cluster.scale_deployment

    def scale_then_lose_lease(namespace: str, name: str, replicas: int, **guards: object) -> None:
        original(namespace, name, replicas)
        leader["value"] = False  # the elector noticed a 409 while we were writing

    cluster.scale_deployment = scale_then_lose_lease  # type: ignore[method-assign]
    c.run_once(T0)
    assert scales(cluster) == [("ml", "a", 4)]
    assert c.last_report is not None and [r.result for r in c.last_report.results] == ["applied", "not_leader"]


def test_takeover_grace_holds_scale_down_for_one_stabilisation_window() -> None:
    c, cluster, _, _, _ = make(replicas=6, util=10.0)
    c.start_acting(T0)
    c.run_once(T0)
    c.run_once(T0 + 150)
    assert scales(cluster) == []
    # the core holds by itself now (the initial recommendation seeds its window); the grace stays as defence in depth
    assert c.last_report is not None and c.last_report.plan.decisions[0].reason is Reason.SCALE_DOWN_STABILISED
    c.run_once(T0 + 301)
    assert scales(cluster) == [("ml", "chat", 1)]


def test_takeover_grace_never_delays_a_scale_up() -> None:
    c, cluster, _, _, _ = make(replicas=2, util=140.0)
    c.start_acting(T0)
    c.run_once(T0)
    assert scales(cluster) == [("ml", "chat", 4)]


def test_invalid_policy_gets_event_and_condition_others_keep_working() -> None:
    c, cluster, _, policies, status = make(replicas=2, util=140.0)
    bad = PolicyObject("ml", "broken", None, error="spec.maxReplicas: Input should be greater than or equal to 1")
    duplicate = policy_object(ServicePolicy("ml", "chat", max_replicas=3), name="zz-duplicate")
    policies.objects += [bad, duplicate]
    c.run_once(T0)
    assert scales(cluster) == [("ml", "chat", 4)]  # the first policy by name wins (max 20): no fight over it
    c.metrics.util[KEY] = 70.0  # type: ignore[attr-defined]
    c.run_once(T0 + 15)
    invalid = [e for e in cluster.events if e["reason"] == "InvalidSpec"]
    assert sorted(e["name"] for e in invalid) == ["broken", "zz-duplicate"]  # once each, not every tick
    assert "spec.maxReplicas" in next(e for e in invalid if e["name"] == "broken")["message"]
    ready = next(c for c in status.status[("ml", "broken")]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec" and "spec.maxReplicas" in ready["message"]
    assert sample(c, "gpu_autoscaler_invalid_policies") == 2


def test_missing_deployment_is_stale_not_zero() -> None:
    c, cluster, _, _, status = make(replicas=2, util=140.0)
    del cluster.deployments[KEY]
    plan = c.run_once(T0)
    assert plan.actions == ()
    assert (
        sample(c, "gpu_autoscaler_stale_services", namespace="ml", service="chat", reason="deployment_not_found") == 1
    )
    assert (
        c.telemetry.registry.get_sample_value("gpu_autoscaler_current_replicas", {"namespace": "ml", "service": "chat"})
        is None
    )
    ready = next(c for c in status.status[("ml", "chat-policy")]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "DeploymentNotFound"


def test_condition_transition_time_only_moves_on_flip() -> None:
    c, _, metrics, _, status = make(replicas=2, util=70.0)
    c.run_once(T0)
    first = {c["type"]: c["lastTransitionTime"] for c in status.status[("ml", "chat-policy")]["conditions"]}
    metrics.util[KEY] = 140.0
    c.run_once(T0 + 60)
    second = {c["type"]: c["lastTransitionTime"] for c in status.status[("ml", "chat-policy")]["conditions"]}
    assert first["Ready"] == second["Ready"] and first["MetricsStale"] == second["MetricsStale"]


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("Prometheus at http://prometheus:9090 unreachable: connection refused", "metrics_unavailable"),
        ("DCGM_FI_DEV_GPU_UTIL: no DCGM_FI_DEV_GPU_UTIL series for any pod of ml/chat", "no_data"),
        ("pod chat-x: value is NaN", "invalid_value"),
        ("answer evaluated 300s before the tick (> 120s)", "sample_too_old"),
        ("Prometheus query failed: HTTP 400 bad_data", "query_failed"),
        ("deployment_not_found", "deployment_not_found"),
        ("pod chat-x: 2 series (UUID differs)", "duplicate_series"),
        ("something new", "other"),
        # an override the adapter refused before sending it; the messages quote the tenant's text, so none of it
        # may pick the category ("info" holds "inf", "no " is in many a selector)
        (
            "spec.queries.requestRate: info() may not be used in an override: it reads series (target_info) that no "
            "selector of the query names",
            "query_refused",
        ),
        (
            'spec.queries.requestRate: selector inference_requests_total{job="no older than"} does not select '
            'namespace="ml": an override may read only its own namespace (add namespace="{namespace}" to every '
            "selector)",
            "query_refused",
        ),
        ("spec.queries.queueDepth: the query must be on one line (no line breaks)", "query_refused"),
        ("spec.queries.latency: not valid PromQL: unexpected end of input", "query_refused"),
        (
            "spec.queries.requestRate: unknown placeholder {pod_label} in query template "
            "'sum(x{namespace=\"{namespace}\"}) by ({pod_label})' (known: {name}, {namespace}, {window})",
            "query_refused",
        ),
        # Prometheus's answer to an override that was sent: the same prefix, not a refusal
        (
            'spec.queries.requestRate: Prometheus query failed: HTTP Status Code 400 (b\'{"status":"error",'
            '"errorType":"bad_data","error":"1:1: parse error: unclosed left parenthesis"}\')',
            "query_failed",
        ),
        (
            'spec.queries.requestRate: Prometheus query failed: bad_data: unknown function with name "info"',
            "query_failed",
        ),
        ("spec.queries.requestRate: 2 series for one service (differing in pod)", "duplicate_series"),
        ("spec.queries.queueDepth: value is NaN", "invalid_value"),
    ],
)
def test_stale_reason_label_is_bounded(text: str, category: str) -> None:
    from autoscaler.reporting import stale_category

    assert stale_category(text) == category


def _override_refusals(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every message with which the Prometheus adapter refuses an override at a tick, produced by the functions
    that refuse it (render, check_self_contained, check_confined), so that a new or reworded one is tried too."""
    from autoscaler.adapters import promql

    def refusal(check: Callable[[], object]) -> str:
        with pytest.raises(promql.PromQLError) as caught:
            check()
        return str(caught.value)

    ns = "ml"
    confined = promql.check_confined
    found = [
        refusal(lambda: promql.render("x{a}", {"window": "1m"}, {"namespace": ns})),
        refusal(lambda: promql.render("x{{namespace}}", {}, {"namespace": ns})),
        refusal(lambda: promql.render('x{a="b}', {}, {"namespace": ns})),
        refusal(lambda: promql.render("x{a=`{namespace}`}", {}, {"namespace": "a`b"})),
        refusal(lambda: promql.check_self_contained("x\nor y")),
        refusal(lambda: promql.check_self_contained("x # y")),
        refusal(lambda: promql.check_self_contained("x)")),
        refusal(lambda: promql.check_self_contained("(x")),
        refusal(lambda: promql.check_self_contained('x{a="b}')),
        refusal(lambda: confined('x{a="' + "b" * promql.MAX_CONFINED_QUERY_CHARS + '"}', "namespace", ns)),
        refusal(lambda: confined("-" * promql.MAX_CONFINED_CODE_CHARS + "x", "namespace", ns)),
        refusal(lambda: confined("sum(", "namespace", ns)),
        refusal(lambda: confined('inf_total{job="infra"}', "namespace", ns)),
        refusal(lambda: confined('info(x{namespace="ml"})', "namespace", ns)),
    ]

    class PanicException(BaseException):  # the name pyo3 gives a Rust panic
        pass

    def panic(_: str) -> None:
        raise PanicException("index out of bounds")

    promql._confinement_problem.cache_clear()
    monkeypatch.setattr(promql.promql_parser, "parse", panic)
    found.append(refusal(lambda: confined("x", "namespace", "panics")))
    monkeypatch.setattr(promql.promql_parser, "parse", lambda _: object())  # a kind of node the check does not know
    found.append(refusal(lambda: confined("x", "namespace", "unknown-node")))
    promql._confinement_problem.cache_clear()
    return found


def test_every_refusal_of_an_override_is_query_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscaler.reporting import stale_category

    refusals = _override_refusals(monkeypatch)
    assert len(set(refusals)) == len(refusals) == 16, refusals
    for field in ("requestRate", "queueDepth", "latency"):
        for message in refusals:
            reason = f"spec.queries.{field}: {message}"
            assert stale_category(reason) == "query_refused", reason
            # cut as the adapter cuts a reason (500 characters), it is the same refusal
            assert stale_category(reason[:497] + "...") == "query_refused", reason
            # the same text anywhere else is not a refusal of this override
            assert stale_category(f"spec.queries.{field}: Prometheus query failed: {message}") == "query_failed"


def test_the_runbook_explains_every_stale_reason_label() -> None:
    """The ``reason`` values of gpu_autoscaler_stale_services are the rows of the alert's runbook table."""
    import re
    from pathlib import Path

    from autoscaler.reporting import STALE_CATEGORY_NAMES

    runbook = Path(__file__).resolve().parents[2] / "deploy/runbooks/GPUAutoscalerServiceMetricsStale.md"
    rows = re.findall(r"^\| `([a-z_]+)` \|", runbook.read_text(), flags=re.M)
    assert sorted(rows) == sorted(STALE_CATEGORY_NAMES)


def test_no_eviction_or_suspension_on_a_tick_with_stale_metrics() -> None:
    from autoscaler.core.model import EvictPod, Plan, SuspendWorkload

    c, cluster, metrics, _, _ = make(replicas=2, util=140.0)

    def preempting(tick, state, config):  # type: ignore[no-untyped-def]
        actions = (
            EvictPod("train", "worker-0", Reason.PREEMPT_FOR_INFERENCE, "free 1 GPU", gang="jobset/train/llm"),
            SuspendWorkload("JobSet", "train", "llm", Reason.PREEMPT_FOR_INFERENCE, "free 8 GPUs"),
        )
        return Plan(tick.now, (), actions), state

    c._decide = preempting
    metrics.stale[KEY] = ("empty result",)
    c.run_once(T0)
    assert cluster.writes == []
    assert c.last_report is not None and [r.result for r in c.last_report.results] == ["held", "held"]
    del metrics.stale[KEY]
    c.run_once(T0 + 15)  # fresh data: the same plan is applied
    assert [w.op for w in cluster.writes] == ["evict", "suspend"]
    assert [e["kind"] for e in cluster.events if e["type"] == "Normal"] == ["Pod", "JobSet"]
    assert (
        sample(
            c,
            "gpu_autoscaler_actions_total",
            kind="EvictPod",
            reason="preempt_for_inference",
            dry_run="false",
            result="applied",
        )
        == 1
    )


def test_eviction_blocked_by_a_pdb_is_not_now() -> None:
    from autoscaler.core.model import EvictPod, Plan

    c, cluster, _, _, _ = make(replicas=2, util=70.0)
    cluster.evictions_blocked = True

    def evict(tick, state, config):  # type: ignore[no-untyped-def]
        return Plan(tick.now, (), (EvictPod("train", "w-0", Reason.PREEMPT_FOR_INFERENCE, "free 1 GPU"),)), state

    c._decide = evict
    c.run_once(T0)
    assert c.last_report is not None and [r.result for r in c.last_report.results] == ["blocked"]
    assert cluster.events == []  # nothing happened, so no Event says it did


def test_a_second_policy_on_the_same_deployment_does_not_take_it_over() -> None:
    """Issue 17, defect 3: the newcomer, listed first and named first, is the one reported invalid."""
    c, cluster, _, policies, status = make(replicas=4, util=70.0)
    c.run_once(T0)
    greedy = ServicePolicy("ml", "chat", min_replicas=10, max_replicas=20, target=70.0)
    policies.objects.insert(0, policy_object(greedy, name="a-newcomer"))
    plan = c.run_once(T0 + 15)
    assert scales(cluster) == []  # not scaled to the newcomer's minReplicas 10
    assert [d.desired_replicas for d in plan.decisions] == [4]
    conditions = {x["type"]: x for x in status.status[("ml", "a-newcomer")]["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "True"
    assert "already scaled by chat-policy" in conditions["InvalidSpec"]["message"]
    assert {x["type"]: x["status"] for x in status.status[("ml", "chat-policy")]["conditions"]}["InvalidSpec"] == (
        "False"
    )


def test_a_deployment_an_hpa_scales_is_only_recommended_for_until_the_hpa_is_gone() -> None:
    """Issue 16: never two controllers writing one scale subresource. Without spec.adoptHpa an HPA on the same
    Deployment is a conflict (Warning); with it the hand-over waits for the HPA's deletion (Normal Event); then the
    controller acts."""
    from autoscaler.core.cluster import HpaInfo

    c, cluster, _, policies, _ = make(replicas=2, util=140.0)
    cluster.hpas = [HpaInfo("ml", "chat-hpa", "Deployment", "chat", 1, 10, current_replicas=2, desired_replicas=3)]
    plan = c.run_once(T0)
    assert scales(cluster) == [] and plan.actions == ()
    assert plan.decisions[0].recommend_only and plan.decisions[0].desired_replicas == 4  # still recommended
    assert c.last_report is not None and [h.name for h in c.last_report.hpas["ml/chat"]] == ["chat-hpa"]
    conflict = [e for e in cluster.events if e["reason"] == "HpaConflict"]
    assert len(conflict) == 1 and conflict[0]["type"] == "Warning" and "chat-hpa" in conflict[0]["message"]

    policies.objects = [dataclasses.replace(policies.objects[0], adopt_hpa="chat-hpa")]
    c.run_once(T0 + 15)
    c.run_once(T0 + 30)
    assert scales(cluster) == []
    waiting = [e for e in cluster.events if e["reason"] == "WaitingForHpaRemoval"]
    assert len(waiting) == 1 and waiting[0]["type"] == "Normal"  # once per episode, not every tick
    assert "kubectl delete hpa chat-hpa -n ml" in waiting[0]["message"]

    cluster.hpas = []  # the user deleted the HPA
    c.run_once(T0 + 45)
    assert scales(cluster) == [("ml", "chat", 4)]
