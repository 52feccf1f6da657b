"""Review 40: validation of user input -- the controller settings, the GPUScalingPolicy spec and simulator scenarios.

Defects found (each was a strict xfail below, with WRONG / RIGHT in its docstring; all seven fixed in this stop, their
tests say "Fixed"):

1. WRONG: a settings file with a key that is not a string at its top level (``1: 2``, or ``yes:``/``off:``, which
   YAML 1.1 reads as booleans) stops ``autoscaler run`` with a Python traceback (``TypeError: keywords must be
   strings``, exit 1). RIGHT: a SettingsError naming the key, and saying that an unquoted yes/no/on/off is a boolean.
2. WRONG: ``prometheus: []`` (or ``false``, ``0``, ``''``) in a settings file loads with every Prometheus setting at
   its default; the "must be a mapping" check skips any value that is falsy, while ``http: []`` is refused.
   RIGHT: refused naming ``prometheus``.
3. WRONG: ``capacity.burst_pools`` names no node label can carry (``A100 pool``, ``""``) and ``node_pools.pools``
   MachineDeployment names no object can have (``MD A``, ``""``) load; the pool then matches no node and every
   resize is refused by the API server, tick after tick, naming no setting. RIGHT: refused at load, naming the
   setting (a label value; a DNS-1123 subdomain).
4. WRONG: with capacity on and ``node_pools.provider: clusterapi``, a burst pool missing from a non-empty
   ``node_pools.pools`` mapping (or, without a mapping, a burst pool name that is no MachineDeployment name, e.g.
   upper-case) loads; every tick then warns "node pool 'x' is not configured" (or a 404) and the pool never grows.
   RIGHT: refused at load naming both settings.
5. WRONG: a scenario takes quoted numbers in its own fields (``stepSeconds: "15"``, ``nodes: "3"``,
   ``traceScale: "0.1"``, ``modelParams: {residual_window: "40"}``) while the same quotes in a service's spec are
   refused ("Input should be a valid integer"), as kubectl refuses them. RIGHT: refused naming the field: a number,
   not a string.
6. WRONG: a scenario service's ``metadata.namespace`` / ``metadata.name`` (and ``training.namespace``) take any
   string (``Bad NS``, ``a/b``), though services are "written exactly as the GPUScalingPolicy custom resources":
   ``kubectl apply`` of the same object is refused, and a ``/`` in the namespace breaks the service key
   ``namespace/name``. RIGHT: a DNS-1123 label (namespace) and subdomain (name), as the API server checks.
7. WRONG: ``maxReplicas: 1e20`` (a YAML float, as kubectl reads it) is refused with "Unable to parse input string
   as an integer, exceeded maximum size": there is no string, and the bound is not said. RIGHT: "Input should be
   less than or equal to 2147483647".

Pinned right behaviour (passing): a settings file's top-level keys are read case-sensitively and a typo is named;
policy fields refuse quoted numbers, NaN and booleans by their full camelCase path; a YAML merge key and anchors load
in a scenario as kubectl reads them; valid Kubernetes names in every field above still load.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.settings import SettingsError, load_settings
from autoscaler.sim.scenario import ScenarioError, default_scenario_path, parse_scenario
from autoscaler.yaml_input import load_yaml


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AUTOSCALER_") or key in ("POD_NAME", "POD_NAMESPACE"):
            monkeypatch.delenv(key)


def _settings(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return load_settings(path)


def _settings_problem(tmp_path: Path, text: str) -> str:
    with pytest.raises(SettingsError) as error:
        _settings(tmp_path, text)
    return str(error.value)


def _policy(spec: dict[str, Any]) -> LoadedPolicy | InvalidPolicy:
    body = {"targetRef": {"name": "chat"}, **spec}
    meta = {"name": "p", "namespace": "ns", "uid": "u", "generation": 1}
    return validate_policy(
        {"apiVersion": "gpuautoscaler.dev/v1alpha1", "kind": "GPUScalingPolicy", "metadata": meta, "spec": body}
    )


def _scenario(*changes: tuple[tuple[str | int, ...], Any]) -> dict[str, Any]:
    data = load_yaml(default_scenario_path().read_text())
    assert isinstance(data, dict)
    data = copy.deepcopy(data)
    for path, value in changes:
        node: Any = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return data


def _scenario_problem(*changes: tuple[tuple[str | int, ...], Any]) -> str:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(_scenario(*changes), "x.yaml")
    return str(error.value).removeprefix("x.yaml: invalid scenario\n")


# ---- 1. settings: a top-level key that is not a string -------------------------------------------------------------


@pytest.mark.parametrize(("text", "named"), [("1: 2\n", "1"), ("yes: 1\n", "true"), ("off: {}\n", "false")])
def test_settings_file_key_that_is_not_a_string_is_named(tmp_path: Path, text: str, named: str) -> None:
    """Fixed (was a strict xfail). WRONG: ``TypeError: keywords must be strings`` out of pydantic-settings (a
    traceback, exit 1).
    RIGHT: SettingsError naming the key; a YAML boolean key is said to be one (quote it)."""
    problem = _settings_problem(tmp_path, text)
    assert f"{named}: not a setting name" in problem
    if named in ("true", "false"):
        assert "boolean" in problem


# ---- 2. settings: a prometheus group that is not a mapping ----------------------------------------------------------


@pytest.mark.parametrize("value", ["[]", "false", "0", "''"])
def test_prometheus_group_that_is_not_a_mapping_is_refused(tmp_path: Path, value: str) -> None:
    """Fixed (was a strict xfail). WRONG: ``prometheus: []`` loads, every Prometheus setting at its default (``http:
    []`` is refused).
    RIGHT: refused naming prometheus: a mapping."""
    problem = _settings_problem(tmp_path, f"prometheus: {value}\n")
    assert "prometheus" in problem and "mapping" in problem


def test_prometheus_group_left_empty_loads(tmp_path: Path) -> None:
    """``prometheus:`` with every key commented out is an empty group, not a mistake."""
    settings = _settings(tmp_path, "prometheus:\n  # url: http://prometheus:9090\n")
    assert settings.prometheus.url


# ---- 3./4. settings: names of burst pools and MachineDeployments ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("capacity: {burst_pools: {'A100 pool': {max_nodes: 1}}}\n", "capacity.burst_pools"),
        ("capacity: {burst_pools: {'': {max_nodes: 1}}}\n", "capacity.burst_pools"),
        ("capacity: {burst_pools: {" + "a" * 64 + ": {max_nodes: 1}}}\n", "capacity.burst_pools"),
        ("node_pools: {pools: {a100: 'MD A'}}\n", "node_pools.pools.a100"),
        ("node_pools: {pools: {a100: ''}}\n", "node_pools.pools.a100"),
        ("node_pools: {pools: {'a 100': md-a}}\n", "node_pools.pools"),
    ],
)
def test_pool_names_no_kubernetes_object_can_have_are_refused(tmp_path: Path, text: str, named: str) -> None:
    """Fixed (was a strict xfail). WRONG: loads; the burst pool matches no node (its name is read from a node label)
    and the MachineDeployment is refused by the API server at every resize, naming no setting.
    RIGHT: refused at load naming the setting (a label value, at most 63 characters; a DNS-1123 subdomain)."""
    assert named in _settings_problem(tmp_path, text)


@pytest.mark.parametrize(
    "text",
    [
        "node_pools: {provider: clusterapi, pools: {a100: md-a100}}\n"
        "capacity: {enabled: true, burst_pools: {a100: {max_nodes: 2}, h100: {max_nodes: 2}}}\n",
        "node_pools: {provider: clusterapi}\ncapacity: {enabled: true, burst_pools: {H100: {max_nodes: 2}}}\n",
    ],
)
def test_burst_pool_the_provider_cannot_resize_is_refused(tmp_path: Path, text: str) -> None:
    """Fixed (was a strict xfail). WRONG: loads; every tick logs "node pool 'h100' is not configured" (or a 404 for
    MachineDeployment H100) and the pool never grows, while the arbitration keeps choosing it.
    RIGHT: refused at load naming capacity.burst_pools and node_pools.pools."""
    problem = _settings_problem(tmp_path, text)
    assert "capacity.burst_pools" in problem and "node_pools.pools" in problem


@pytest.mark.parametrize(
    "text",
    [
        "node_pools: {provider: clusterapi, pools: {a100: md-a100, H100: md.h100}}\n"
        "capacity: {enabled: true, burst_pools: {a100: {max_nodes: 2}, H100: {max_nodes: 2}}}\n",
        "node_pools: {provider: clusterapi}\ncapacity: {enabled: true, burst_pools: {a100.spot: {max_nodes: 2}}}\n",
        # capacity off, or no provider: the pools are never resized, nothing to check
        "node_pools: {provider: clusterapi, pools: {a100: md-a100}}\ncapacity: {burst_pools: {B_1: {max_nodes: 1}}}\n",
        "capacity: {enabled: true, burst_pools: {A100_Spot: {max_nodes: 2}}}\n",
    ],
)
def test_pool_names_kubernetes_accepts_load(tmp_path: Path, text: str) -> None:
    _settings(tmp_path, text)


# ---- 5. scenario: quoted numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("stepSeconds",), "15", "stepSeconds"),
        (("nodePools", 0, "nodes"), "3", "nodePools.0.nodes"),
        (("services", 0, "simulation", "traceScale"), "0.1", "services.0.simulation.traceScale"),
        (("forecasting", "modelParams"), {"residual_window": "40"}, "modelParams.residual_window"),
        (("durationSeconds",), "nan", "durationSeconds"),
    ],
)
def test_scenario_refuses_quoted_numbers(path: tuple[str | int, ...], value: Any, named: str) -> None:
    """Fixed (was a strict xfail). WRONG: loads as the number (pydantic's lax mode), while ``maxReplicas: "40"`` in
    the spec of the same file is refused.
    RIGHT: refused naming the field (a number, not a string: remove the quotes)."""
    problem = _scenario_problem((path, value))
    assert named in problem and "not a string" in problem


def test_spec_quoted_number_in_a_scenario_is_refused() -> None:
    """The rule defect 5 extends: a spec's integer refuses a quoted number (the CRD's ``integer`` type does), in a
    scenario with the same words as the scenario's own fields."""
    problem = _scenario_problem((("services", 0, "spec", "maxReplicas"), "40"))
    assert "services.0.spec.maxReplicas: Input should be a number, not a string (remove the quotes)" in problem


