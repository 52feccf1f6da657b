"""Unit tests without a Prometheus: safe PromQL, pod-to-service mapping, chunking, settings, the fake, the CLI."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from canned import NOW, CannedPrometheus

from autoscaler import cli
from autoscaler.adapters.prometheus import (
    PodMapper,
    PrometheusMetricsSource,
    chunk_range,
    connect,
    deployment_of_pod,
    services_from_gpus,
    validate_service_query,
)
from autoscaler.adapters.prometheus_settings import PrometheusSettings, duration
from autoscaler.adapters.promql import PromQLError, escape_regex, escape_string, matcher, render, selector
from autoscaler.commands.observe import format_table, load_policies, parse_time
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.model import GpuSample, MetricKind, Observation, PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.fakes.metrics import NO_DATA, FakeMetricsSource
from autoscaler.ports import MetricsSource, PortError, Series

HOSTILE = [
    'x"} or vector(1) or up{a="',
    'x\\"} or vector(1)',
    "x\n} or vector(1) #",
    "x'} or vector(1) or up{a='",
    "a.b|c*d+e?f(g)[h]{i}^$\\",
    "\\",
    "`",
    "\x00\x07\x7f",
    "ünïcödé ✓",
]

# ---- a PromQL lexer just good enough to prove structure: strings vs everything else ------------------------------

_GO_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b", "f": "\f"}


def lex(query: str) -> tuple[list[str], list[str]]:
    """(code outside string literals, decoded string literals), decoding Go escapes like PromQL does."""
    code, strings, i = [], [], 0
    buf = []
    while i < len(query):
        ch = query[i]
        if ch in "\"'":
            code.append("".join(buf))
            buf, i, value = [], i + 1, []
            while query[i] != ch:
                if query[i] == "\\":
                    nxt = query[i + 1]
                    if nxt == "x":
                        value.append(chr(int(query[i + 2 : i + 4], 16)))
                        i += 4
                        continue
                    value.append(_GO_ESCAPES[nxt])
                    i += 2
                    continue
                assert query[i] != "\n", "raw newline inside a string literal"
                value.append(query[i])
                i += 1
            strings.append("".join(value))
            i += 1
            continue
        buf.append(ch)
        i += 1
    code.append("".join(buf))
    return code, strings


def unescape_regex(pattern: str) -> str:
    return re.sub(r"\\(.)", r"\1", pattern, flags=re.S)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_values_cannot_change_the_query(value: str) -> None:
    templates = [
        'sum(rate(http_requests_total{namespace="{namespace}", service="{name}"}[2m]))',
        "sum(rate(http_requests_total{namespace='{namespace}', service='{name}'}[2m]))",
        'sum(up{service=~"{name}-.*", namespace!~ "{namespace}"}) # comment with "{quotes}"',
    ]
    for template in templates:
        safe = render(template, {}, {"namespace": "ns", "name": "svc"})
        hostile = render(template, {}, {"namespace": value, "name": value})
        safe_code, safe_strings = lex(safe)
        code, strings = lex(hostile)
        assert code == safe_code, hostile  # same PromQL around the literals: the value stayed a value
        for plain, got in zip(safe_strings, strings, strict=True):
            if plain == "svc-.*":  # a regex literal: metacharacters escaped, so it matches the value literally
                assert unescape_regex(got) == value + "-.*"[: len(got)] or got.endswith("-.*")
                assert unescape_regex(got.removesuffix("-.*")) == value
                assert re.fullmatch(got, value + "-x", flags=re.S)
                assert not re.fullmatch(got, "a" + value + "-x", flags=re.S) or value == ""
            elif plain == "ns" and "!~" in template:
                assert unescape_regex(got) == value and re.fullmatch(got, value, flags=re.S)
            elif plain in ("ns", "svc"):
                assert got == value


def test_escape_string_and_regex() -> None:
    assert escape_string('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape_string("it's", "'") == "it\\'s"
    assert escape_regex("a.b*c") == "a\\.b\\*c"
    assert matcher("pod", "=~", escape_regex("x.y") + "-.*") == 'pod=~"x\\\\.y-.*"'
    with pytest.raises(PromQLError):
        matcher("bad label", "=", "x")
    assert selector([], "") == ""
    assert selector(['a="1"'], ' cluster="x", ') == '{a="1",cluster="x"}'


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("sum(up{job={name}})", "must be inside a quoted string"),
        ("up{job=`{name}`}", None),  # raw strings are fine while the value has no backquote
        ('up{job="{nmae}"}', "unknown placeholder {nmae}"),
        ('up{job="{name}}', "unterminated string literal"),
    ],
)
def test_render_refuses_unsafe_templates(template: str, error: str | None) -> None:
    if error is None:
        assert render(template, {}, {"name": "svc"}) == "up{job=`svc`}"
        with pytest.raises(PromQLError, match="backquote"):
            render(template, {}, {"name": "a`b"})
    else:
        with pytest.raises(PromQLError, match=re.escape(error)):
            render(template, {}, {"name": "svc"})


def test_trusted_placeholders_and_literal_braces() -> None:
    assert render("rate({metric}{selector}[{window}])", {"metric": "m", "selector": '{a="b"}', "window": "2m"}) == (
        'rate(m{a="b"}[2m])'
    )
    # braces of PromQL and regex quantifiers are not placeholders
    assert render('x{pod=~"[a-z]{5}"}', {}) == 'x{pod=~"[a-z]{5}"}'
    validate_service_query('sum(rate(x{namespace="{namespace}",pod=~"{name}-.*"}[{window}]))')
    with pytest.raises(PromQLError):
        validate_service_query("sum(rate(x{namespace={namespace}}[1m]))")


# ---- pods to services -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "deployment"),
    [
        ("chat-7d9f8b6c5-x2x4b", "chat"),
        ("chat-v2-7d9f8b6c5-x2x4b", "chat-v2"),
        ("llm-b-5-2-7d9f8b6c5-x2x4b", "llm-b-5-2"),
        ("chat-0", None),  # StatefulSet
        ("chat-7d9f8b6c5-xaxab", None),  # vowels never appear in the random suffix
        ("chat-7d9f8b6c5", None),
        ("trainer-worker-3", None),
    ],
)
def test_deployment_of_pod(pod: str, deployment: str | None) -> None:
    assert deployment_of_pod(pod) == deployment


def test_pod_mapper_by_name_truncation_and_snapshot() -> None:
    long_name = "a-very-long-inference-deployment-name-for-a-model"  # 49 characters
    services = [ServicePolicy("ml", "chat"), ServicePolicy("ml", "chat-v2"), ServicePolicy("ml", long_name)]
    mapper = PodMapper(services)
    assert mapper.service_of("ml", "chat-v2-7d9f8b6c5-x2x4b") == "ml/chat-v2"
    assert mapper.service_of("other", "chat-7d9f8b6c5-x2x4b") is None
    # generateName keeps 58 characters of "<replicaset>-" and adds 5: the hash is cut, the dash before it stays
    truncated = (f"{long_name}-7d9f8b6c5-")[:58] + "x2x4b"
    assert len(truncated) == 63 and deployment_of_pod(truncated) != long_name
    assert mapper.service_of("ml", truncated) == f"ml/{long_name}"

    rs = "chat-6b4f5d8c7"
    snapshot = ClusterSnapshot(
        time=0,
        deployments=(DeploymentInfo("ml", "chat", 3, 2),),
        pods=(
            PodInfo("ml", "oddly-named-pod", "n", 1, 0, "Running", True, owner_kind="ReplicaSet", owner_name=rs),
            PodInfo("ml", f"{rs}-qz7kd", "n", 1, 0, "Pending", False, owner_kind="ReplicaSet", owner_name=rs),
            PodInfo("ml", f"{rs}-t5h8c", "n", 1, 0, "Succeeded", False, owner_kind="ReplicaSet", owner_name=rs),
        ),
    )
    mapper = PodMapper(services, snapshot)
    assert mapper.service_of("ml", "oddly-named-pod") == "ml/chat"
    assert mapper.replicas["ml/chat"] == (3, 2)
    assert mapper.ready["ml/chat"] == {"oddly-named-pod"} and mapper.unready["ml/chat"] == {f"{rs}-qz7kd"}
    assert not mapper.knows_pods("ml/chat-v2")


def test_services_from_gpus() -> None:
    gpus = [
        GpuSample("n", "0", "u0", "m", namespace="ml", pod="chat-7d9f8b6c5-x2x4b"),
        GpuSample("n", "1", "u1", "m", namespace="ml", pod="chat-7d9f8b6c5-qz7kd"),
        GpuSample("n", "2", "u2", "m", namespace="train", pod="job-worker-0"),
        GpuSample("n", "3", "u3", "m"),
    ]
    assert [s.key for s in services_from_gpus(gpus)] == ["ml/chat"]


# ---- chunking -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "step", "limit"),
    [(0, 100, 1, 11000), (0, 100, 1, 10), (0, 99, 1, 10), (5, 5, 60, 2), (0.5, 86400 * 30, 15, 11000), (0, 1, 7, 3)],
)
def test_chunks_cover_the_range_without_overlap(start: float, end: float, step: float, limit: int) -> None:
    chunks = chunk_range(start, end, step, limit)
    points = [c0 + k * step for c0, c1 in chunks for k in range(round((c1 - c0) / step) + 1)]
    assert points == [start + k * step for k in range(int((end - start) // step) + 1)]
    assert all(round((c1 - c0) / step) + 1 <= limit for c0, c1 in chunks)
    assert len(chunks) == math.ceil(len(points) / limit)


# ---- settings -----------------------------------------------------------------------------------------------------


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = PrometheusSettings()
    assert (defaults.gpu_util_metric, defaults.node_label, defaults.staleness_seconds) == (
        "DCGM_FI_DEV_GPU_UTIL",
        "Hostname",
        120.0,
    )
    for name, info in PrometheusSettings.model_fields.items():
        assert info.description, f"{name} has no description"
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_URL", "https://prom.example:9091/")
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_EXTRA_HEADERS", '{"X-Scope-OrgID": "team-a"}')
    settings = PrometheusSettings()
    assert (settings.url, settings.timeout_seconds, settings.extra_headers) == (
        "https://prom.example:9091",
        2.5,
        {"X-Scope-OrgID": "team-a"},
    )


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"url": "prom:9090"}, "must start with http"),
        ({"gpu_util_metric": "DCGM FI"}, "not a Prometheus metric name"),
        ({"node_label": "kubernetes-node"}, "not a Prometheus label name"),
        ({"gpu_query": "{metric}{selectr}"}, "unknown placeholder {selectr}"),
        ({"client_cert_file": "/c.pem"}, "must be set together"),
        ({"basic_auth_password": "x"}, "basic_auth_username is required"),
        ({"timeout_seconds": 0}, "greater than 0"),
        ({"max_points_per_series": 20000}, "less than or equal to 11000"),
        ({"staleness": 3}, "Extra inputs are not permitted"),
    ],
)
def test_settings_are_validated(changes: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        PrometheusSettings(**changes)  # type: ignore[arg-type]


def test_duration_literals() -> None:
    assert (duration(120), duration(0.25), duration(228.0)) == ("120s", "250ms", "228s")


def test_missing_secret_files_fail_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(PortError, match=r"bearer_token_file: .*nope does not exist"):
        connect(PrometheusSettings(bearer_token_file=tmp_path / "nope"), check=False)
    with pytest.raises(PortError, match="ca_bundle"):
        connect(PrometheusSettings(ca_bundle=tmp_path / "ca.pem"), check=False)


# ---- the fake -----------------------------------------------------------------------------------------------------


def test_fake_metrics_source() -> None:
    fake = FakeMetricsSource()
    source: MetricsSource = fake  # satisfies the port
    chat, idle = ServicePolicy("ml", "chat"), ServicePolicy("ml", "idle")
    fake.set_service("ml/chat", spec_replicas=2, ready_replicas=2, pods=PodMetrics(2, 120.0))
    fake.set_gpu(GpuSample("n1", "0", "GPU-0", "L4", utilization=60.0))
    obs = source.observe([chat, idle], 10.0)
    assert obs.services["ml/chat"].pods == PodMetrics(2, 120.0)
    assert obs.services["ml/idle"].stale_reasons == (NO_DATA,)
    assert len(obs.gpus) == 1 and fake.observe_calls[-1].keys == ("ml/chat", "ml/idle")

    fake.update_service("ml/chat", latency_s=0.2, stale_reasons=["x"])
    assert source.observe([chat], 11.0).services["ml/chat"].stale_reasons == ("x",)
    fake.set_stale("ml/chat", "NaN from DCGM")
    stale = source.observe([chat], 12.0).services["ml/chat"]
    assert (stale.pods, stale.spec_replicas, stale.stale_reasons) == (None, 2, ("NaN from DCGM",))

    fake.set_history("ml/chat", "request_rate", Series((0.0, 60.0, 120.0), (1.0, 2.0, 3.0)))
    assert source.history(chat, "request_rate", 30, 120, 60) == Series((60.0, 120.0), (2.0, 3.0))
    assert source.history(chat, "latency", 0, 120, 60) == Series((), ())

    fake.outage("Prometheus down")
    down = source.observe([chat], 13.0)
    assert down.services["ml/chat"].stale_reasons == ("Prometheus down",) and down.gpus == ()
    with pytest.raises(PortError, match="Prometheus down"):
        source.history(chat, "request_rate", 0, 120, 60)
    fake.restore()
    assert source.observe([chat], 14.0).services["ml/chat"].stale_reasons == ("NaN from DCGM",)
    fake.remove_gpu("n1", "GPU-0")
    assert source.observe([chat], 15.0).gpus == ()


def test_the_adapter_satisfies_the_port() -> None:
    source: MetricsSource = PrometheusMetricsSource(PrometheusSettings())
    assert callable(source.observe) and callable(source.history)


# ---- the CLI ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def test_parse_time() -> None:
    assert parse_time("1700000000") == 1_700_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000
    with pytest.raises(ValueError, match="neither Unix seconds nor ISO 8601"):
        parse_time("yesterday")
    assert parse_time("0") == 0 and parse_time("9999-12-31T23:59:59Z") == 253_402_300_799


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e20", "-1", "0001-01-01T00:00:00+05:00"])
def test_parse_time_refuses_what_is_no_date(value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"--time: {value!r} is not a time from 1970-01-01T00:00:00Z")):
        parse_time(value)


@pytest.mark.parametrize("value", ["nan", "inf", "1e20"])
def test_observe_time_that_is_no_date_exits_2_naming_it(
    canned: CannedPrometheus, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--time nan, inf or 1e20 was accepted (float()) and the table's date crashed with a traceback."""
    from canned import HEALTHY, Answer

    canned.answers = {family: Answer(body) for family, body in HEALTHY.items()}
    assert cli.main(["observe", "--prometheus-url", canned.url, "--time", value]) == 2
    assert f"autoscaler observe: --time: {value!r} is not a time" in capsys.readouterr().err


