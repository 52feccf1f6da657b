"""Deployments whose names are long enough for the API server to cut their pods' names.

A Deployment's pods are created with ``generateName: <replicaset>-`` where the ReplicaSet is
``<deployment>-<pod-template-hash>``. The API server's name generator (k8s.io/apiserver/pkg/storage/names,
SimpleNameGenerator: maxNameLength 63, randomLength 5, maxGeneratedNameLength 58) cuts that base to 58 characters
before it appends 5 random characters. From a name of 47 characters on (with the usual 10-character hash) the pod
names are exactly 63 characters long, the hash is cut short and no dash precedes the random suffix; from 58 on the
Deployment name itself is cut. The adapter must still find such a service's pods by name: in its history queries
(forecasting) and in the latency it guards the SLO with, which the default batched latency query (the Deployment
derived from the pod name by ``label_replace``) cannot give for cut names.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from canned import HEALTHY, NOW, Answer, CannedPrometheus, series, vector
from genai_dataset import histogram_quantile
from promserver import OpenMetricsWriter, PrometheusServer, backfill

from autoscaler.adapters.prometheus import PodMapper, PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.policy import QueriesSpec

# k8s.io/apimachinery/pkg/util/rand: the alphabet of random suffixes and of the encoded pod-template-hash
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
MAX_NAME_LENGTH = 63
RANDOM_LENGTH = 5
MAX_GENERATED_NAME_LENGTH = MAX_NAME_LENGTH - RANDOM_LENGTH  # 58


def generate_name(base: str, random: str) -> str:
    """SimpleNameGenerator.GenerateName: the base cut to 58 characters, then 5 random ones."""
    assert len(random) == RANDOM_LENGTH and set(random) <= set(ALPHABET)
    if len(base) > MAX_GENERATED_NAME_LENGTH:
        base = base[:MAX_GENERATED_NAME_LENGTH]
    return base + random


def pod_name(deployment: str, template_hash: str, random: str) -> str:
    """A Deployment's pod: ``generateName`` of its ReplicaSet ``<deployment>-<hash>`` plus a dash."""
    assert set(template_hash) <= set(ALPHABET) and 1 <= len(template_hash) <= 10
    return generate_name(f"{deployment}-{template_hash}-", random)


NS = "ml"
HASH = "5d8f7c9b64"  # 10 characters: the usual length (the decimal uint32 hash has 10 digits 3 times in 4)
SHORT_HASH = "7b9d5c"  # 6 characters: rare, but then a 50-character name's pods are not cut
NAME50 = "llama-3-70b-instruct-awq-serving-production-europe"
NAME60 = "mixtral-8x22b-instruct-v01-serving-production-eu-west4-green"
SHORT = "chat"
assert (len(NAME50), len(NAME60)) == (50, 60)


def test_the_helper_builds_names_as_the_api_server_does() -> None:
    assert pod_name(SHORT, "7d9f8b6c5", "x2x4b") == "chat-7d9f8b6c5-x2x4b"
    cut50 = pod_name(NAME50, HASH, "x2x4b")
    assert cut50 == f"{NAME50}-5d8f7c9x2x4b" and len(cut50) == 63  # hash cut to 7, no dash before the suffix
    assert pod_name(NAME50, SHORT_HASH, "x2x4b") == f"{NAME50}-7b9d5c-x2x4b"  # fits: 63 characters, not cut
    cut60 = pod_name(NAME60, HASH, "x2x4b")
    assert cut60 == NAME60[:58] + "x2x4b" and len(cut60) == 63  # the Deployment name itself is cut


# ---- (a) the per-service pod regex ---------------------------------------------------------------------------------


def pod_regex_of(query: str, label: str = "pod") -> re.Pattern[str]:
    """The regex of the ``label=~"..."`` matcher in ``query``, as Prometheus reads it (anchored: fullmatch)."""
    m = re.search(label + r'=~"((?:[^"\\]|\\.)*)"', query)
    assert m, query
    return re.compile(json.loads(f'"{m.group(1)}"'))  # PromQL double-quoted strings escape as JSON's do