# ---- 6. scenario: Kubernetes names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", 0, "metadata", "namespace"), "Bad NS"),
        (("services", 0, "metadata", "namespace"), "a/b"),
        (("services", 0, "metadata", "namespace"), "a" * 64),
        (("services", 0, "metadata", "name"), "Chat_Policy"),
        (("services", 0, "metadata", "name"), "a/b"),
    ],
)
def test_scenario_metadata_names_are_kubernetes_names(path: tuple[str | int, ...], value: str) -> None:
    """Fixed (was a strict xfail). WRONG: loads; ``kubectl apply`` of the same GPUScalingPolicy is refused, and
    ``a/b`` as the namespace makes the service key ``a/b/chat``.
    RIGHT: refused naming the field (DNS-1123 label / subdomain)."""
    assert ".".join(str(p) for p in path) in _scenario_problem((path, value))


def test_scenario_training_namespace_is_a_kubernetes_name() -> None:
    """Fixed (was a strict xfail). WRONG: ``training.namespace: Training Jobs`` loads, a namespace the jobs could
    never be created in.
    RIGHT: refused naming training.namespace, as a service's namespace is."""
    training = {"namespace": "Training Jobs", "jobs": [{"name": "a", "workSeconds": 60, "pods": 1, "gpusPerPod": 1}]}
    assert "training.namespace" in _scenario_problem((("training",), training))


