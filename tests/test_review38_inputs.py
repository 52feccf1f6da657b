"""Review 38: input validation of the controller settings, scenario files, GPUScalingPolicy specs and the CLI.

Each defect was a strict xfail whose docstring says what was WRONG and what is RIGHT; all are fixed in the same stop
(the tests now pass). The other tests pin right behaviour that was checked during the review and that no other test
covers.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from autoscaler import cli
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.settings import SettingsError, load_settings
from autoscaler.sim.scenario import ScenarioError, default_scenario_path, load_scenario, parse_scenario
from autoscaler.yaml_input import load_yaml


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AUTOSCALER_") or key in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(key)


def _settings_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def _policy(spec: dict[str, Any]) -> LoadedPolicy | InvalidPolicy:
    body = {"targetRef": {"name": "chat"}, **spec}
    meta = {"name": "p", "namespace": "ns", "uid": "u", "generation": 1}
    return validate_policy({"apiVersion": "gpuautoscaler.dev/v1alpha1", "kind": "GPUScalingPolicy",
                            "metadata": meta, "spec": body})


def _default_scenario() -> dict[str, Any]:
    data = load_yaml(default_scenario_path().read_text())
    assert isinstance(data, dict)
    return data


def _short_scenario(tmp_path: Path, replace: tuple[str, str] | None = None) -> Path:
    """The packaged default scenario cut to two hours at 60 s steps (about a second per policy)."""
    text = default_scenario_path().read_text().replace("stepSeconds: 15", "stepSeconds: 60\ndurationSeconds: 7200", 1)
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    path = tmp_path / "short.yaml"
    path.write_text(text)
    return path


# ---- settings: booleans read as numbers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("tick_interval_seconds: true\n", "tick_interval_seconds"),
        ("http: {port: true}\n", "http.port"),
        ("prometheus: {retries: true}\n", "prometheus.retries"),
        ("forecast: {workers: true}\n", "forecast.workers"),
        ("capacity: {burst_pools: {a100: {max_nodes: true}}}\n", "capacity.burst_pools.a100.max_nodes"),
    ],
)
def test_settings_refuse_a_boolean_given_as_a_number(tmp_path: Path, text: str, setting: str) -> None:
    """WRONG: pydantic's lax mode reads `true` as 1 in a settings file (or in a group's JSON in the environment,
    ``AUTOSCALER_HTTP='{"port": true}'`` serves on port 1): the controller starts with a tick of 1 s, port 1 or
    one retry, and nothing says so. The scenario and the policy spec refuse exactly this ("not a boolean").
    RIGHT: refused, naming the setting: ``... (<setting>): Input should be a number, not a boolean``."""
    with pytest.raises(SettingsError) as error:
        load_settings(_settings_file(tmp_path, text))
    assert setting in str(error.value)


def test_settings_refuse_a_boolean_port_in_group_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRONG: ``AUTOSCALER_HTTP='{"port": true}'`` loads with http.port 1.
    RIGHT: refused naming AUTOSCALER_HTTP__PORT (http.port)."""
    monkeypatch.setenv("AUTOSCALER_HTTP", '{"port": true}')
    with pytest.raises(SettingsError, match=r"http\.port"):
        load_settings()


# ---- settings: bounds that are accepted but silently wrong ---------------------------------------------------------


def test_backoff_max_below_the_first_backoff_is_refused(tmp_path: Path) -> None:
    """WRONG: provision_backoff_seconds 600 with provision_backoff_max_seconds 10 loads; arbitrate.py computes
    ``min(max, backoff * 2**n)``, so every back-off is 10 s and the 600 s given is silently ignored (a min > max).
    RIGHT: refused, naming both settings (max must be >= the first back-off)."""
    path = _settings_file(tmp_path, "capacity: {provision_backoff_seconds: 600, provision_backoff_max_seconds: 10}\n")
    with pytest.raises(SettingsError, match="provision_backoff_max_seconds"):
        load_settings(path)


