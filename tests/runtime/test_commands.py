"""``autoscaler run`` / ``autoscaler plan`` command lines, with the adapters replaced by in-memory fakes."""

from __future__ import annotations

import json
import os

import pytest
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, policy_object

from autoscaler import app
from autoscaler.app import Adapters
from autoscaler.cli import main
from autoscaler.core.model import Mode, ServicePolicy
from autoscaler.ports import PolicyObject, PortError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("AUTOSCALER_"):
            monkeypatch.delenv(key)


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCluster, FakeMetrics]:
    cluster = FakeCluster(deployments={"ml/chat": [2, 2], "ml/search": [3, 3], "ml/embed": [4, 4]})
    metrics = FakeMetrics(cluster)
    metrics.util.update({"ml/chat": 140.0, "ml/embed": 20.0})
    metrics.stale["ml/search"] = ("empty result",)
    objects = [
        policy_object(ServicePolicy("ml", "chat", max_replicas=10)),
        policy_object(ServicePolicy("ml", "search")),
        policy_object(ServicePolicy("ml", "embed", mode=Mode.RECOMMEND_ONLY)),
        PolicyObject("ml", "broken", None, error="spec.targetRef.name: Field required"),
    ]

    def fake_build(settings: object, *, check_prometheus: bool = True) -> Adapters:
        return Adapters(metrics, cluster, cluster, FakePolicies(objects), None, None)

    monkeypatch.setattr(app, "build_adapters", fake_build)
    return cluster, metrics


def test_plan_table_shows_every_decision_with_its_reason(
    fake_cluster: tuple[FakeCluster, FakeMetrics], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, _ = fake_cluster
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing was changed" in out
    assert "ml/chat" in out and "metric_above_target" in out and "gpu_utilization 140 per pod" in out
    assert "ml/search" in out and "metrics_stale" in out and "empty result" in out
    assert "recommend-only" in out  # ml/embed: decided, never acted on
    assert "ScaleDeployment  deployment/ml/chat  scale deployment/ml/chat from 2 to 4" in out
    assert "ml/broken: spec.targetRef.name: Field required" in out
    assert "metric is above its target" in out  # the human text of the reason
    assert cluster.writes == [] and cluster.events == []  # plan writes nothing, not even Events


def test_plan_json(fake_cluster: tuple[FakeCluster, FakeMetrics], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-o", "json", "--time", "1800000000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["time"] == "2027-01-15T08:00:00Z"
    by_service = {d["service"]: d for d in doc["decisions"]}
    assert by_service["ml/chat"]["desiredReplicas"] == 4
    assert by_service["ml/search"]["stale"] == ["empty result"]
    assert by_service["ml/embed"]["mode"] == "recommend-only"
    assert [a["target"] for a in doc["actions"]] == ["deployment/ml/chat"]
    assert doc["actions"][0]["wouldApply"] is True
    assert doc["invalidPolicies"] == [{"policy": "ml/broken", "error": "spec.targetRef.name: Field required"}]
    # the dry-run Events the controller would have written are shown, not sent
    assert any(e["message"].startswith("[dry-run] would scale") for e in doc["events"])


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e20", "-1", "abc"])
def test_plan_time_out_of_range_is_a_usage_error_naming_it(
    fake_cluster: tuple[FakeCluster, FakeMetrics], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--time nan or inf was accepted (type=float), and the report's date crashed with a traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", f"--time={value}"])  # = : -inf is not taken for an option
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --time:" in err and repr(value) in err and "Traceback" not in err


@pytest.mark.parametrize(("value", "date"), [("0", "1970-01-01T00:00:00Z"), ("253402300799", "9999-12-31T23:59:59Z")])
def test_plan_time_at_the_ends_of_the_range(
    fake_cluster: tuple[FakeCluster, FakeMetrics], capsys: pytest.CaptureFixture[str], value: str, date: str
) -> None:
    assert main(["plan", "-o", "json", "--time", value]) == 0
    assert json.loads(capsys.readouterr().out)["time"] == date


def test_plan_exit_code_and_hold_reason_when_a_read_fails(
    fake_cluster: tuple[FakeCluster, FakeMetrics], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, _ = fake_cluster
    cluster.fail_reads = PortError("apiserver: connection refused")
    assert main(["plan"]) == 1
    out = capsys.readouterr().out
    assert "HOLD: cluster_read: PortError: apiserver: connection refused" in out


def test_plan_settings_error_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--prometheus-url", "prometheus:9090"]) == 2
    assert "AUTOSCALER_PROMETHEUS_URL (prometheus.url)" in capsys.readouterr().err


def test_run_rejects_bad_settings_naming_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTOSCALER_TICK_INTERVAL_SECONDS", "-5")
    assert main(["run"]) == 2
    assert "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be > 0" in capsys.readouterr().out


def test_run_list_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--list-settings"]) == 0
    out = capsys.readouterr().out
    for name in (
        "AUTOSCALER_TICK_INTERVAL_SECONDS",
        "AUTOSCALER_LEADER_ELECTION__LEASE_DURATION_SECONDS",
        "AUTOSCALER_HTTP__PORT",
        "AUTOSCALER_PROMETHEUS_URL",
        "AUTOSCALER_DRY_RUN",
    ):
        assert name in out


def test_run_once_acts_once_and_exits(
    fake_cluster: tuple[FakeCluster, FakeMetrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _ = fake_cluster
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__ENABLED", "false")
    assert main(["run", "--once"]) == 0  # one stale service is a hold for it, not a failed tick
    assert [w.args for w in cluster.writes] == [("ml", "chat", 4)]


def test_run_once_dry_run_writes_nothing(
    fake_cluster: tuple[FakeCluster, FakeMetrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _ = fake_cluster
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__ENABLED", "false")
    main(["run", "--once", "--dry-run"])
    assert cluster.writes == []
    assert all(e["message"].startswith("[dry-run]") for e in cluster.events)
