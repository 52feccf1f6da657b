"""Settings reject bad input with an error naming the setting, and lose nothing: unknown AUTOSCALER_* variables,
non-finite numbers, unreadable or ambiguous config files, and contradictory settings are refused at load (exit 2),
never ignored or left to fail at run time."""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from autoscaler.settings import NOT_SETTINGS, Settings, SettingsError, env_name, load_settings
from tests.runtime.test_settings import REPO, run_cli


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AUTOSCALER_") or key in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(key)


def settings_error(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], config: Path | None = None) -> str:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings(config)
    return str(info.value)


# ---- 1. every AUTOSCALER_* variable is a setting (or read elsewhere) --------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            "AUTOSCALER_TICK_INTERVAL",
            "AUTOSCALER_TICK_INTERVAL (tick_interval): unknown setting (typo?); "
            "did you mean AUTOSCALER_TICK_INTERVAL_SECONDS?",
        ),
        (
            "AUTOSCALER_PROMETHEUS_TYPO",
            "AUTOSCALER_PROMETHEUS_TYPO (prometheus.typo): unknown setting (typo?)",
        ),
        (
            "AUTOSCALER_PROMETHEUS_TIMEOUT",
            "AUTOSCALER_PROMETHEUS_TIMEOUT (prometheus.timeout): unknown setting (typo?); "
            "did you mean AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS?",
        ),
        ("AUTOSCALER_DRYRUN", "AUTOSCALER_DRYRUN (dryrun): unknown setting (typo?); did you mean AUTOSCALER_DRY_RUN?"),
        ("autoscaler_log_levle", "autoscaler_log_levle (log_levle): unknown setting (typo?)"),
        ("AUTOSCALER_LEADER_ELECTION__LEASE", "AUTOSCALER_LEADER_ELECTION__LEASE (leader_election.lease): unknown"),
        ("AUTOSCALER_HTTP__PORT__X", "AUTOSCALER_HTTP__PORT__X (http.port.x): unknown setting"),
        ("AUTOSCALER_HTTP____PORT", "AUTOSCALER_HTTP____PORT (http..port): unknown setting"),
        (
            "AUTOSCALER_HTTP_PORT",
            "AUTOSCALER_HTTP_PORT (http_port): unknown setting (typo?); did you mean AUTOSCALER_HTTP__PORT?",
        ),
        (
            "AUTOSCALER_CAPACITY__BURST_POOLS__P__MAX_NODEZ",
            "AUTOSCALER_CAPACITY__BURST_POOLS__P__MAX_NODEZ (capacity.burst_pools.p.max_nodez): unknown setting",
        ),
        ("AUTOSCALER_SERVICE_HOSTT", "AUTOSCALER_SERVICE_HOSTT (service_hostt): unknown setting"),
        ("AUTOSCALER_TRACE", "AUTOSCALER_TRACE (trace): unknown setting"),
    ],
)
def test_an_unknown_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch, env: str, expected: str) -> None:
    assert expected in settings_error(monkeypatch, {env: "1"})


def test_a_typo_in_the_environment_stops_run_with_exit_2() -> None:
    result = run_cli("run", "--once", env={"AUTOSCALER_TICK_INTERVAL": "30"})
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert "AUTOSCALER_TICK_INTERVAL (tick_interval): unknown setting" in result.stdout