def test_scenario_metadata_with_valid_names_loads() -> None:
    scenario = parse_scenario(
        _scenario(
            (("services", 0, "metadata"), {"name": "chat.v2-policy", "namespace": "team-a1"}),
        )
    )
    assert scenario.services[0].metadata.namespace == "team-a1"


# ---- 7. policy: an integral float beyond any integer ---------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("maxReplicas", 1e20), ("priority", -1e30), ("minReplicas", 1e19)])
def test_huge_integral_float_says_the_bound(field: str, value: float) -> None:
    """Fixed (was a strict xfail). WRONG: ``Unable to parse input string as an integer, exceeded maximum size (got
    1e+20)``.
    RIGHT: ``Input should be less than or equal to 2147483647`` (or greater than or equal to -2147483648)."""
    result = _policy({field: value})
    assert isinstance(result, InvalidPolicy) and result.field == f"spec.{field}"
    assert "string" not in result.message and "2147483647" in result.message.replace("2147483648", "2147483647")


def test_integral_float_within_range_loads() -> None:
    """YAML's ``maxReplicas: 5.0`` reaches the API server as 5 (``_json_integer``); 1e3 likewise."""
    result = _policy({"maxReplicas": 1e3, "minReplicas": 2.0})
    assert isinstance(result, LoadedPolicy)
    assert (result.service.min_replicas, result.service.max_replicas) == (2, 1000)