POLICY_YAML = """\
apiVersion: gpuautoscaler.dev/v1alpha1
kind: GPUScalingPolicy
metadata: {name: chat-policy, namespace: ml}
spec:
  targetRef: {name: chat}
  metric: {type: request_rate, target: 5}
  queries:
    requestRate: 'sum(rate(http_requests_total{namespace="{namespace}", service="{name}"}[2m]))'
---
kind: List
items:
  - apiVersion: gpuautoscaler.dev/v1alpha1
    kind: GPUScalingPolicy
    metadata: {name: embed}
    spec: {targetRef: {name: embed}}
  - {kind: ConfigMap, metadata: {name: ignored}}
"""


def test_load_policies(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY_YAML)
    policies, queries = load_policies([path])
    assert [(p.key, p.metric) for p in policies] == [
        ("ml/chat", MetricKind.REQUEST_RATE),
        ("default/embed", MetricKind.GPU_UTILIZATION),
    ]
    assert queries["ml/chat"].request_rate.startswith("sum(rate(")
    path.write_text(POLICY_YAML.replace('"{namespace}"', "{namespace}"))
    with pytest.raises(ValueError, match=re.escape("chat-policy: spec.queries: placeholder {namespace} must be")):
        load_policies([path])
    path.write_text(
        "kind: GPUScalingPolicy\nmetadata: {name: x}\nspec: {targetRef: {name: x}, minReplicas: 5, maxReplicas: 2}\n"
    )
    with pytest.raises(ValueError, match=r"GPUScalingPolicy x: .*minReplicas"):
        load_policies([path])
    with pytest.raises(ValueError, match="no GPUScalingPolicy objects"):
        path.write_text("kind: ConfigMap\n")
        load_policies([path])