@pytest.mark.parametrize(
    "env",
    [
        *({name: "/somewhere"} for name in NOT_SETTINGS),
        {"AUTOSCALER_NODE_POOLS__POOLS__A100": "md-a100"},  # a key of a mapping setting
        {"AUTOSCALER_CAPACITY__BURST_POOLS__CLOUD__MAX_NODES": "4"},  # a field of a mapping's value
        {"AUTOSCALER_FORECAST__MODEL_PARAMS__RESIDUAL_WINDOW": "2880"},
        {"AUTOSCALER_HTTP": '{"port": 9000}', "autoscaler_http__bind_address": "127.0.0.1"},  # a group; any case
        # Kubernetes service links of a Service named autoscaler (or autoscaler-web) in the controller's namespace
        {
            "AUTOSCALER_SERVICE_HOST": "10.0.0.1",
            "AUTOSCALER_SERVICE_PORT": "80",
            "AUTOSCALER_SERVICE_PORT_HTTP": "80",
            "AUTOSCALER_PORT": "tcp://10.0.0.1:80",
            "AUTOSCALER_PORT_80_TCP": "tcp://10.0.0.1:80",
            "AUTOSCALER_PORT_80_TCP_PROTO": "tcp",
            "AUTOSCALER_PORT_80_TCP_PORT": "80",
            "AUTOSCALER_PORT_80_TCP_ADDR": "10.0.0.1",
            "AUTOSCALER_WEB_SERVICE_HOST": "10.0.0.2",
            "AUTOSCALER_WEB_PORT": "udp://10.0.0.2:53",
        },
    ],
    ids=lambda env: next(iter(env)),
)
def test_variables_that_are_settings_or_read_elsewhere_still_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    load_settings()


# A variable read by name in the code, the scripts, the manifests or the tests: os.environ["X"], .get("X"),
# getenv("X"), ${X} or $X (never GPU_AUTOSCALER_*, another prefix).
READ = re.compile(
    r"(?:environ(?:\.get)?\(?\[?|getenv\()\s*[\"'](AUTOSCALER_[A-Z0-9_]+)[\"']|\$\{?(?<![A-Z_])(AUTOSCALER_[A-Z0-9_]+)"
)


def variables_read_by_the_repository() -> set[str]:
    found: set[str] = set()
    for top in ("autoscaler", "forecast", "scripts", "deploy", "tests", "benchmarks", "hack", ".ci", "Dockerfile"):
        root = REPO / top
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix not in ("", ".py", ".sh", ".yaml", ".yml", ".env", ".toml", ".cfg", ".md"):
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            found.update(a or b for a, b in READ.findall(text))
    return found


def test_every_variable_the_repository_reads_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    read = variables_read_by_the_repository()
    assert {"AUTOSCALER_TRACES", "AUTOSCALER_SHARED_TRACES", "AUTOSCALER_CONFIG_FILE"} <= read  # the scan works
    read.discard("AUTOSCALER_CONFIG_FILE")  # a setting, but its value must name a file
    for name in read:
        monkeypatch.setenv(name, "1")
    problems = [line for line in _load_problems() if "unknown setting" in line]
    assert not problems, problems


def _load_problems() -> list[str]:
    try:
        load_settings()
    except SettingsError as exc:
        return str(exc).splitlines()
    return []


# ---- 2. every float setting is finite ------------------------------------------------------------------------------


def float_settings() -> list[tuple[str, str]]:
    """(env var, dotted key) of every float setting, the Prometheus adapter's included."""
    found: list[tuple[str, str]] = []

    def is_float(annotation: object) -> bool:
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            return float in typing.get_args(annotation)
        return annotation is float

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, (*prefix, name))
            elif is_float(annotation):
                found.append((env_name((*prefix, name)), ".".join((*prefix, name))))

    walk(Settings, ())
    return found


FLOATS = float_settings()