# ---- pinned right behaviour ----------------------------------------------------------------------------------------


def test_settings_file_key_in_upper_case_is_an_unknown_setting(tmp_path: Path) -> None:
    """The file's keys are the lower-case names (only the environment is case-insensitive): named, not ignored."""
    assert "(TICK_INTERVAL_SECONDS): unknown setting" in _settings_problem(tmp_path, "TICK_INTERVAL_SECONDS: 5\n")


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"forecast": {"quantile": "0.9"}}, "spec.forecast.quantile: Input should be a valid number (got '0.9')"),
        ({"forecast": {"quantile": float("nan")}}, "spec.forecast.quantile: Input should be a finite number"),
        ({"latency": {"sloSeconds": 2, "quantile": 1.0}}, "spec.latency.quantile: Input should be less than 1"),
        (
            {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": True}]}}},
            "spec.behavior.scaleUp.policies[0].periodSeconds: Input should be a valid integer (got True)",
        ),
        ({"behavior": {"scaleUp": {"tolerance": float("inf")}}}, "spec.behavior.scaleUp.tolerance: Input should be"),
        ({"gpusPerReplica": [1]}, "spec.gpusPerReplica: Input should be a valid integer"),
        ({"metric": {"type": "request_rate", "target": 5, "targte": 6}}, "spec.metric.targte: Extra inputs"),
    ],
)
def test_policy_mistakes_name_the_full_path(spec: dict[str, Any], text: str) -> None:
    result = _policy(spec)
    assert isinstance(result, InvalidPolicy)
    assert text in result.text


def test_scenario_node_pool_merged_from_an_anchor_loads() -> None:
    """A second burst pool written as ``{<<: *burst, name: ...}``: loaded as kubectl reads it, the keys beside the
    merge winning."""
    text = default_scenario_path().read_text()
    assert "  - name: cloud-burst\n" in text and "\nforecasting:" in text
    text = text.replace("  - name: cloud-burst\n", "  - &burst\n    name: cloud-burst\n", 1)
    text = text.replace("\nforecasting:", "\n  - {<<: *burst, name: cloud-burst-2, maxNodes: 2}\nforecasting:", 1)
    scenario = parse_scenario(load_yaml(text))
    second = scenario.node_pools[2]
    assert (second.name, second.max_nodes, second.price_per_gpu_hour) == ("cloud-burst-2", 2, 4.10)