def test_backoff_max_equal_to_the_first_backoff_loads(tmp_path: Path) -> None:
    """The boundary of the rule above: a back-off that never grows is a legitimate choice."""
    path = _settings_file(tmp_path, "capacity: {provision_backoff_seconds: 300, provision_backoff_max_seconds: 300}\n")
    settings = load_settings(path)
    assert settings.capacity.provision_backoff_max_seconds == settings.capacity.provision_backoff_seconds == 300


def test_forecast_step_below_a_second_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRONG: AUTOSCALER_FORECAST__STEP_SECONDS=0.001 loads; the refit job then reads history_seconds / step
    points per service (604,800,000 floats and 55,000 range queries a refit with the default week): out of memory or
    a refit that never ends. The scenario's forecasting.resolutionSeconds is at least 1 s.
    RIGHT: refused naming forecast.step_seconds (at least 1 s, and history_seconds / step_seconds bounded)."""
    monkeypatch.setenv("AUTOSCALER_FORECAST__STEP_SECONDS", "0.001")
    with pytest.raises(SettingsError, match=r"forecast\.step_seconds"):
        load_settings()


def test_stale_after_less_than_one_refit_period_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRONG: AUTOSCALER_FORECAST__STALE_AFTER_PERIODS=0.5 loads; core/tick.py marks a fit stale once it is older
    than 0.5 refit intervals, and the next fit comes only after a whole one: every service falls back to reactive
    (forecast_stale) for half of every interval, whatever the forecast.
    RIGHT: refused naming forecast.stale_after_periods (at least 1, a fit must last until the next refit)."""
    monkeypatch.setenv("AUTOSCALER_FORECAST__STALE_AFTER_PERIODS", "0.5")
    with pytest.raises(SettingsError, match=r"forecast\.stale_after_periods"):
        load_settings()


