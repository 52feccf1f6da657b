"""Settings: defaults, precedence (flags > env > file > defaults), and errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.settings import SettingsError, load_settings, settings_table


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("AUTOSCALER_") or key in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    s = load_settings()
    assert s.tick_interval_seconds == 15
    assert s.dry_run is False
    assert s.http.port == 8080
    le = s.leader_election
    assert (le.lease_duration_seconds, le.renew_deadline_seconds, le.retry_period_seconds) == (15, 10, 2)
    assert s.namespaces == []


def test_identity_from_pod_name_else_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = load_settings(), load_settings()
    assert a.leader_election.identity != b.leader_election.identity  # two processes on one host never collide
    monkeypatch.setenv("POD_NAME", "autoscaler-7d9f-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "gpu-system")
    s = load_settings()
    assert s.leader_election.identity == "autoscaler-7d9f-abcde"
    assert s.leader_election.lease_namespace == "gpu-system"


def test_precedence_flags_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "tick_interval_seconds: 30\nrefit_interval_seconds: 600\nnamespaces: [ml, search]\n"
        "leader_election: {lease_name: from-file}\nprometheus: {url: 'http://file:9090', timeout_seconds: 3}\n"
    )
    monkeypatch.setenv("AUTOSCALER_REFIT_INTERVAL_SECONDS", "1200")
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_URL", "http://env:9090")
    s = load_settings(config, dry_run=True, tick_interval_seconds=None)
    assert s.tick_interval_seconds == 30  # file (the flag was not given)
    assert s.refit_interval_seconds == 1200  # env beats file
    assert s.dry_run is True  # flag
    assert s.namespaces == ["ml", "search"]
    assert s.leader_election.lease_name == "from-file"
    assert s.prometheus.url == "http://env:9090"  # env beats file in the Prometheus group too
    assert s.prometheus.timeout_seconds == 3
    assert s.config_file == config
    assert load_settings(config, prometheus={"url": "http://flag:9090"}).prometheus.url == "http://flag:9090"


def test_config_file_from_env_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"http": {"port": 9999}, "dry_run": true}')
    monkeypatch.setenv("AUTOSCALER_CONFIG_FILE", str(config))
    s = load_settings()
    assert s.http.port == 9999 and s.dry_run


def test_nested_env_and_comma_separated_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__LEASE_NAME", "x")
    monkeypatch.setenv("AUTOSCALER_NAMESPACES", "ml, search")
    monkeypatch.setenv("AUTOSCALER_LOG_LEVEL", "debug")
    s = load_settings()
    assert s.leader_election.lease_name == "x"
    assert s.namespaces == ["ml", "search"]
    assert s.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("env", "value", "expected"),
    [
        (
            "AUTOSCALER_TICK_INTERVAL_SECONDS",
            "0",
            "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be > 0",
        ),
        ("AUTOSCALER_HTTP__PORT", "70000", "AUTOSCALER_HTTP__PORT (http.port): must be <= 65535"),
        ("AUTOSCALER_HTTP__PORTT", "1", "AUTOSCALER_HTTP__PORTT (http.portt): unknown setting"),
        ("AUTOSCALER_DRY_RUN", "maybe", "AUTOSCALER_DRY_RUN (dry_run)"),
        (
            "AUTOSCALER_LEADER_ELECTION__RENEW_DEADLINE_SECONDS",
            "20",
            "(leader_election.renew_deadline_seconds) (20) must be < AUTOSCALER_LEADER_ELECTION__LEASE_DURATION",
        ),
        ("AUTOSCALER_TICK_STALL_SECONDS", "5", "AUTOSCALER_TICK_STALL_SECONDS (tick_stall_seconds) (5) must be >"),
        ("AUTOSCALER_PROMETHEUS_URL", "prometheus:9090", "AUTOSCALER_PROMETHEUS_URL (prometheus.url)"),
        ("AUTOSCALER_PROMETHEUS__URL", "http://x", "single underscore"),
    ],
)
def test_errors_name_the_setting(monkeypatch: pytest.MonkeyPatch, env: str, value: str, expected: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert expected in str(info.value)


def test_file_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tick_interval_seconds: -1\nleader_election: {lease_nmae: x}\n")
    with pytest.raises(SettingsError) as info:
        load_settings(bad)
    text = str(info.value)
    assert "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be > 0" in text
    assert "(leader_election.lease_nmae): unknown setting" in text
    assert str(bad) in text
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SettingsError, match="must hold a mapping"):
        load_settings(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("a: [\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(tmp_path / "broken.yaml")


def test_every_setting_is_documented_with_a_unit_or_choice() -> None:
    rows = settings_table()
    assert len(rows) > 20
    for env, key, _default, description in rows:
        assert description, f"{env} ({key}) has no description"
        if key.endswith("_seconds"):
            assert "second" in description or " s" in description or "s," in description, (env, description)
