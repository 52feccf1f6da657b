"""A tenant's PromQL override (GPUScalingPolicy spec.queries) may read only its own namespace's series.

The controller runs overrides with its own Prometheus credentials, and their values reach the policy's status, its
Events and the controller's metrics: an override reading ``namespace="team-b"`` from a policy in ``team-a`` (or no
namespace at all) let one tenant read another's metrics, and be scaled by another's traffic. As prom-label-proxy
does for dashboards, every vector selector of an override must carry ``<app_namespace_label>="<its namespace>"``;
an override that does not is never sent, and its service holds on stale data with the reason.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, series, vector
from pydantic import ValidationError

from autoscaler import cli
from autoscaler.adapters import promql
from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.adapters.promql import PromQLError, render
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import ControllerState, MetricKind, Observation, ServicePolicy
from autoscaler.policy import KIND, QueriesSpec

ROOT = Path(__file__).resolve().parents[2]
LABEL, NS = "namespace", "ml"
HINT = 'an override may read only its own namespace (add namespace="{namespace}" to every selector)'


def refused(shown: str, label: str = LABEL, namespace: str = NS) -> str:
    return f'selector {shown} does not select {label}="{namespace}": {HINT.replace("namespace=", label + "=")}'


ACCEPTED = {
    "plain": 'sum(rate(vllm:request_success_total{namespace="ml", service="chat"}[1m]))',
    "no selector": "vector(3)",
    "a number": "3",
    "time": "time() - 1",
    "offset": 'x{namespace="ml"} offset 5m',
    "at": 'x{namespace="ml"} @ 123',
    "at start": 'rate(x{namespace="ml"}[5m] @ start())',
    "subquery": 'max_over_time(q{namespace="ml"}[5m:1m])',
    "matrix with offset": 'rate(x{namespace="ml"}[5m] offset 1m)',
    "on group_left": 'a{namespace="ml"} * on() group_left b{namespace="ml"}',
    "label_replace": 'label_replace(x{namespace="ml"}, "a", "$1", "b", "(.*)")',
    "absent": 'absent(x{namespace="ml"})',
    "name matcher": '{__name__=~"vllm:.*", namespace="ml"}',
    "every series of the namespace": '{namespace="ml"}',
    "other matchers on the label are ANDed": 'x{namespace!="kube-system", namespace="ml", namespace=~".*"}',
    "raw string": "x{namespace=`ml`}",
    "single quotes": "x{namespace='ml'}",
    "escape decoded as Prometheus does": 'x{namespace="m\\x6c"}',
    "each or alternative": 'x{namespace="ml", a="1" or b="2", namespace="ml"}',
    "aggregation parameter": 'topk(scalar(y{namespace="ml"}), x{namespace="ml"})',
    "quantile": 'histogram_quantile(0.95, sum by (le) (rate(x_bucket{namespace="ml",service="chat"}[2m])))',
    "strings do not count toward the size": 'x{namespace="ml", pod=~"' + "a|" * 3000 + 'b"}',
}

REFUSED = {
    "another namespace": (
        'sum(rate(vllm:request_success_total{namespace="team-b"}[1m]))',
        refused('vllm:request_success_total{namespace="team-b"}'),
    ),
    "no namespace": (
        'sum(rate(vllm:request_success_total{service="chat"}[1m]))',
        refused('vllm:request_success_total{service="chat"}'),
    ),
    "bare metric": ("x", refused("x")),
    "one side of a binary operation": ('a{namespace="ml"} / on() group_left b', refused("b")),
    "or of two namespaces": ('x{namespace="ml"} or y{namespace="team-b"}', refused('y{namespace="team-b"}')),
    "regex": ('x{namespace=~"ml"}', refused('x{namespace=~"ml"}')),
    "regex widening": ('x{namespace=~"ml|team-b"}', refused('x{namespace=~"ml|team-b"}')),
    "not equal": ('x{namespace!="team-b"}', refused('x{namespace!="team-b"}')),
    "subquery": ("max_over_time(q[5m:1m])", refused("q")),
    "offset": ("x offset 5m", refused("x")),
    "matrix": ("rate(x[5m])", refused("x")),
    "absent": ("absent(x)", refused("x")),
    "label_replace": ('label_replace(x, "a", "$1", "b", "(.*)")', refused("x")),
    "aggregation parameter": ('topk(scalar(y), x{namespace="ml"})', refused("y")),
    "one or alternative": ('x{namespace="ml", a="1" or b="2"}', refused('x{namespace="ml",a="1" or b="2"}')),
    "another label": ('x{exported_namespace="ml"}', refused('x{exported_namespace="ml"}')),
    "label names are case-sensitive": ('x{Namespace="ml"}', refused('x{Namespace="ml"}')),
    "values are case-sensitive": ('x{namespace="ML"}', refused('x{namespace="ML"}')),
    "info reads series no selector names": (
        'info(x{namespace="ml"})',
        "info() may not be used in an override: it reads series (target_info) that no selector of the query names",
    ),
    "not PromQL": ('sum(rate(x{namespace="ml"}[1m])', "not valid PromQL: "),
    "unknown escape": ('x{namespace="m\\l"}', "not valid PromQL: "),
    "too complex": ("-" * 1001 + 'x{namespace="ml"}', "too complex to check: 1016 characters besides string"),
}


@pytest.mark.parametrize("query", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_confined_queries_are_accepted(query: str) -> None:
    promql.check_confined(query, LABEL, NS)


@pytest.mark.parametrize(("query", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_unconfined_queries_are_refused_with_a_message_a_tenant_can_act_on(query: str, message: str) -> None:
    with pytest.raises(PromQLError) as caught:
        promql.check_confined(query, LABEL, NS)
    assert str(caught.value).startswith(message), caught.value


def test_the_label_is_the_one_given() -> None:
    promql.check_confined('x{exported_namespace="ml"}', "exported_namespace", NS)
    with pytest.raises(PromQLError, match=re.escape(refused('x{namespace="ml"}', "exported_namespace"))):
        promql.check_confined('x{namespace="ml"}', "exported_namespace", NS)


def test_the_checker_sees_every_selector_walk_sees() -> None:
    """The check visits the tree itself (promql_parser.walk takes time cubic in the depth: 7 s at 400); on every
    query above it must find exactly the selectors walk finds, so that no kind of node is skipped."""
    for query in [*ACCEPTED.values(), *(q for q, message in REFUSED.values() if message.startswith("selector"))]:
        expr = promql_parser.parse(query)
        walked: list[str] = []

        def visit(node: Any, found: list[str] = walked) -> None:
            if isinstance(node, promql_parser.VectorSelector):
                found.append(promql._shown(node))

        promql_parser.walk(expr, visit)
        assert sorted(walked) == sorted(promql._shown(s) for s in promql._selectors(expr)), query


def test_a_deeply_nested_query_is_refused_before_the_parser_sees_it() -> None:
    """promql-parser recurses on the native stack: 15,000 unary minus signs (15 kB, well within a Kubernetes
    object) killed the process with SIGSEGV, i.e. one tenant's policy crash-looped every controller replica.
    Run in a child process, so that a regression fails this test rather than the test run."""
    code = (
        "from autoscaler.adapters.promql import check_confined, PromQLError\n"
        "try:\n"
        "    check_confined('-' * 15000 + 'x{namespace=\"ml\"}', 'namespace', 'ml')\n"
        "except PromQLError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "too complex to check" in done.stdout, (done.returncode, done.stderr[-500:])


def test_a_parser_panic_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Rust panic reaches Python as pyo3's PanicException, a BaseException that ``except Exception`` lets
    through: a tenant's text must not stop the tick with it."""

    class PanicException(BaseException):  # the name pyo3 gives it; not importable
        pass

    def panic(_: str) -> None:
        raise PanicException("index out of bounds")

    monkeypatch.setattr(promql.promql_parser, "parse", panic)
    promql._confinement_problem.cache_clear()
    try:
        with pytest.raises(PromQLError, match="not valid PromQL: the parser failed"):
            promql.check_confined('x{namespace="ml"}', LABEL, "panics")
    finally:
        promql._confinement_problem.cache_clear()


