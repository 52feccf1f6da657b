"""Review 40 of the controller's telemetry and tick reporting: the ``reason`` label of
``gpu_autoscaler_stale_services`` (``reporting.stale_category``) against the runbook's table
(deploy/runbooks/GPUAutoscalerServiceMetricsStale.md), and the MetricsStale Warning Events.

Defects (each was an ``xfail(strict=True)`` test below, failing on the code as it was; all three fixed, their tests
say "Fixed"):

1. WRONG: a TLS failure talking to Prometheus ("<metric>: Prometheus at <url>: TLS error (certificate verify
   failed ...); check ca_bundle", the adapter's wording since review 40 of the Prometheus adapter, which used to say
   "unreachable") is labelled ``other`` -- or, with a host such as ``thanos-infra``, ``invalid_value`` (its "-inf").
   The whole tick holds and every service is stale, yet the alert's runbook sends the operator to "read the Event"
   or to the exporter instead of to Prometheus and the network. RIGHT: ``metrics_unavailable``, as for an
   unreachable Prometheus.
2. WRONG: any other transport failure of the request ("Prometheus at <url>: <exception>", requests'
   catch-all: an invalid URL, too many redirects) is labelled by the words of the exception: "Invalid URL" reads
   as ``invalid_value`` (NaN, +-Inf or out of range, says the runbook), "Exceeded 30 redirects" as ``other``.
   RIGHT: ``metrics_unavailable``: Prometheus gave no answer.
3. WRONG: a sample of the wrong shape in Prometheus's answer ("unexpected sample shape (a range vector)", e.g. an
   override returning a range vector) is labelled ``other``, though the runbook's ``query_failed`` is "Prometheus
   ... answered unexpectedly" and the adapter's other unexpected answers are labelled so. RIGHT: ``query_failed``.

Passing tests pin what this review checked and no other test pins: every category is one of
``STALE_CATEGORY_NAMES`` and has a row in the runbook; a dry run's MetricsStale Warning is marked ``[dry-run]``, sent
once per episode whatever its changing age says, again for a new episode, under an UpperCamelCase reason; and the
per-service gauges of a service whose metrics are stale keep its replica counts and drop its stale series when it
recovers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_fakes import FakeCluster

from autoscaler.controller import Controller
from autoscaler.reporting import STALE_CATEGORY_NAMES, stale_category
from tests.runtime.test_controller import make, sample

T0 = 1_800_000_000.0
KEY = "ml/chat"
RUNBOOK = Path(__file__).resolve().parents[2] / "deploy" / "runbooks" / "GPUAutoscalerServiceMetricsStale.md"


# ---- 1. a TLS failure is Prometheus unavailable ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "gpu_utilization: Prometheus at https://prometheus.monitoring.svc:9090: TLS error (certificate verify failed: "
        "self-signed certificate in certificate chain); check ca_bundle",
        "request_rate: Prometheus at https://thanos-infra.monitoring:10902: TLS error (certificate verify failed: "
        "Hostname mismatch); check ca_bundle",
    ],
)
def test_a_tls_failure_is_metrics_unavailable(reason: str) -> None:
    """Fixed (was a strict xfail). The tick holds as for an unreachable Prometheus; the label says so."""
    assert stale_category(reason) == "metrics_unavailable"


# ---- 2. any other transport failure is Prometheus unavailable --------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "request_rate: Prometheus at http://prometheus:9090: Invalid URL 'prometheus:9090/api/v1/query': No scheme "
        "supplied",
        "gpu_utilization: Prometheus at http://prometheus.monitoring:9090: Exceeded 30 redirects.",
    ],
)
def test_a_request_that_got_no_answer_is_metrics_unavailable(reason: str) -> None:
    """Fixed (was a strict xfail). The exception's words are not a verdict on the metrics' values."""
    assert stale_category(reason) == "metrics_unavailable"


# ---- 3. a sample of the wrong shape is an unexpected answer ----------------------------------------------------------


def test_a_sample_of_the_wrong_shape_is_query_failed() -> None:
    """Fixed (was a strict xfail). The adapter's "unexpected sample shape" is Prometheus answering unexpectedly."""
    assert stale_category("gpu_utilization: unexpected sample shape (a range vector)") == "query_failed"
    assert stale_category("gpu_utilization: unexpected answer: result is dict, not a vector") == "query_failed"


# ---- pinned ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "category"),
    [
        ("request_rate: Prometheus at http://prometheus:9090 unreachable: Connection refused", "metrics_unavailable"),
        (
            "request_rate: Prometheus at http://prometheus:9090 did not answer within 10s (timeout_seconds)",
            "metrics_unavailable",
        ),
        ("request_rate: Prometheus query failed: HTTP Status Code 422 ('bad_data')", "query_failed"),
        ("gpu_utilization: last sample 95s old (> staleness_seconds 60)", "sample_too_old"),
        ("gpu_utilization: GPU 0 of node gpu-1: value is NaN", "invalid_value"),
        ("queue_depth: pod chat-1: 2 series (differing in instance)", "duplicate_series"),
        ("deployment_not_found", "deployment_not_found"),
    ],
)
def test_the_adapters_reasons_get_the_runbooks_categories(reason: str, category: str) -> None:
    assert stale_category(reason) == category


def test_every_category_is_in_the_runbook() -> None:
    runbook = RUNBOOK.read_text()
    for name in STALE_CATEGORY_NAMES:
        assert f"| `{name}` |" in runbook, name


def _stale_events(cluster: FakeCluster) -> list[dict[str, object]]:
    return [e for e in cluster.events if e["reason"] == "MetricsStale"]


def test_a_dry_runs_stale_warning_is_marked_and_sent_once_per_episode() -> None:
    c, cluster, metrics, _, _ = make(dry_run=True)
    for i, age in enumerate((95, 110, 125)):
        metrics.stale[KEY] = (f"gpu_utilization: last sample {age}s old (> staleness_seconds 60)",)
        c.run_once(T0 + 15 * i)
    events = _stale_events(cluster)
    assert len(events) == 1, events
    assert events[0]["type"] == "Warning"
    assert str(events[0]["message"]).startswith("[dry-run] holding ml/chat: "), events[0]
    del metrics.stale[KEY]
    c.run_once(T0 + 60)
    metrics.stale[KEY] = ("gpu_utilization: last sample 70s old (> staleness_seconds 60)",)
    c.run_once(T0 + 75)
    assert len(_stale_events(cluster)) == 2


def _stale_series(c: Controller) -> float:
    return sample(c, "gpu_autoscaler_stale_services", namespace="ml", service="chat", reason="sample_too_old")


def test_a_stale_service_keeps_its_replica_gauges_and_loses_its_stale_series_on_recovery() -> None:
    c, _, metrics, _, _ = make()
    metrics.stale[KEY] = ("gpu_utilization: last sample 95s old (> staleness_seconds 60)",)
    c.run_once(T0)
    assert _stale_series(c) == 1
    assert sample(c, "gpu_autoscaler_current_replicas", namespace="ml", service="chat") == 2
    assert sample(c, "gpu_autoscaler_desired_replicas", namespace="ml", service="chat") == 2
    del metrics.stale[KEY]
    c.run_once(T0 + 15)
    labels = {"namespace": "ml", "service": "chat", "reason": "sample_too_old"}
    assert c.telemetry.registry.get_sample_value("gpu_autoscaler_stale_services", labels) is None
