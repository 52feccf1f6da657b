"""A policy's spec.queries override that the tick would refuse is refused when the policy is loaded.

The controller hands the overrides to the adapter (``set_service_queries``) when policies change; a ValueError
there makes the policy ``InvalidSpec`` (status condition and a Warning Event naming ``spec.queries.<field>``). An
override the tick would refuse -- an unconfined selector (``confine_overrides_to_namespace``), a placeholder the
override rendering does not supply -- passed that check, and its service then went stale at every tick instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from canned import NOW, Answer, CannedPrometheus, series, vector

from autoscaler.adapters.prometheus import PrometheusMetricsSource, validate_service_query
from autoscaler.adapters.prometheus_settings import SERVICE_PLACEHOLDERS, TEMPLATE_PLACEHOLDERS, PrometheusSettings
from autoscaler.adapters.promql import PromQLError
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.policy import QueriesSpec

CHAT = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=1.0, min_replicas=1)
CONFINED = 'sum(rate(vllm:request_success_total{namespace="{namespace}",service="{name}"}[1m]))'
OTHER_TENANT = 'sum(rate(vllm:request_success_total{namespace="team-b"}[1m]))'
FAMILY_ONLY = ("metric", "selector", "namespace_label", "pod_label")  # filled only in a family's default query


def loader(**settings: Any) -> PrometheusMetricsSource:
    return PrometheusMetricsSource(PrometheusSettings(url="http://127.0.0.1:9", retries=0, **settings))


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    server.answers = {"override": Answer(vector(series({"autoscaler_service": "ml/chat"}, "3")))}
    yield server
    server.stop()


# ---- confinement, at load ------------------------------------------------------------------------------------------

REFUSED = {
    "another namespace": (OTHER_TENANT, 'selector vllm:request_success_total{namespace="team-b"} does not select'),
    "no namespace": ("sum(rate(x[1m]))", 'selector x does not select namespace="ml"'),
    "one side of a binary operation": ('x{namespace="{namespace}"} / y', "selector y does not select"),
    "info": ('info(x{namespace="{namespace}"})', "info() may not be used in an override"),
    "not PromQL": ('sum(x{namespace="{namespace}"}) +', "not valid PromQL: "),
    "too complex": ("-" * 1001 + 'x{namespace="{namespace}"}', "too complex to check: "),
}


@pytest.mark.parametrize(("query", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_an_override_the_tick_would_refuse_is_refused_when_the_policy_is_loaded(query: str, message: str) -> None:
    source = loader()
    with pytest.raises(ValueError) as caught:
        source.set_service_queries({CHAT.key: QueriesSpec(requestRate=query)})
    # the controller reads "<namespace>/<name>: " off the front; the rest is the InvalidSpec message
    assert str(caught.value).startswith(f"ml/chat: spec.queries.requestRate: {message}"), caught.value


@pytest.mark.parametrize(("field", "camel"), [("queue_depth", "queueDepth"), ("latency", "latency")])
def test_the_refusal_names_the_field(field: str, camel: str) -> None:
    with pytest.raises(ValueError, match=rf"^ml/chat: spec\.queries\.{camel}: selector x does not select"):
        # by its camelCase key, as the spec is written (the models validate by alias only)
        loader().set_service_queries({CHAT.key: QueriesSpec.model_validate({camel: "sum(x)"})})


def test_the_namespace_is_the_policy_own() -> None:
    pinned = 'sum(x{namespace="ml"})'
    loader().set_service_queries({"ml/chat": QueriesSpec(requestRate=pinned)})
    with pytest.raises(ValueError, match=r'^ml2/chat: spec\.queries\.requestRate: selector x\{namespace="ml"\}'):
        loader().set_service_queries({"ml2/chat": QueriesSpec(requestRate=pinned)})
    # {namespace} is each policy's own
    loader().set_service_queries({"ml/chat": QueriesSpec(requestRate=CONFINED), "ml2/a": QueriesSpec(latency=CONFINED)})


def test_the_label_is_the_application_namespace_label() -> None:
    exported = 'sum(x{exported_namespace="{namespace}"})'
    loader(app_namespace_label="exported_namespace").set_service_queries({CHAT.key: QueriesSpec(requestRate=exported)})
    with pytest.raises(ValueError, match='does not select exported_namespace="ml"'):
        loader(app_namespace_label="exported_namespace").set_service_queries(
            {CHAT.key: QueriesSpec(requestRate=CONFINED)}
        )


def test_turned_off_an_unconfined_override_is_loaded() -> None:
    source = loader(confine_overrides_to_namespace=False)
    source.set_service_queries({CHAT.key: QueriesSpec(requestRate=OTHER_TENANT)})
    assert source.history_query(CHAT, "request_rate") == OTHER_TENANT


def test_one_refused_override_leaves_the_loaded_ones_in_place() -> None:
    """set_service_queries replaces all or nothing: the controller drops the refused policy and calls it again."""
    source = loader()
    source.set_service_queries({CHAT.key: QueriesSpec(requestRate=CONFINED)})
    with pytest.raises(ValueError):
        source.set_service_queries({CHAT.key: QueriesSpec(requestRate=OTHER_TENANT)})
    assert 'namespace="ml",service="chat"' in source.history_query(CHAT, "request_rate")


# ---- load and tick agree ---------------------------------------------------------------------------------------------


def tick_refusals(canned: CannedPrometheus, overrides: dict[str, str], **settings: Any) -> dict[str, list[str]]:
    """Per service key: the reasons with which one tick refused its request-rate override (none: it was sent)."""
    source = PrometheusMetricsSource(
        PrometheusSettings(url=canned.url, retries=0, timeout_seconds=5, **settings),
        service_queries={key: QueriesSpec(requestRate=q) for key, q in overrides.items()},  # not validated
    )
    services = [
        ServicePolicy(key.split("/")[0], key.split("/")[1], metric=MetricKind.REQUEST_RATE, target=1.0, min_replicas=1)
        for key in overrides
    ]
    obs = source.observe(services, NOW)
    sent = " ".join(q for _, q in canned.queries)
    out: dict[str, list[str]] = {}
    for service in services:
        if f'"{service.key}"' in sent:  # its tag: the override was sent, whatever Prometheus answered
            out[service.key] = []
            continue
        prefix = "spec.queries.requestRate: "
        out[service.key] = [r for r in obs.services[service.key].stale_reasons if r.startswith(prefix)]
        assert out[service.key], obs.services[service.key]
    return out


def load_refusals(overrides: dict[str, str], **settings: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, query in overrides.items():
        try:
            loader(**settings).set_service_queries({key: QueriesSpec(requestRate=query)})
            out[key] = []
        except ValueError as exc:
            out[key] = [str(exc).removeprefix(f"{key}: ")]
    return out


@pytest.mark.parametrize("confine", [True, False])
def test_load_refuses_what_the_tick_refuses_and_nothing_else(canned: CannedPrometheus, confine: bool) -> None:
    overrides = {f"ns{i}/svc": q for i, (q, _) in enumerate(REFUSED.values())}
    overrides["ok/confined"] = CONFINED
    overrides["ok/quantile"] = 'histogram_quantile({quantile}, sum by (le) (x{namespace="{namespace}"}))'
    at_tick = tick_refusals(canned, overrides, confine_overrides_to_namespace=confine)
    assert load_refusals(overrides, confine_overrides_to_namespace=confine) == at_tick
    assert not at_tick["ok/confined"] and not at_tick["ok/quantile"]
    assert bool(at_tick["ns0/svc"]) == confine


# ---- placeholders: load accepts exactly what the override rendering supplies -----------------------------------------


def using(name: str) -> str:
    """A confined override using ``{name}`` inside a string literal (any value keeps it valid PromQL)."""
    return f'count(x{{namespace="{{namespace}}", a="{{{name}}}"}})'


@pytest.mark.parametrize("name", FAMILY_ONLY)
def test_a_placeholder_the_override_rendering_does_not_supply_is_refused_at_load(name: str) -> None:
    with pytest.raises(PromQLError, match=rf"unknown placeholder \{{{name}\}}"):
        validate_service_query(using(name))
    with pytest.raises(ValueError, match=rf"^ml/chat: spec\.queries\.requestRate: unknown placeholder \{{{name}\}}"):
        loader().set_service_queries({CHAT.key: QueriesSpec(requestRate=using(name))})


def test_load_accepts_exactly_the_placeholders_the_tick_renders(canned: CannedPrometheus) -> None:
    names = [*TEMPLATE_PLACEHOLDERS, *SERVICE_PLACEHOLDERS, "made_up"]
    overrides = {f"ns-{i}/svc": using(name) for i, name in enumerate(names)}
    at_tick = tick_refusals(canned, overrides)
    rendered_at_tick = {n for n, key in zip(names, overrides, strict=True) if not at_tick[key]}
    accepted_at_load: set[str] = set()
    for name in names:
        try:
            validate_service_query(using(name))
            accepted_at_load.add(name)
        except PromQLError as exc:
            assert f"unknown placeholder {{{name}}}" in str(exc)
    assert accepted_at_load == rendered_at_tick
    assert not set(FAMILY_ONLY) & accepted_at_load and {"window", "namespace", "name"} <= accepted_at_load
    # the forecaster's history renders an override as the tick does
    for name in names:
        spec = QueriesSpec(requestRate=using(name))
        source = PrometheusMetricsSource(PrometheusSettings(url=canned.url), service_queries={CHAT.key: spec})
        try:
            source.history_query(CHAT, "request_rate")
            assert name in accepted_at_load, name
        except PromQLError:
            assert name not in accepted_at_load, name