# ---- the adapter: a refused override is never sent --------------------------------------------------------------


OTHER_TENANT = 'sum(rate(vllm:request_success_total{namespace="team-b"}[1m]))'
CONFINED = 'sum(rate(vllm:request_success_total{namespace="{namespace}",service="{name}"}[1m]))'
CHAT = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=1.0, min_replicas=1)
EMBED = ServicePolicy("ml2", "embed", metric=MetricKind.REQUEST_RATE, target=1.0, min_replicas=1)


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def observe(canned: CannedPrometheus, queries: dict[str, QueriesSpec], **settings: Any) -> Observation:
    answers = copy.deepcopy(HEALTHY)
    answers["override"] = vector(
        series({"autoscaler_service": "ml/chat"}, "30"), series({"autoscaler_service": "ml2/embed"}, "4")
    )
    canned.answers = {k: Answer(v) for k, v in answers.items()}
    source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5, **settings), service_queries=queries
    )
    cluster = ClusterSnapshot(
        time=NOW,
        deployments=(DeploymentInfo("ml", "chat", 2, 2),),
        pods=tuple(
            PodInfo("ml", p, "node-a", 1, 0, "Running", True, owner_kind="ReplicaSet", owner_name=P0.rsplit("-", 1)[0])
            for p in (P0, P1)
        ),
    )
    return source.observe([CHAT, EMBED], NOW, cluster=cluster)