def source_at(url: str = "http://127.0.0.1:9", **changes: object) -> PrometheusMetricsSource:
    values: dict[str, object] = {"url": url, "retries": 0, "timeout_seconds": 5}
    values.update(changes)
    return PrometheusMetricsSource(PrometheusSettings(**values))  # type: ignore[arg-type]


OWN = {
    NAME50: [
        pod_name(NAME50, HASH, "x2x4b"),
        pod_name(NAME50, HASH[:9], "qz7kd"),  # a 9-character hash: cut to 7 as well
        pod_name(NAME50, "27", "m9f2w"),  # a hash of any length that does not fit
        pod_name(NAME50, SHORT_HASH, "t5h8c"),  # one that fits: not cut
        pod_name(NAME50, "b", "t5h8c"),
    ],
    NAME60: [pod_name(NAME60, HASH, "x2x4b"), pod_name(NAME60, "z", "qz7kd"), pod_name(NAME60, HASH[:9], "m9f2w")],
}
# Deployments whose names begin like the service's but whose pods can be told apart by name.
OTHERS = {
    NAME50: [
        pod_name(NAME50 + "-v2", HASH, "x2x4b"),  # the "-v2" survives the cut, and the dash after it
        pod_name(NAME50 + "-b", HASH, "x2x4b"),
        pod_name(NAME50 + "-bcdfg", HASH, "x2x4b"),  # 5 hash-like characters: 1 short of passing for a hash
        pod_name(NAME50 + "x", HASH, "x2x4b"),
        pod_name(NAME50[:-1], HASH, "x2x4b"),
        pod_name(NAME50[:-1] + "x", HASH, "x2x4b"),
        pod_name(NAME50[:46], HASH, "x2x4b"),  # the longest name never cut
        f"{NAME50}-5d8f7c9x2x4",  # 62 characters: no pod of the service is that short when cut
        f"{NAME50}-5d8f7c9b6x2x4b",  # 65: longer than any pod name
        f"{NAME50}-5d8f7c9-x2x4b",  # 64: with a hash of 7 characters the dash after it is cut
        f"{NAME50}-5d8f7cax2x4b",  # a vowel is never in a hash or a random suffix
        f"{NAME50}-7b9d5c-x2x4b-0",  # a StatefulSet-like suffix
    ],
    NAME60: [
        pod_name(NAME60[:57] + "x" + NAME60[58:], HASH, "x2x4b"),  # differs within the kept 58 characters
        pod_name(NAME60[:57], HASH, "x2x4b"),  # kept: 57 characters and the dash, 58th differs ('-' vs 'e')
        pod_name(NAME60[:55], HASH, "x2x4b"),
        NAME60[:58] + "x2x4",
        NAME60[:58] + "x2x4bb",
        NAME60 + "-x2x4b",  # never generated (63 is the limit): the name must be cut
    ],
}
# Indistinguishable by name, which is why they match: a Deployment whose pods' names are cut to the same 58
# characters (from 58 characters on, any name with the same first 58; for the 50-character name, the name plus a
# dash and a run of hash-alphabet characters long enough to pass for a hash). Only owner references tell them apart.
TRUNCATION_EQUIVALENT = {
    NAME50: [pod_name(NAME50 + "-bcdfgh", HASH, "x2x4b"), pod_name(NAME50 + "-bcdfghj-x", HASH, "x2x4b")],
    NAME60: [pod_name(NAME60[:58] + "-other", HASH, "x2x4b"), pod_name(NAME60[:58], HASH, "x2x4b")],
}


@pytest.mark.parametrize("name", [NAME50, NAME60])
@pytest.mark.parametrize("signal", ["request_rate", "queue_depth", "latency", "gpu_utilization"])
def test_history_query_selects_the_cut_pods_of_the_service_and_no_other(name: str, signal: str) -> None:
    query = source_at().history_query(ServicePolicy(NS, name), signal)
    pods = pod_regex_of(query)
    assert f'namespace="{NS}"' in query
    for pod in OWN[name]:
        assert len(pod) <= MAX_NAME_LENGTH
        assert pods.fullmatch(pod), (pod, pods.pattern)
    for pod in OTHERS[name]:
        assert not pods.fullmatch(pod), (pod, pods.pattern)
    for pod in TRUNCATION_EQUIVALENT[name]:
        assert pods.fullmatch(pod), (pod, pods.pattern)