MALFORMED_POLICY_FILES = {
    "metadata-not-a-mapping": (
        "kind: GPUScalingPolicy\nmetadata: foo\nspec: {targetRef: {name: chat}}\n",
        "GPUScalingPolicy #1: metadata must be a mapping, got str",
    ),
    "name-not-a-string": (
        "kind: GPUScalingPolicy\nmetadata: {name: [a]}\nspec: {targetRef: {name: chat}}\n",
        "GPUScalingPolicy #1: metadata.name must be a string, got list",
    ),
    "spec-not-a-mapping": (
        "kind: GPUScalingPolicy\nmetadata: {name: a}\nspec: [1]\n",
        "GPUScalingPolicy a: spec must be a mapping, got list",
    ),
    "list-items-not-a-list": ("kind: List\nitems: 5\n", "document 1 (kind: List): items must be a list, got int"),
    "nested-too-deeply": (
        "kind: GPUScalingPolicy\nspec: " + "[" * 5000 + "]" * 5000 + "\n",
        "not valid YAML: nested too deeply",
    ),
    # settings files and scenarios refuse a key given twice; here maxReplicas 3 was silently replaced by 5
    "duplicate-key": (
        "kind: GPUScalingPolicy\nmetadata: {name: a, namespace: ml}\n"
        "spec: {targetRef: {name: chat}, maxReplicas: 3, maxReplicas: 5}\n",
        "not valid YAML: found duplicate key 'maxReplicas' (line 3, column 49)",
    ),
    "integer-too-long": (
        "kind: GPUScalingPolicy\nspec: {targetRef: {name: chat}, maxReplicas: " + "9" * 5000 + "}\n",
        "not valid YAML: Exceeds the limit (4300 digits)",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_POLICY_FILES))