def test_the_float_table_covers_the_reported_settings() -> None:
    names = {env for env, _ in FLOATS}
    assert len(names) >= 40
    for reported in (
        "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS",
        "AUTOSCALER_LEADER_ELECTION__LEASE_DURATION_SECONDS",
        "AUTOSCALER_SCHEDULER_EXTENDER__MAX_SNAPSHOT_AGE_SECONDS",
        "AUTOSCALER_TICK_STALL_SECONDS",
        "AUTOSCALER_SHUTDOWN_GRACE_SECONDS",
        "AUTOSCALER_FORECAST__HISTORY_SECONDS",
        "AUTOSCALER_CAPACITY__ASSUMED_SHORTFALL_SECONDS",
        "AUTOSCALER_CAPACITY__SPEND_CAP_PER_HOUR",  # float | None
        "AUTOSCALER_PROMETHEUS_STALENESS_SECONDS",
    ):
        assert reported in names


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "nan", "NaN"])
@pytest.mark.parametrize(("env", "key"), FLOATS, ids=[env for env, _ in FLOATS])
def test_every_float_setting_must_be_finite(monkeypatch: pytest.MonkeyPatch, env: str, key: str, value: str) -> None:
    assert f"{env} ({key}): must be a finite number" in settings_error(monkeypatch, {env: value})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kubernetes: {request_timeout_seconds: .inf}\n", "(kubernetes.request_timeout_seconds): must be a finite"),
        ("forecast: {history_seconds: .nan}\n", "(forecast.history_seconds): must be a finite number"),
        ("prometheus: {rate_window_seconds: .inf}\n", "(prometheus.rate_window_seconds): must be a finite number"),
        (
            "capacity: {burst_pools: {cloud: {price_per_gpu_hour: .inf, max_nodes: 2}}}\n",
            "(capacity.burst_pools.cloud.price_per_gpu_hour): must be a finite number",
        ),
    ],
)
def test_non_finite_numbers_in_the_file(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(expected)):
        load_settings(config)