def test_short_names_keep_their_pod_regex() -> None:
    query = source_at().history_query(ServicePolicy(NS, SHORT), "request_rate")
    suffix = f"-[{ALPHABET}]{{1,10}}-[{ALPHABET}]{{5}}"
    assert f'pod=~"chat{suffix}"' in query
    pods = pod_regex_of(query)
    assert pods.fullmatch("chat-7d9f8b6c5-x2x4b") and not pods.fullmatch("chat-v2-7d9f8b6c5-x2x4b")
    # 46 characters: the longest name whose pods are never cut (46 + 1 + 10 + 1 + 5 = 63)
    name46 = NAME50[:46]
    pods = pod_regex_of(source_at().history_query(ServicePolicy(NS, name46), "request_rate"))
    assert pods.pattern.endswith(suffix) and pods.fullmatch(pod_name(name46, HASH, "x2x4b"))


@pytest.mark.parametrize("length", range(40, 70))
def test_the_pod_regex_follows_the_name_generator_for_every_length(length: int) -> None:
    name = ("a" * 30 + "-" + "b.c" * 20)[:length]  # '.' is legal in a Deployment name and a regex metacharacter
    pods = pod_regex_of(source_at().history_query(ServicePolicy(NS, name), "request_rate"))
    for size in range(1, 11):
        for template_hash in (HASH[:size], "z" * size):
            assert pods.fullmatch(pod_name(name, template_hash, "x2x4b")), (name, template_hash, pods.pattern)
    assert not pods.fullmatch(pod_name(name.replace(".", "x"), HASH, "x2x4b"))


def test_pod_mapper_without_a_snapshot_maps_cut_names_to_their_own_service_only() -> None:
    services = [ServicePolicy(NS, NAME50), ServicePolicy(NS, NAME60), ServicePolicy(NS, SHORT)]
    mapper = PodMapper(services)
    for name in (NAME50, NAME60):
        for pod in OWN[name]:
            assert mapper.service_of(NS, pod) == f"{NS}/{name}", pod
        for pod in OTHERS[name]:
            if len(pod) <= MAX_NAME_LENGTH:  # longer ones never exist (the name parser would take some)
                assert mapper.service_of(NS, pod) is None, pod
    # a short managed name that merely begins a long unmanaged one does not take its cut pods
    assert mapper.service_of(NS, pod_name(SHORT + "-" + NAME50, HASH, "x2x4b")) is None


# ---- (b) the latency of such a service, canned answers ---------------------------------------------------------------


@pytest.fixture
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    server.answers = {k: Answer(v) for k, v in copy.deepcopy(HEALTHY).items()}
    yield server
    server.stop()


def guarded(name: str, **changes: object) -> ServicePolicy:
    values: dict[str, object] = {"latency_slo_s": 1.0, "metric": MetricKind.REQUEST_RATE, "target": 1.0}
    values.update(changes)
    return ServicePolicy(NS, name, **values)  # type: ignore[arg-type]


def tagged(answers: dict[str, float]) -> Answer:
    return Answer(vector(*(series({"autoscaler_service": key}, str(v)) for key, v in answers.items())))