def test_a_malformed_policy_file_exits_2_naming_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """load_policies assumed metadata a mapping and items a list, and loaded with yaml.safe_load_all (tracebacks,
    a RecursionError, duplicate keys last-wins), unlike every other YAML input (autoscaler/yaml_input.py)."""
    text, problem = MALFORMED_POLICY_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        load_policies([path])
    assert str(caught.value).startswith(f"--policy {path}: ") and problem in str(caught.value), caught.value
    # before Prometheus is reached (port 1 refuses connections)
    assert cli.main(["observe", "--prometheus-url", "http://127.0.0.1:1", "--policy", str(path)]) == 2
    assert f"autoscaler observe: --policy {path}: " in capsys.readouterr().err


def test_observe_command_json_and_table(canned: CannedPrometheus, capsys: pytest.CaptureFixture[str]) -> None:
    from canned import HEALTHY, Answer

    canned.answers = {family: Answer(body) for family, body in HEALTHY.items()}
    code = cli.main(["observe", "--prometheus-url", canned.url, "--time", str(NOW), "--output", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["services_discovered"] is True and out["version"] == "canned"
    assert [(s["key"], s["value"], s["stale"]) for s in out["services"]] == [("ml/chat", 50.0, False)]
    assert len(out["gpus"]) == 2

    canned.answers["util"] = Answer(HEALTHY["util"] | {"data": {"resultType": "vector", "result": []}})
    code = cli.main(["observe", "--prometheus-url", canned.url, "--time", str(NOW), "--fail-on-stale"])
    text = capsys.readouterr().out
    assert code == 1  # stale, and asked to fail on it; discovery still found the pods through the memory series
    assert "ml/chat" in text and "STALE: DCGM_FI_DEV_GPU_UTIL: 2 of 2 ready pods" in text
    assert "2 GPU(s) on 1 node(s) (NVIDIA H100 80GB HBM3), 2 stale" in text


def test_observe_command_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    from promserver import free_port

    code = cli.main(["observe", "--prometheus-url", f"http://127.0.0.1:{free_port()}", "--timeout", "1"])
    assert code == 2
    assert "cannot reach Prometheus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ("AUTOSCALER_PROMETHEUS_TIMEOUT", "(prometheus.timeout): unknown setting (typo?); did you mean "
                                          "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS?"),
        ("AUTOSCALER_PROMETHEUS__URL", "the Prometheus settings use a single underscore"),
    ],
)  # fmt: skip
def test_observe_command_refuses_a_misspelt_prometheus_variable(
    canned: CannedPrometheus, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: str,
    expected: str,
) -> None:
    """As ``autoscaler run`` does: a typo would otherwise run the command with the default (10 s timeout here)."""
    monkeypatch.setenv(env, "3")
    code = cli.main(["observe", "--prometheus-url", canned.url, "--time", str(NOW)])
    assert code == 2
    err = capsys.readouterr().err
    assert "invalid Prometheus settings" in err and expected in err


def test_format_table_shows_reasons() -> None:
    policy = ServicePolicy("ml", "chat", metric=MetricKind.QUEUE_DEPTH, target=4)
    obs = Observation(
        time=NOW,
        services={"ml/chat": ServiceObservation("ml/chat", 3, 3, metric_total=None, stale_reasons=("queue: NaN",))},
        gpus=(GpuSample("n", "0", "u", "L4", utilization=12.5, fb_used_mib=1234.0, fb_free_mib=20000.0),),
    )
    header = {"prometheus": "http://p", "version": None, "time": NOW, "queries": 7, "seconds": 0.01}
    text = format_table(obs, [policy], header)
    assert "ml/chat  queue_depth" in text and "STALE: queue: NaN" in text
    assert "n     0    L4     12.5    -       1234         20000        -    ok" in text
