"""Settings: defaults, precedence (flags > env > file > defaults), and errors that name the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_settings import EnvSettingsSource

from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.settings import Settings, SettingsError, env_name, load_settings, settings_table

REPO = Path(__file__).resolve().parents[2]


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
        (
            # the leader writes only a request timeout before its Lease could pass on: 13 + 2 s leave no time
            "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS",
            "13",
            "(kubernetes.request_timeout_seconds) (13) + AUTOSCALER_LEADER_ELECTION__RETRY_PERIOD_SECONDS",
        ),
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


# Every environment variable whose value is JSON: the settings pydantic-settings decodes as JSON (dicts, lists and
# whole groups, AUTOSCALER_<GROUP>='{...}') and the lists that also accept a JSON array. A syntax error in any of
# them used to escape the settings errors as a pydantic_settings traceback with exit 1.
JSON_VALUED = {
    "AUTOSCALER_NAMESPACES": "[ml, search",
    "AUTOSCALER_LEADER_ELECTION": "{bad",
    "AUTOSCALER_HTTP": "{bad",
    "AUTOSCALER_SCHEDULER_EXTENDER": "{bad",
    "AUTOSCALER_KUBERNETES": "{bad",
    "AUTOSCALER_NODE_POOLS": "{bad",
    "AUTOSCALER_NODE_POOLS__POOLS": "notjson",
    "AUTOSCALER_FORECAST": "{bad",
    "AUTOSCALER_FORECAST__MODEL_PARAMS": "{bad",
    "AUTOSCALER_FORECAST__AUTO_CANDIDATES": '["last_value",',
    "AUTOSCALER_PROMETHEUS": "{bad",
    "AUTOSCALER_PROMETHEUS_EXTRA_HEADERS": "nope",
    "AUTOSCALER_CAPACITY": "{bad",
    "AUTOSCALER_CAPACITY__BURST_POOLS": "{bad",
    "AUTOSCALER_CAPACITY__EXPANDERS": '["cheapest",',
    "AUTOSCALER_REBALANCE": "{bad",
}
# What the line says; the Prometheus group has no JSON form (its settings keep their own flat variables).
EXPECTED = {"AUTOSCALER_PROMETHEUS": "use the AUTOSCALER_PROMETHEUS_* variables"}
# The commands that read the settings: run and plan all of them, observe the Prometheus ones.
COMMANDS = {"run": ("run", "--once"), "plan": ("plan",), "observe": ("observe",)}


def json_valued_settings() -> set[str]:
    """The environment variables of every field pydantic-settings itself treats as complex (JSON-decoded)."""
    source = EnvSettingsSource(Settings)
    found: set[str] = set()

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            if source.field_is_complex(info):
                found.add(env_name((*prefix, name)))
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, (*prefix, name))

    walk(Settings, ())
    return found


def test_the_bad_json_table_covers_every_json_valued_setting() -> None:
    assert set(JSON_VALUED) == json_valued_settings()
    assert "extra_headers" in PrometheusSettings.model_fields


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real command line in a fresh interpreter, with only ``env`` as its AUTOSCALER_* environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    clean.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("command", "env"),
    [
        (command, env)
        for env in JSON_VALUED
        for command in COMMANDS
        if command != "observe" or env == "AUTOSCALER_PROMETHEUS_EXTRA_HEADERS"
    ],
)
def test_bad_json_exits_2_naming_the_variable(command: str, env: str) -> None:
    result = run_cli(*COMMANDS[command], env={env: JSON_VALUED[env]})
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    # plan and observe report on stderr; run reports its settings errors on stdout (test_commands pins that)
    report = result.stdout if command == "run" else result.stderr
    lines = [line for line in report.splitlines() if env in line]
    assert lines, report
    assert EXPECTED.get(env, "not valid JSON") in lines[0], report


def test_valid_json_values_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_FORECAST__MODEL_PARAMS", '{"residual_window": 2880}')  # a PhaseNaive parameter
    monkeypatch.setenv("AUTOSCALER_NODE_POOLS__POOLS", '{"a100": "md-a100"}')
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_EXTRA_HEADERS", '{"X-Scope-OrgID": "team-a"}')
    monkeypatch.setenv("AUTOSCALER_HTTP", '{"port": 9000}')
    monkeypatch.setenv("AUTOSCALER_HTTP__BIND_ADDRESS", "127.0.0.1")  # merged with the group's JSON
    monkeypatch.setenv("AUTOSCALER_NAMESPACES", '["ml", "search"]')
    s = load_settings()
    assert s.forecast.model_params == {"residual_window": 2880}
    assert s.node_pools.pools == {"a100": "md-a100"}
    assert s.prometheus.extra_headers == {"X-Scope-OrgID": "team-a"}
    assert (s.http.port, s.http.bind_address) == (9000, "127.0.0.1")
    assert s.namespaces == ["ml", "search"]
    assert PrometheusSettings().extra_headers == {"X-Scope-OrgID": "team-a"}


def test_a_json_value_of_the_wrong_shape_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_FORECAST__MODEL_PARAMS", "[1, 2]")
    with pytest.raises(SettingsError, match=r"AUTOSCALER_FORECAST__MODEL_PARAMS \(forecast.model_params\)"):
        load_settings()


def test_secret_headers_are_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_EXTRA_HEADERS", '{"Authorization": "Bearer s3cret"')
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "AUTOSCALER_PROMETHEUS_EXTRA_HEADERS" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_any_value_a_source_cannot_decode_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The last line of defence for a JSON-valued setting added without NoDecode: pydantic-settings' own decode
    # error is still a SettingsError (exit 2) that names the field, never a traceback.
    def undecodable(*args: object) -> object:
        raise ValueError("Expecting value: line 1 column 1 (char 0)")

    monkeypatch.setattr(EnvSettingsSource, "prepare_field_value", undecodable)
    with pytest.raises(SettingsError, match=r'error parsing value for field "\w+".*: Expecting value'):
        load_settings()