def test_lease_retry_period_below_a_second_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRONG: AUTOSCALER_LEADER_ELECTION__RETRY_PERIOD_SECONDS=0.001 loads (the ordering checks pass); the Lease
    thread (kubernetes_lease.py) then tries to acquire or renew 1,000 times a second on every replica, a busy loop
    against the API server -- the reason the tick and the jobs have a 1 s floor.
    RIGHT: refused naming leader_election.retry_period_seconds (at least 1 s)."""
    monkeypatch.setenv("AUTOSCALER_LEADER_ELECTION__RETRY_PERIOD_SECONDS", "0.001")
    with pytest.raises(SettingsError, match=r"leader_election\.retry_period_seconds"):
        load_settings()


@pytest.mark.parametrize(("variable", "value"), [("DCGM_MATCHERS", "cluster="), ("APP_MATCHERS", "}")])
def test_malformed_extra_matchers_are_refused(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    """WRONG: AUTOSCALER_PROMETHEUS_DCGM_MATCHERS='cluster=' loads; it is pasted into every query
    (``DCGM_FI_DEV_GPU_UTIL{cluster=}``), which Prometheus refuses at every tick: every service held on stale data
    for good, the cause a 400 in the log rather than the setting. The templates are checked at load, the matchers not.
    RIGHT: refused at load naming AUTOSCALER_PROMETHEUS_<variable> (parse ``x{<matchers>}`` with promql_parser)."""
    monkeypatch.setenv(f"AUTOSCALER_PROMETHEUS_{variable}", value)
    with pytest.raises(SettingsError, match=f"AUTOSCALER_PROMETHEUS_{variable}"):
        load_settings()


def test_well_formed_extra_matchers_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_DCGM_MATCHERS", 'cluster="prod",job=~"dcgm.*"')
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_APP_MATCHERS", 'cluster="prod",')
    settings = load_settings()
    assert settings.prometheus.dcgm_matchers == 'cluster="prod",job=~"dcgm.*"'


@pytest.mark.parametrize(
    ("text", "named"),
    [
        # YAML 1.1 reads no/on/off/yes as booleans: where a string is meant it is refused, naming the setting
        ("leader_election: {identity: no}\n", "AUTOSCALER_LEADER_ELECTION__IDENTITY (leader_election.identity)"),
        ("namespaces: [no]\n", "AUTOSCALER_NAMESPACES__0 (namespaces.0)"),
        ("kubernetes: {context: off}\n", "AUTOSCALER_KUBERNETES__CONTEXT (kubernetes.context)"),
        ("log_format: on\n", "AUTOSCALER_LOG_FORMAT (log_format)"),
        # a number where a boolean is meant is not read as one
        ("dry_run: 2\n", "AUTOSCALER_DRY_RUN (dry_run)"),
        # NaN and durations over a year, nested in a mapping of groups
        ("capacity: {burst_pools: {a: {max_nodes: 1, price_per_gpu_hour: .nan}}}\n",
         "capacity.burst_pools.a.price_per_gpu_hour): must be a finite number"),
        ("capacity: {burst_pools: {a: {max_nodes: 1, boot_seconds: 1e9}}}\n", "capacity.burst_pools.a.boot_seconds"),
        ("tick_interval_seconds: 1e300\n", "must be at most 31,622,400 seconds"),
    ],
)
def test_settings_file_mistakes_name_the_setting(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(_settings_file(tmp_path, text))
    assert named in str(error.value)


# ---- the GPUScalingPolicy spec: field names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"min_replicas": 3}, "spec.min_replicas"),
        ({"behavior": {"scale_down": {"stabilization_window_seconds": 0}}}, "spec.behavior.scale_down"),
        ({"cold_start_seconds": 10}, "spec.cold_start_seconds"),
    ],
)
def test_policy_refuses_python_field_names(spec: dict[str, Any], field: str) -> None:
    """WRONG: ``spec.min_replicas: 3`` loads as minReplicas 3 (``populate_by_name=True`` in policy._Strict), in a
    scenario file and ``observe --policy`` alike, while ``kubectl apply`` refuses it (strict field validation:
    unknown field "spec.min_replicas") or prunes it (then minReplicas is 1): the simulated policy is one the cluster
    never runs, and tests/kube/test_crd_parity.py lists no such difference.
    RIGHT: InvalidSpec naming the field, as for any other unknown field (validate by alias only)."""
    result = _policy(spec)
    assert isinstance(result, InvalidPolicy)
    assert result.field.startswith(field)


def test_scenario_refuses_python_field_names() -> None:
    """WRONG: a scenario with ``step_seconds: 60`` (and ``node_pools``, ``duration_seconds``...) loads as if
    camelCase: README documents stepSeconds, and a typo-like spelling of a key should be named, not taken.
    Worse, a service's ``spec.min_replicas`` runs in the simulator but not in a cluster (see the policy test above).
    RIGHT: ``step_seconds: Extra inputs are not permitted`` (or "did you mean stepSeconds")."""
    data = _default_scenario()
    data["step_seconds"] = data.pop("stepSeconds")
    with pytest.raises(ScenarioError, match="step_seconds"):
        parse_scenario(data, "x.yaml")


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"behavior": {"scaleUp": {"policies": [5]}}}, "spec.behavior.scaleUp.policies[0]: Input should be a valid"),
        ({"queries": {"latency": 5}}, "spec.queries.latency: Input should be a valid string (got 5)"),
        ({"latency": {"sloSeconds": True}}, "spec.latency.sloSeconds: Input should be a valid number (got True)"),
        ({"forecast": {"mode": False}}, "spec.forecast.mode: Input should be 'off', 'shadow' or 'active' (got False)"),
        ({"minReplicas": 5, "maxReplicas": 2}, "spec: minReplicas (5) must be <= maxReplicas (2)"),
        ({"metric": {"type": "engine_active"}}, "spec.metric: target: engine_active is a ratio, must be <= 1"),
        ({"priority": 2**31}, "spec.priority: Input should be less than or equal to 2147483647"),
        ({"behavior": {"scaleDown": {"stabilizationWindowSeconds": 60.5}}},
         "spec.behavior.scaleDown.stabilizationWindowSeconds: Input should be a valid integer"),
        ({"targetRef": {"name": "My_App"}}, "spec.targetRef.name: String should match pattern"),
    ],
)
def test_invalid_spec_names_the_field_and_the_value(spec: dict[str, Any], text: str) -> None:
    """What the InvalidSpec condition and its Event say: the field path (camelCase, [index]) and the value."""
    result = _policy(spec)
    assert isinstance(result, InvalidPolicy)
    assert text in result.text


# ---- the scenario: YAML booleans ------------------------------------------------------------------------------------


def test_forecast_mode_off_unquoted_explains_the_yaml_boolean(tmp_path: Path) -> None:
    """WRONG: ``forecast: {mode: off}`` -- as the runbook GPUAutoscalerForecastFallback.md writes it -- fails with
    ``services.0.spec.forecast.mode: Input should be 'off', 'shadow' or 'active'``: the user wrote off and is told
    to write off. YAML 1.1 (and kubectl) read unquoted off as false.
    RIGHT: the message says the value was read as the boolean false and to quote it (mode: "off")."""
    path = _short_scenario(tmp_path, ("forecast: {mode: active, quantile: 0.99}", "forecast: {mode: off}"))
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    message = str(error.value).split("invalid scenario", 1)[1]  # not the file's path (it holds the test's name)
    assert "services.0.spec.forecast.mode" in message
    assert "false" in message.lower() or "quote" in message.lower()


def test_forecast_mode_off_quoted_loads(tmp_path: Path) -> None:
    path = _short_scenario(tmp_path, ("forecast: {mode: active, quantile: 0.99}", 'forecast: {mode: "off"}'))
    scenario, _ = load_scenario(path)
    assert scenario.services[0].spec.forecast.mode == "off"


@pytest.mark.parametrize(
    ("path", "value", "text"),
    [
        (("durationSeconds",), True, "durationSeconds: Input should be a number, not a boolean"),
        (("services", 0, "spec", "forecast"), {"mode": "active", "ratePerReplica": True},
         "services.0.spec.forecast.ratePerReplica: Input should be a number, not a boolean"),
        (("services", 0, "metadata", "labels"), {"a": "b"}, "services.0.metadata.labels: Extra inputs"),
        (("services", 0, "status"), {}, "services.0.status: Extra inputs are not permitted"),
        # a boolean where a string is meant: read so by YAML (yes/no/on/off), the message says to quote it
        (("nodePools", 0, "gpuType"), True, "nodePools.0.gpuType: read as the boolean true"),
        (("forecasting", "horizonSeconds"), 1e9, "more than the maximum of 10,000"),
    ],
)
def test_scenario_mistakes_name_the_field(path: tuple[str | int, ...], value: Any, text: str) -> None:
    data = copy.deepcopy(_default_scenario())
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data, "x.yaml")
    assert text in str(error.value)


# ---- the CLI ---------------------------------------------------------------------------------------------------------


class _Ran(Exception):
    pass


def test_simulate_refuses_a_bad_plot_path_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """WRONG: ``autoscaler simulate --plot report.txt`` runs the whole simulation (hours for a big scenario), writes
    the JSON and only then fails ("cannot write report.txt": matplotlib knows no such format), though simulate.py
    settles the output paths "before the (long) run, so a bad name costs nothing".
    RIGHT: exit 2 naming --plot before anything is simulated."""
    import autoscaler.sim.run as sim_run

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _Ran

    monkeypatch.setattr(sim_run, "run_scenario", refuse)
    scenario = _short_scenario(tmp_path)
    try:
        code = cli.main(["simulate", "--no-progress", "--policies", "reactive", "--json", str(tmp_path / "r.json"),
                         "--plot", str(tmp_path / "report.txt"), str(scenario)])
    except _Ran:
        code = None
    assert code == 2
    assert "--plot" in capsys.readouterr().err


def test_simulate_writes_the_plot_where_it_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """WRONG: ``--plot out/report`` (no suffix; or a directory: ``--plot /tmp`` wrote /tmp.png) exits 0 printing
    ``plot: out/report`` while matplotlib wrote out/report.png: the file named does not exist.
    RIGHT: the plot is written at the path printed, or the path is refused (exit 2) before the run."""
    scenario = _short_scenario(tmp_path)
    target = tmp_path / "report"
    code = cli.main(["simulate", "--no-progress", "--policies", "reactive", "--json", str(tmp_path / "r.json"),
                     "--plot", str(target), str(scenario)])
    out = capsys.readouterr().out
    assert code == 2 or (f"plot:        {target}" in out and target.is_file())


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--time", "nan"],
        ["plan", "--time", "1e400"],
        ["plan", "--time", "-5"],
        ["simulate", "--forecast-workers", "-1"],
        ["run", "--port", "abc"],
    ],
)
def test_bad_flag_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert f"argument {argv[1]}" in capsys.readouterr().err


@pytest.mark.parametrize(("make", "text"), [("missing", "No such file or directory"), ("dir", "it is a directory")])
def test_simulate_bad_scenario_path_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str, text: str
) -> None:
    path = tmp_path / "nothing.yaml" if make == "missing" else tmp_path
    assert cli.main(["simulate", "--no-progress", "--no-plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and text in err


# ---- yaml_input: YAML 1.1 forms kubectl does not read the same way ---------------------------------------------------


def test_sexagesimal_number_is_not_read_as_kubectl_would_refuse_it() -> None:
    """WRONG: ``coldStartSeconds: 1:30`` loads as 90 (YAML 1.1 base 60) in a scenario or ``--policy`` file, while
    kubectl (sigs.k8s.io/yaml on go-yaml, which has no base-60 numbers) sends the string "1:30" and the apiserver
    refuses it: the disagreement yaml_input.py's own resolvers were added to remove (``1e3``, ``0o17``).
    RIGHT: read as the string "1:30" (drop the base-60 int/float resolvers), so the policy is InvalidSpec on
    spec.coldStartSeconds here as it is at ``kubectl apply``."""
    assert load_yaml("x: 1:30\n") == {"x": "1:30"}
    spec = load_yaml("targetRef: {name: chat}\ncoldStartSeconds: 1:30\n")
    result = _policy(spec)
    assert isinstance(result, InvalidPolicy) and result.field == "spec.coldStartSeconds"


def test_merge_key_given_twice_is_a_duplicate_key() -> None:
    """WRONG: ``c: {<<: *a, <<: *b}`` loads with the first merge winning (b's values dropped without a word);
    UniqueKeyLoader skips every ``<<`` key in its duplicate check.
    RIGHT: refused as a duplicate key ``<<`` with its line (one merge of several is ``<<: [*a, *b]``)."""
    from autoscaler.yaml_input import YamlProblem

    with pytest.raises(YamlProblem, match="duplicate key"):
        load_yaml("a: &a {x: 1}\nb: &b {x: 2}\nc: {<<: *a, <<: *b}\n")


@pytest.mark.parametrize(
    ("text", "loaded"),
    [
        ("a: &a {x: 1, y: 1}\nc: {<<: *a, x: 2}\n", {"a": {"x": 1, "y": 1}, "c": {"x": 2, "y": 1}}),
        ("a: &a {x: 1}\nb: &b {x: 2, z: 3}\nc: {<<: [*a, *b]}\n", {"a": {"x": 1}, "b": {"x": 2, "z": 3},
                                                                   "c": {"x": 1, "z": 3}}),
        ("x: 1e3\ny: 1e-6\nz: 0o17\n", {"x": 1000.0, "y": 1e-6, "z": 15}),
    ],
)
def test_yaml_forms_read_as_kubectl_reads_them(text: str, loaded: dict[str, Any]) -> None:
    assert load_yaml(text) == loaded