def test_non_finite_numbers_in_a_json_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    text = settings_error(monkeypatch, {"AUTOSCALER_CAPACITY__BURST_POOLS": '{"p": {"boot_seconds": NaN}}'})
    expected = "AUTOSCALER_CAPACITY__BURST_POOLS__P__BOOT_SECONDS (capacity.burst_pools.p.boot_seconds): "
    expected += "must be a finite number"
    assert expected in text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1e-9", "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be >= 1"),
        ("0.5", "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be >= 1"),
        ("0", "AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be > 0"),
    ],
)
def test_the_tick_interval_has_a_minimum(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    assert expected in settings_error(monkeypatch, {"AUTOSCALER_TICK_INTERVAL_SECONDS": value})


def test_a_one_second_tick_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_TICK_INTERVAL_SECONDS", "1")
    assert load_settings().tick_interval_seconds == 1
    assert "at least 1 s" in (Settings.model_fields["tick_interval_seconds"].description or "")


# ---- 3. the config file ------------------------------------------------------------------------------------------


def alias_bomb(levels: int, key: str) -> str:
    """A "billion laughs": ``levels`` levels of nine aliases each, a few hundred bytes, 9**levels strings."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]")
    return "\n".join(lines) + f"\n{key}: *a{levels - 1}\n"


@pytest.mark.parametrize(
    ("content", "expected", "limit"),
    [
        (bytes(range(256)) * 12, "is not UTF-8 text (byte 0x80 at line 2, column 118)", 300),
        (b"tick_interval_seconds: 30\ndry_run: true\n\xff\n", "is not UTF-8 text (byte 0xff at line 3, column 1)", 300),
        (
            b"tick_interval_seconds: 30\nhttp: {port: 9000}\ntick_interval_seconds: 20\n",
            "is not valid YAML/JSON: found duplicate key 'tick_interval_seconds' (line 3, column 1)",
            300,
        ),
        (b"http:\n  port: 9000\n  port: 9001\n", "found duplicate key 'port' (line 3, column 3)", 300),
        (b'{"dry_run": true, "dry_run": false}', "found duplicate key 'dry_run' (line 1, column 19)", 300),
        (alias_bomb(5, "namespaces").encode(), "AUTOSCALER_NAMESPACES__0 (namespaces.0): Input should be", 5000),
        (alias_bomb(5, "log_level").encode(), "AUTOSCALER_LOG_LEVEL (log_level): Input should be", 5000),
        (alias_bomb(5, "leader_election").encode(), "(leader_election): Input should be a valid dictionary", 5000),
        (b"log_level: " + b"x" * 100_000 + b"\n", "AUTOSCALER_LOG_LEVEL (log_level): Input should be", 1000),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "is not valid YAML/JSON: nested too deeply", 300),
        (b"http: {port: 1" + b"0" * 5000 + b"}\n", "is not valid YAML/JSON: Exceeds the limit", 300),
    ],
    ids=[
        "binary", "binary-line-3", "duplicate", "duplicate-nested", "duplicate-json", "bomb-list", "bomb-str",
        "bomb-group", "long-string", "deep", "huge-int",
    ],
)
def test_a_bad_file_is_a_short_error_naming_it(tmp_path: Path, content: bytes, expected: str, limit: int) -> None:
    config = tmp_path / "settings.yaml"
    config.write_bytes(content)
    with pytest.raises(SettingsError) as info:
        load_settings(config)
    text = str(info.value)
    assert expected in text
    assert str(config) in text
    assert len(text) < limit, text[:2000]


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("http:\n  <<: {port: 9000, bind_address: 127.0.0.1}\n  port: 9001\n")
    settings = load_settings(config)
    assert (settings.http.port, settings.http.bind_address) == (9001, "127.0.0.1")


def test_a_binary_config_file_exits_2_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "random.bin"
    config.write_bytes(bytes(range(256)) * 12)
    result = run_cli("run", "--once", "--config", str(config), env={})
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{config} is not UTF-8 text" in result.stdout + result.stderr


# ---- 4. contradictory settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"AUTOSCALER_REBALANCE__MAX_MOVES_PER_PASS": "50"},
            "AUTOSCALER_REBALANCE__MAX_MOVES_PER_PASS (rebalance.max_moves_per_pass) (50) must be <= "
            "AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR (rebalance.max_moves_per_hour) (8)",
        ),
        (
            {"AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR": "1"},
            "(rebalance.max_moves_per_pass) (2) must be <= AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR",
        ),
        (
            {"AUTOSCALER_REBALANCE__ENABLED": "true", "AUTOSCALER_REBALANCE__MAX_MOVES_PER_PASS": "0"},
            "AUTOSCALER_REBALANCE__ENABLED (rebalance.enabled) with AUTOSCALER_REBALANCE__MAX_MOVES_PER_PASS "
            "(rebalance.max_moves_per_pass) (0) can move no pod",
        ),
        (
            {"AUTOSCALER_REBALANCE__ENABLED": "true", "AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR": "0"},
            "(rebalance.max_moves_per_pass) (2) must be <= AUTOSCALER_REBALANCE__MAX_MOVES_PER_HOUR",
        ),
        (
            {"AUTOSCALER_CAPACITY__BURST_POOLS": '{"p": {"min_nodes": 5, "max_nodes": 1}}'},
            "AUTOSCALER_CAPACITY__BURST_POOLS__P (capacity.burst_pools.p): min_nodes (5) must be <= max_nodes (1)",
        ),
        (
            {"AUTOSCALER_CAPACITY__BURST_POOLS": '{"p": {"min_nodes": 2}}'},
            "(capacity.burst_pools.p): min_nodes (2) must be <= max_nodes (0)",
        ),
        (
            {"AUTOSCALER_CAPACITY__EXPANDERS": ""},
            "AUTOSCALER_CAPACITY__EXPANDERS (capacity.expanders): needs at least one expander",
        ),
        ({"AUTOSCALER_CAPACITY__EXPANDERS": " , "}, "(capacity.expanders): needs at least one expander"),
        ({"AUTOSCALER_CAPACITY__EXPANDERS": "[]"}, "(capacity.expanders): needs at least one expander"),
        (
            {"AUTOSCALER_FORECAST__MODEL": "nonexist.mod:Cls"},
            "AUTOSCALER_FORECAST__MODEL (forecast.model): cannot import module 'nonexist.mod'",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL": "forecast.baselines:Nope"},
            "AUTOSCALER_FORECAST__MODEL (forecast.model): module 'forecast.baselines' has no class 'Nope'",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL": "forecast.registry:BASELINE"},
            "(forecast.model): module 'forecast.registry' has no class 'BASELINE'",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL_PARAMS": '{"nope": 1}'},
            "AUTOSCALER_FORECAST__MODEL_PARAMS (forecast.model_params): PhaseNaive.__init__() got an unexpected "
            "keyword argument 'nope'; it takes period_s, ",
        ),
        (
            {
                "AUTOSCALER_FORECAST__MODEL": "forecast.baselines:LastValue",
                "AUTOSCALER_FORECAST__MODEL_PARAMS": '{"x": 1}',
            },
            "(forecast.model_params): LastValue.__init__() got an unexpected keyword argument 'x'",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL_PARAMS": '{"residual_window": "many"}'},
            "(forecast.model_params): residual_window: Input should be a valid integer",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL_PARAMS": '{"min_share": NaN}'},
            "(forecast.model_params): min_share: Input should be a finite number",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL_PARAMS": '{"quantiles": [0.5]}'},
            "(forecast.model_params): quantiles come from each policy's spec.forecast.quantile",
        ),
        (
            {"AUTOSCALER_FORECAST__MODEL": "auto", "AUTOSCALER_FORECAST__MODEL_PARAMS": '{"residual_window": 1}'},
            "AUTOSCALER_FORECAST__MODEL_PARAMS (forecast.model_params): not used with AUTOSCALER_FORECAST__MODEL",
        ),
        # A mapping given both as JSON and key by key: the JSON replaced the mapping, the other variables were
        # dropped without a word (the controller started without the h100 burst pool).
        (
            {
                "AUTOSCALER_CAPACITY__BURST_POOLS": '{"a100": {"max_nodes": 3}}',
                "AUTOSCALER_CAPACITY__BURST_POOLS__H100__MAX_NODES": "5",
            },
            "AUTOSCALER_CAPACITY__BURST_POOLS (capacity.burst_pools) and "
            "AUTOSCALER_CAPACITY__BURST_POOLS__H100__MAX_NODES: the mapping is given both as JSON and key by key",
        ),
        (
            {
                "AUTOSCALER_FORECAST__MODEL_PARAMS": '{"residual_window": 100}',
                "AUTOSCALER_FORECAST__MODEL_PARAMS__RESIDUAL_WINDOW": "200",
            },
            "AUTOSCALER_FORECAST__MODEL_PARAMS (forecast.model_params) and "
            "AUTOSCALER_FORECAST__MODEL_PARAMS__RESIDUAL_WINDOW: the mapping is given both as JSON and key by key",
        ),
        (
            {"AUTOSCALER_NODE_POOLS__POOLS": '{"a": "md-a"}', "autoscaler_node_pools__pools__b": "md-b"},
            "AUTOSCALER_NODE_POOLS__POOLS (node_pools.pools) and autoscaler_node_pools__pools__b: the mapping",
        ),
        # The extender on the metrics server's port: the second bind failed at start-up, naming no setting.
        (
            {"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true", "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080"},
            "AUTOSCALER_SCHEDULER_EXTENDER__PORT (scheduler_extender.port) and AUTOSCALER_HTTP__PORT (http.port) are "
            "both 8080, with both servers enabled on overlapping addresses ('' and '')",
        ),
        (
            {
                "AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true",
                "AUTOSCALER_HTTP__PORT": "8081",
                "AUTOSCALER_HTTP__BIND_ADDRESS": "127.0.0.1",
            },
            "AUTOSCALER_SCHEDULER_EXTENDER__PORT (scheduler_extender.port) and AUTOSCALER_HTTP__PORT (http.port) are "
            "both 8081",
        ),
        (
            {
                "AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true",
                "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080",
                "AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS": "10.0.0.5",
                "AUTOSCALER_HTTP__BIND_ADDRESS": "10.0.0.5",
            },
            "are both 8080, with both servers enabled on overlapping addresses ('10.0.0.5' and '10.0.0.5')",
        ),
        (
            {
                "AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true",
                "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080",
                "AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS": "",
                "AUTOSCALER_HTTP__BIND_ADDRESS": "10.0.0.5",
            },
            "are both 8080",
        ),
    ],
    ids=lambda v: ",".join(f"{k.removeprefix('AUTOSCALER_')}={x}" for k, x in v.items()) if isinstance(v, dict) else "",
)
def test_contradictory_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    assert expected in settings_error(monkeypatch, env)


def test_consistent_settings_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_REBALANCE__MAX_MOVES_PER_PASS", "8")
    monkeypatch.setenv("AUTOSCALER_CAPACITY__BURST_POOLS", '{"p": {"min_nodes": 1, "max_nodes": 1}}')
    monkeypatch.setenv("AUTOSCALER_CAPACITY__EXPANDERS", "priority")
    monkeypatch.setenv("AUTOSCALER_FORECAST__MODEL", "forecast.baselines:LastValue")
    monkeypatch.setenv("AUTOSCALER_FORECAST__MODEL_PARAMS", '{"residual_window": "2880"}')
    s = load_settings()
    assert s.rebalance.max_moves_per_pass == 8
    assert (s.capacity.burst_pools["p"].min_nodes, s.capacity.expanders) == (1, ["priority"])
    assert s.forecast.model_params == {"residual_window": 2880}  # converted to the type the constructor takes


@pytest.mark.parametrize(
    "env",
    [
        # the group as JSON and its fields key by key merge (the README's rule for groups)
        {"AUTOSCALER_CAPACITY": '{"burst_pools": {"a100": {"max_nodes": 3}}}',
         "AUTOSCALER_CAPACITY__BURST_POOLS__H100__MAX_NODES": "5"},
        # one entry of a mapping as JSON, and a field of that entry
        {"AUTOSCALER_CAPACITY__BURST_POOLS__H100": '{"max_nodes": 3}',
         "AUTOSCALER_CAPACITY__BURST_POOLS__H100__MIN_NODES": "1"},
        # the servers on one port, but one of them disabled, or a port of 0 (any free port), or distinct addresses
        {"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "false", "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080"},
        {"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true", "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080",
         "AUTOSCALER_HTTP__ENABLED": "false"},
        {"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true", "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "0",
         "AUTOSCALER_HTTP__PORT": "0"},
        {"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true", "AUTOSCALER_SCHEDULER_EXTENDER__PORT": "8080",
         "AUTOSCALER_SCHEDULER_EXTENDER__BIND_ADDRESS": "10.0.0.5", "AUTOSCALER_HTTP__BIND_ADDRESS": "127.0.0.1"},
    ],
    ids=lambda env: ",".join(k.removeprefix("AUTOSCALER_") for k in env),
)
def test_settings_that_only_look_alike_still_load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    if "AUTOSCALER_CAPACITY__BURST_POOLS__H100__MAX_NODES" in env:
        assert set(settings.capacity.burst_pools) == {"a100", "h100"}


def test_the_extender_on_the_metrics_port_stops_run_with_exit_2() -> None:
    result = run_cli(
        "run", "--once", env={"AUTOSCALER_SCHEDULER_EXTENDER__ENABLED": "true", "AUTOSCALER_HTTP__PORT": "8081"}
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert "AUTOSCALER_SCHEDULER_EXTENDER__PORT (scheduler_extender.port) and AUTOSCALER_HTTP__PORT" in result.stdout


def test_a_bad_forecaster_stops_run_at_load() -> None:
    result = run_cli("run", "--once", env={"AUTOSCALER_FORECAST__MODEL_PARAMS": '{"nope": 1}'})
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert "AUTOSCALER_FORECAST__MODEL_PARAMS (forecast.model_params)" in result.stdout


DURATIONS = [(env, key) for env, key in FLOATS if key.endswith("_seconds")]


@pytest.mark.parametrize(("env", "key"), DURATIONS, ids=[env for env, _ in DURATIONS])
def test_every_duration_is_at_most_a_year(monkeypatch: pytest.MonkeyPatch, env: str, key: str) -> None:
    """1e300 s is finite, and breaks at run time as inf does (a request deadline past what a datetime holds). Some
    durations have a tighter bound of their own."""
    text = settings_error(monkeypatch, {env: "1e300"})
    bound = re.search(rf"{env} \({re.escape(key)}\): must be (?:at most ([\d,]+) seconds \(a year\)|<= ([\d.]+))", text)
    assert bound is not None, text
    assert float((bound.group(1) or bound.group(2)).replace(",", "")) <= 366 * 86_400