def test_latency_of_long_names_comes_from_a_query_over_their_own_pods(canned: CannedPrometheus) -> None:
    # What Prometheus answers to the batched default: the pods of cut names do not match the pod regex, so the
    # label_replace leaves them without a deployment label and they are summed into a namespace-only series.
    canned.answers["latency"] = Answer(
        vector(series({"namespace": NS, "deployment": SHORT}, "0.25"), series({"namespace": NS}, "9"))
    )
    canned.answers["override"] = tagged({f"{NS}/{NAME50}": 0.5, f"{NS}/{NAME60}": 0.75})
    services = [guarded(SHORT), guarded(NAME50), guarded(NAME60, latency_quantile=0.99)]
    obs = source_at(canned.url).observe(services, NOW)
    short, long50, long60 = (obs.services[s.key] for s in services)
    assert (short.latency_s, long50.latency_s, long60.latency_s) == (0.25, 0.5, 0.75)
    for got in (short, long50, long60):
        assert not [r for r in got.partial_reasons if "latency" in r], got.partial_reasons
    own = [q for family, q in canned.queries if family == "override"]
    assert len(own) == 1  # both long names in one batched query
    assert "histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{" in own[0]
    assert "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{" in own[0]
    parts = own[0].split(" or ")
    for name, part in zip((NAME50, NAME60), parts, strict=True):
        pods = pod_regex_of(part)
        assert f'namespace="{NS}"' in part and f'"{NS}/{name}"' in part
        assert all(pods.fullmatch(p) for p in OWN[name]) and not any(pods.fullmatch(p) for p in OTHERS[name])
    # the batched default still runs for the short names, at their quantiles only (0.99 is a long name's)
    assert [q.split(",")[0] for family, q in canned.queries if family == "latency"] == ["histogram_quantile(0.95"]


def test_a_long_name_without_latency_is_partial_not_silently_complete(canned: CannedPrometheus) -> None:
    canned.answers["override"] = tagged({})
    obs = source_at(canned.url).observe([guarded(NAME50)], NOW)
    got = obs.services[f"{NS}/{NAME50}"]
    assert got.latency_s is None and any("latency" in r and "no series" in r for r in got.partial_reasons)


def test_short_names_alone_ask_nothing_more(canned: CannedPrometheus) -> None:
    source = source_at(canned.url)
    source.observe([guarded(SHORT), guarded(NAME50[:46])], NOW)
    assert not [q for family, q in canned.queries if family == "override"]
    assert source.last_stats.queries == 7


def test_an_override_and_a_custom_latency_query_are_used_as_documented(canned: CannedPrometheus) -> None:
    override = 'histogram_quantile({quantile}, sum by (le) (rate(my_bucket{namespace="{namespace}"}[{window}])))'
    source = source_at(canned.url)
    source.set_service_queries({f"{NS}/{NAME50}": QueriesSpec(latency=override)})
    canned.answers["override"] = tagged({f"{NS}/{NAME50}": 0.125, f"{NS}/{NAME60}": 0.75})
    obs = source.observe([guarded(NAME50), guarded(NAME60)], NOW)
    assert obs.services[f"{NS}/{NAME50}"].latency_s == 0.125
    assert obs.services[f"{NS}/{NAME60}"].latency_s == 0.75
    own = [q for family, q in canned.queries if family == "override"]
    assert any("my_bucket" in q and NAME60 not in q for q in own)
    assert any(NAME60[:58] in q and NAME50 not in q for q in own)
    assert source.history_query(guarded(NAME50), "latency").startswith("histogram_quantile(0.95, sum by (le) (rate(my_")

    # A latency_query of the operator's own (here: a real deployment label on the metric) is used for every
    # service, long names included, exactly as before; no per-service query is added.
    canned.queries.clear()
    custom = (
        "histogram_quantile({quantile}, sum by ({namespace_label}, {deployment_label}, le) "
        "(rate({metric}{selector}[{window}])))"
    )
    canned.answers["latency"] = Answer(vector(series({"namespace": NS, "deployment": NAME60}, "0.3")))
    source = source_at(canned.url, latency_query=custom)
    obs = source.observe([guarded(NAME60)], NOW)
    assert obs.services[f"{NS}/{NAME60}"].latency_s == 0.3
    assert not [q for family, q in canned.queries if family == "override"]
    assert next(q for family, q in canned.queries if family == "latency").startswith(
        "histogram_quantile(0.95, sum by (namespace, deployment, le) (rate("
    )


# ---- against a real Prometheus -------------------------------------------------------------------------------------