def test_an_override_reading_another_namespace_is_never_sent(canned: CannedPrometheus) -> None:
    obs = observe(
        canned, {CHAT.key: QueriesSpec(requestRate=OTHER_TENANT), EMBED.key: QueriesSpec(requestRate=CONFINED)}
    )
    sent = [q for _, q in canned.queries]
    assert not any("team-b" in q for q in sent), sent
    chat = obs.services[CHAT.key]
    assert chat.metric_total is None, chat
    assert chat.stale_reasons == (
        "spec.queries.requestRate: " + refused('vllm:request_success_total{namespace="team-b"}'),
    ), chat
    # held, never scaled down on it
    state = ControllerState()
    for t in (NOW - 400, NOW):
        plan, state = decide(obs, state, {CHAT.key: CHAT}, t)
    assert plan.decisions[0].desired_replicas == 2
    # the neighbour's confined override ran in the same tick
    embed = obs.services[EMBED.key]
    assert embed.metric_total == pytest.approx(4.0) and embed.stale_reasons == (), embed
    assert any('namespace="ml2",service="embed"' in q for q in sent), sent


def test_turned_off_the_override_is_sent_as_written(canned: CannedPrometheus) -> None:
    obs = observe(canned, {CHAT.key: QueriesSpec(requestRate=OTHER_TENANT)}, confine_overrides_to_namespace=False)
    assert any("team-b" in q for _, q in canned.queries), canned.queries
    chat = obs.services[CHAT.key]
    assert chat.metric_total == pytest.approx(30.0) and chat.stale_reasons == (), chat


def test_the_override_uses_the_application_namespace_label(canned: CannedPrometheus) -> None:
    queries = {CHAT.key: QueriesSpec(requestRate='sum(rate(x{exported_namespace="{namespace}"}[1m]))')}
    assert observe(canned, queries, app_namespace_label="exported_namespace").services[CHAT.key].metric_total == 30
    assert observe(canned, queries).services[CHAT.key].metric_total is None