T0 = 1_699_990_000.0
STEP = 15.0
POINTS = 41  # 10 minutes
T_END = T0 + STEP * (POINTS - 1)
WINDOW = 4 * STEP  # samples on both ends of the window: rate() is exact
BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
FAST = (0.1, 0.3, 0.6, 0.9, 1.0, 1.0, 1.0)  # cumulative share of requests per bucket
QUICK = (0.5, 0.8, 0.95, 1.0, 1.0, 1.0, 1.0)
SLOW = (0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 1.0)
DECOY50, DECOY60 = NAME50 + "-v2", NAME60[:57] + "x" + NAME60[58:]
# Deployment -> (latency shape, requests/s of each pod by pod name)
WORLD: dict[str, tuple[tuple[float, ...], dict[str, float]]] = {
    NAME50: (FAST, {pod_name(NAME50, HASH, "x2x4b"): 2.0, pod_name(NAME50, HASH[:9], "qz7kd"): 3.0}),
    NAME60: (QUICK, {pod_name(NAME60, HASH, "x2x4b"): 1.0, pod_name(NAME60, "z", "qz7kd"): 1.5}),
    DECOY50: (SLOW, {pod_name(DECOY50, HASH, "m9f2w"): 7.0}),
    DECOY60: (SLOW, {pod_name(DECOY60, HASH, "t5h8c"): 5.0}),
    SHORT: (QUICK, {pod_name(SHORT, "7d9f8b6c5", "x2x4b"): 4.0}),
}


def expected_rate(deployment: str) -> float:
    return sum(WORLD[deployment][1].values())


def expected_latency(deployment: str, q: float) -> float:
    shape, pods = WORLD[deployment]
    total = sum(pods.values())
    return histogram_quantile(q, [(le, total * share) for le, share in zip(BUCKETS, shape, strict=True)])


def write_world(path: Path) -> None:
    times = [T0 + STEP * i for i in range(POINTS)]
    w = OpenMetricsWriter(path)
    w.family("vllm:request_success", "counter")
    for _, pods in WORLD.values():
        for pod, rate in pods.items():
            w.series("vllm:request_success_total", {"namespace": NS, "pod": pod}, [(t, rate * (t - T0)) for t in times])
    w.family("vllm:e2e_request_latency_seconds", "histogram")
    for shape, pods in WORLD.values():
        for pod, rate in pods.items():
            for le, share in zip(BUCKETS, shape, strict=True):
                labels = {"namespace": NS, "pod": pod, "le": "+Inf" if le == math.inf else repr(le)}
                points = [(t, rate * share * (t - T0)) for t in times]
                w.series("vllm:e2e_request_latency_seconds_bucket", labels, points)
    w.close()


@pytest.mark.integration
def test_real_prometheus_finds_the_latency_and_history_of_cut_names(
    prom_binaries: tuple[str, str],
    start_prometheus: Callable[..., PrometheusServer],
    tmp_path: Path,
) -> None:
    write_world(tmp_path / "world.om")
    backfill(prom_binaries[1], tmp_path / "world.om", tmp_path / "blocks")
    server = start_prometheus(tmp_path / "blocks")
    source = source_at(server.url, rate_window_seconds=WINDOW)
    services = [guarded(NAME50), guarded(NAME60, latency_quantile=0.5), guarded(SHORT)]
    obs = source.observe(services, T_END)
    for service in services:
        got = obs.services[service.key]
        q = service.latency_quantile or 0.95
        assert got.latency_s == pytest.approx(expected_latency(service.name, q), rel=1e-6), service.key
        assert got.request_rate == pytest.approx(expected_rate(service.name), rel=1e-6), service.key
        assert got.stale_reasons == () and got.partial_reasons == (), (service.key, got)
    assert source.last_stats.queries == 7 + 1  # the two long names share one query

    for service in services:
        rate = source.history(service, "request_rate", T0 + WINDOW, T_END, STEP)
        assert len(rate.times) == POINTS - 4, service.key
        assert rate.values == pytest.approx([expected_rate(service.name)] * len(rate.times), rel=1e-6)
        q = service.latency_quantile or 0.95
        latency = source.history(service, "latency", T0 + WINDOW, T_END, STEP)
        assert len(latency.times) == POINTS - 4, service.key
        assert latency.values == pytest.approx([expected_latency(service.name, q)] * len(latency.times), rel=1e-6)