def test_a_history_override_is_confined_too(canned: CannedPrometheus) -> None:
    """The forecaster's history of the request rate is the override's (history_query): the same check."""
    source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5),
        service_queries={CHAT.key: QueriesSpec(requestRate=OTHER_TENANT)},
    )
    with pytest.raises(PromQLError, match=re.escape("spec.queries.requestRate: selector vllm:request_success")):
        source.history(CHAT, "request_rate", NOW - 600, NOW, 60)
    assert canned.queries == []
    source.set_service_queries({CHAT.key: QueriesSpec(requestRate=CONFINED)})
    assert 'namespace="ml",service="chat"' in source.history_query(CHAT, "request_rate")
    open_source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, confine_overrides_to_namespace=False),
        service_queries={CHAT.key: QueriesSpec(requestRate=OTHER_TENANT)},
    )
    assert open_source.history_query(CHAT, "request_rate") == OTHER_TENANT


def test_observe_with_a_policy_file_refuses_it_too(
    canned: CannedPrometheus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canned.answers = {family: Answer(body) for family, body in HEALTHY.items()}
    path = tmp_path / "policy.yaml"
    path.write_text(
        "kind: GPUScalingPolicy\nmetadata: {name: chat, namespace: ml}\n"
        "spec: {targetRef: {name: chat}, metric: {type: request_rate, target: 1}, queries: {requestRate: 'x'}}\n"
    )
    code = cli.main(["observe", "--prometheus-url", canned.url, "--time", str(NOW), "--policy", str(path),
                     "--output", "json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and not any(q == "x" or "(x)" in q for _, q in canned.queries), canned.queries
    (chat,) = out["services"]
    assert chat["stale"] and any("selector x does not select" in r for r in chat["stale_reasons"]), chat


# ---- the setting ----------------------------------------------------------------------------------------------------


def test_the_setting_defaults_on_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PrometheusSettings().confine_overrides_to_namespace is True
    assert "app_namespace_label" in (
        PrometheusSettings.model_fields["confine_overrides_to_namespace"].description or ""
    )
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_CONFINE_OVERRIDES_TO_NAMESPACE", "false")
    assert PrometheusSettings().confine_overrides_to_namespace is False
    monkeypatch.setenv("AUTOSCALER_PROMETHEUS_CONFINE_OVERRIDES_TO_NAMESPACE", "maybe")
    with pytest.raises(ValidationError, match="confine_overrides_to_namespace"):
        PrometheusSettings()


# ---- the documented examples stay valid ----------------------------------------------------------------------------


def _example_overrides() -> list[tuple[str, str, str]]:
    """(where, namespace, override) of every GPUScalingPolicy in deploy/examples and in the README's YAML blocks."""
    documents: list[tuple[str, Any]] = []
    for path in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        documents += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text())]
    for number, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)):
        if f"kind: {KIND}" in block:
            documents += [(f"README.md block {number + 1}", doc) for doc in yaml.safe_load_all(block)]
    found = []
    for where, doc in documents:
        items = doc.get("items", [doc]) if isinstance(doc, dict) else []
        for item in items:
            if not isinstance(item, dict) or item.get("kind") != KIND:
                continue
            namespace = (item.get("metadata") or {}).get("namespace") or "default"
            for field, query in ((item.get("spec") or {}).get("queries") or {}).items():
                found.append((f"{where}: spec.queries.{field}", namespace, query))
    return found


def test_every_documented_override_is_confined() -> None:
    overrides = _example_overrides()
    assert len(overrides) >= 2, overrides  # chat-inference.yaml and llm-request-rate.yaml at least
    settings = PrometheusSettings()
    for where, namespace, query in overrides:
        rendered = render(query, settings.template_values(), {"namespace": namespace, "name": "svc"})
        try:
            promql.check_confined(rendered, settings.app_namespace_label, namespace)
        except PromQLError as exc:
            pytest.fail(f"{where}: {exc}")
