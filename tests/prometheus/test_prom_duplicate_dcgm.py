"""dcgm-exporter scraped more than once: its series for one GPU are copies of one reading, read as one GPU.

With kube-prometheus-stack beside the NVIDIA GPU operator, the exporter is often collected twice: a ServiceMonitor
beside a PodMonitor, the ``prometheus.io/scrape`` annotation job beside a ServiceMonitor, or two Prometheus replicas
read through a Thanos querier that does not deduplicate. Every DCGM family then answers two series per GPU (same
UUID, MIG instance, namespace and pod) differing only in the labels of the scrape (job, service, endpoint,
prometheus_replica...). They were a conflict ("2 series for one GPU"): every GPU-scaled service stale, held, never
scaled, for as long as the misconfiguration lasted.

Now the copies are one GPU with the value that never scales down by accident (the largest utilisation, engine
activity and memory used, the least memory free); a copy older than the staleness bound gives way to a fresh one; a
copy with an invalid value beside a valid one leaves the value usable but partial (no scale-down); two MIG instances
of one GPU, or two pods sharing one GPU, are not copies. Canned answers over real HTTP, then a real Prometheus
scraping one live exporter with two jobs.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from canned import HEALTHY, NOW, P0, P1, Answer, CannedPrometheus, gpu, series, vector
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from promserver import PrometheusServer, free_port

from autoscaler.adapters.prometheus import AGE_TAG, PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, PodInfo
from autoscaler.core.decide import decide
from autoscaler.core.model import (
    ControllerState,
    GpuSample,
    MetricKind,
    Observation,
    ScaleDecision,
    ServiceObservation,
    ServicePolicy,
)
from autoscaler.core.reasons import Reason

RS = P0.rsplit("-", 1)[0]
METRICS = {
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "engine": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "fb_used": "DCGM_FI_DEV_FB_USED",
    "fb_free": "DCGM_FI_DEV_FB_FREE",
}
# What each way of scraping the exporter twice adds to its series (prometheus-operator's labels).
SERVICE_MONITOR = {
    "job": "nvidia-dcgm-exporter",
    "service": "nvidia-dcgm-exporter",
    "endpoint": "gpu-metrics",
    "container": "nvidia-dcgm-exporter",
    "instance": "10.0.0.1:9400",
}
POD_MONITOR = {  # no service label; the job is <namespace>/<PodMonitor name>
    "job": "gpu-operator/nvidia-dcgm-exporter",
    "endpoint": "metrics",
    "container": "nvidia-dcgm-exporter",
    "instance": "10.0.0.1:9400",
}
REPLICA_1 = {**SERVICE_MONITOR, "prometheus": "monitoring/k8s", "prometheus_replica": "prometheus-k8s-1"}
COPIES = (SERVICE_MONITOR, POD_MONITOR, REPLICA_1)


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedPrometheus]:
    server = CannedPrometheus().start()
    yield server
    server.stop()


def dcgm(family: str, i: int, scrape: dict[str, str], **extra: str) -> dict[str, str]:
    """GPU ``i`` (of pod P0 or P1) in ``family`` as one scrape collected it."""
    labels = gpu(i, __name__=METRICS[family])
    for name in ("job", "container", "instance"):  # canned's own scrape labels: replaced by this scrape's
        del labels[name]
    return {**labels, **scrape, **extra}


def family(name: str, per_gpu: dict[int, tuple[Any, ...]], **extra: str) -> dict[str, Any]:
    """``name``'s answer: for each GPU, one series per value, the k-th as collected by the k-th scrape of COPIES."""
    return vector(
        *(
            series(dcgm(name, i, COPIES[k], **extra), value)
            for i, values in per_gpu.items()
            for k, value in enumerate(values)
        )
    )


def aged(name: str, i: int, k: int, age_s: float) -> dict[str, Any]:
    """The age series the adapter asks with each DCGM family (timestamp() drops the metric name)."""
    labels = {n: v for n, v in dcgm(name, i, COPIES[k]).items() if n != "__name__"}
    return series({**labels, AGE_TAG: "x"}, str(age_s))


def snapshot(gpus_per_pod: int = 1) -> ClusterSnapshot:
    pods = tuple(
        PodInfo("ml", p, "node-a", gpus_per_pod, 0, "Running", True, owner_kind="ReplicaSet", owner_name=RS)
        for p in (P0, P1)
    )
    return ClusterSnapshot(time=NOW, deployments=(DeploymentInfo("ml", "chat", 2, 2),), pods=pods)


def source_for(url: str, **changes: Any) -> PrometheusMetricsSource:
    values: dict[str, Any] = {"url": url, "retries": 0, "timeout_seconds": 5}
    values.update(changes)
    return PrometheusMetricsSource(PrometheusSettings(**values))


def observe(
    canned: CannedPrometheus,
    answers: dict[str, Any],
    policy: ServicePolicy,
    cluster: ClusterSnapshot | None = None,
    source: PrometheusMetricsSource | None = None,
) -> Observation:
    canned.answers = {
        name: body if isinstance(body, Answer) else Answer(body)
        for name, body in {**copy.deepcopy(HEALTHY), **answers}.items()
    }
    own = source is None
    source = source or source_for(canned.url)
    try:
        return source.observe([policy], NOW, cluster=cluster if cluster is not None else snapshot())
    finally:
        if own:
            source.close()


def decision_after_window(obs: Observation, policy: ServicePolicy, now: float = NOW) -> ScaleDecision:
    state = ControllerState()
    for t in (now - 400, now):  # past the scale-down stabilisation window
        plan, state = decide(obs, state, {policy.key: policy}, t)
    return plan.decisions[0]


def gpu_of(obs: Observation, uuid: str, pod: str | None = None) -> GpuSample:
    found = [g for g in obs.gpus if g.uuid == uuid and (pod is None or g.pod == pod)]
    assert len(found) == 1, obs.gpus
    return found[0]


UTIL = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=50.0, min_replicas=1)
ENGINE = ServicePolicy("ml", "chat", metric=MetricKind.ENGINE_ACTIVE, target=0.5, min_replicas=1)


def every_family_twice() -> dict[str, Any]:
    """Each family twice per GPU (a ServiceMonitor and a PodMonitor), the copies' values apart: scraped at other
    instants, a copy reads the GPU a little earlier or later than the other."""
    return {
        "util": family("util", {0: ("40", "55"), 1: ("60", "58")}),
        "engine": family("engine", {0: ("0.45", "0.4"), 1: ("0.6", "0.7")}),
        "fb_used": family("fb_used", {0: ("30000", "31000"), 1: ("50000", "49000")}),
        "fb_free": family("fb_free", {0: ("51559", "50559"), 1: ("31559", "32559")}),
    }


def assert_clean(chat: ServiceObservation) -> None:
    assert (chat.stale_reasons, chat.partial_reasons) == ((), ()), chat


# ---- copies are one GPU, with the value that errs towards more replicas ----------------------------------------


def test_two_copies_of_every_family_are_one_gpu_each(canned: CannedPrometheus) -> None:
    obs = observe(canned, every_family_twice(), UTIL)
    assert sorted(g.uuid for g in obs.gpus) == ["GPU-0", "GPU-1"]
    gpu0, gpu1 = gpu_of(obs, "GPU-0"), gpu_of(obs, "GPU-1")
    # the largest utilisation, engine activity and memory used, the least memory free
    assert (gpu0.utilization, gpu0.engine_active, gpu0.fb_used_mib, gpu0.fb_free_mib) == (55, 0.45, 31000, 50559)
    assert (gpu1.utilization, gpu1.engine_active, gpu1.fb_used_mib, gpu1.fb_free_mib) == (60, 0.7, 50000, 31559)
    assert gpu0.stale_reasons == gpu1.stale_reasons == ()
    assert (gpu0.pod, gpu1.pod, gpu0.node, gpu0.model_name) == (P0, P1, "node-a", "NVIDIA H100 80GB HBM3")
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.missing) == (2, 0)
    assert chat.pods.metric_sum == 115
    # was METRICS_STALE, held at 2: now (55 + 60) / 50 -> 3
    decision = decision_after_window(obs, UTIL)
    assert (decision.reason, decision.desired_replicas) == (Reason.METRIC_ABOVE_TARGET, 3), decision


def test_engine_activity_copies_scale_on_the_largest(canned: CannedPrometheus) -> None:
    obs = observe(canned, every_family_twice(), ENGINE)
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and chat.pods.metric_sum == pytest.approx(0.45 + 0.7)
    decision = decision_after_window(obs, ENGINE)
    assert (decision.reason, decision.desired_replicas) == (Reason.METRIC_ABOVE_TARGET, 3), decision


def test_a_copy_reading_low_does_not_scale_down(canned: CannedPrometheus) -> None:
    # 10 % on the copy scraped before the load arrived, 48 % on the other: (48 + 48) / 50 keeps 2, never 1
    answers = {"util": family("util", {0: ("10", "48"), 1: ("48", "10")})}
    obs = observe(canned, answers, UTIL)
    assert_clean(obs.services["ml/chat"])
    decision = decision_after_window(obs, UTIL)
    assert (decision.reason, decision.desired_replicas) == (Reason.WITHIN_TOLERANCE, 2), decision


def test_three_copies_are_one_gpu(canned: CannedPrometheus) -> None:
    answers = {
        "util": family("util", {0: ("30", "70", "50"), 1: ("20", "20", "20")}),
        "fb_free": family("fb_free", {0: ("1000", "900", "1100"), 1: ("5", "5", "5")}),
    }
    obs = observe(canned, answers, UTIL)
    assert len(obs.gpus) == 2
    assert (gpu_of(obs, "GPU-0").utilization, gpu_of(obs, "GPU-0").fb_free_mib) == (70, 900)
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and chat.pods.metric_sum == 90


def test_the_double_scrape_is_logged_once_per_set_of_differing_labels(
    canned: CannedPrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    source = source_for(canned.url)
    try:
        with caplog.at_level(logging.WARNING, logger="autoscaler.adapters.prometheus"):
            for _ in range(2):  # two ticks, four families each
                observe(canned, every_family_twice(), UTIL, source=source)
    finally:
        source.close()
    copies = [r.getMessage() for r in caplog.records if "scraped more than once" in r.getMessage()]
    assert len(copies) == 1, copies
    assert "differing in endpoint, job, service" in copies[0] and "GPU 0 of node node-a" in copies[0], copies[0]


# ---- a copy with a problem ---------------------------------------------------------------------------------------


def test_one_copy_nan_beside_a_valid_one_is_usable_but_partial(canned: CannedPrometheus) -> None:
    # The valid copy is the GPU's reading: the service is not held. But the invalid copy may be the newer reading
    # (or another exporter's) and is not hidden: partial, so no scale-down on it, and the GPU says why.
    answers = {"util": family("util", {0: ("NaN", "10"), 1: ("10", "10")})}
    obs = observe(canned, answers, UTIL)
    chat = obs.services["ml/chat"]
    assert chat.stale_reasons == (), chat.stale_reasons
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.metric_sum) == (2, 20)
    assert len(chat.partial_reasons) == 1, chat.partial_reasons
    assert "1 of 2 copies" in chat.partial_reasons[0] and "value is NaN" in chat.partial_reasons[0]
    assert P0 in chat.partial_reasons[0] and "GPU 0 of node node-a" in chat.partial_reasons[0]
    gpu0 = gpu_of(obs, "GPU-0")
    assert gpu0.utilization == 10 and any("value is NaN" in r for r in gpu0.stale_reasons), gpu0
    assert gpu_of(obs, "GPU-1").stale_reasons == ()
    # 20 / 50 would be 1 replica: partial data never removes one
    decision = decision_after_window(obs, UTIL)
    assert (decision.reason, decision.desired_replicas) == (Reason.METRICS_PARTIAL, 2), decision


def test_one_copy_invalid_still_lets_the_service_scale_up(canned: CannedPrometheus) -> None:
    answers = {"util": family("util", {0: ("95", "100.5"), 1: ("95", "95")})}
    obs = observe(canned, answers, UTIL)
    chat = obs.services["ml/chat"]
    assert chat.stale_reasons == () and any("value 100.5 outside 0..100" in r for r in chat.partial_reasons), chat
    assert chat.pods is not None and chat.pods.metric_sum == 190
    decision = decision_after_window(obs, UTIL)
    assert (decision.reason, decision.desired_replicas) == (Reason.METRIC_ABOVE_TARGET, 4), decision


def test_every_copy_invalid_is_a_gpu_without_a_value(canned: CannedPrometheus) -> None:
    answers = {"util": family("util", {0: ("NaN", "NaN"), 1: ("10", "10")})}
    obs = observe(canned, answers, UTIL)
    gpu0 = gpu_of(obs, "GPU-0")
    assert gpu0.utilization is None and gpu0.stale_reasons == ("DCGM_FI_DEV_GPU_UTIL: value is NaN",), gpu0
    chat = obs.services["ml/chat"]
    # as with one series: the other pod reports, so partial (no scale-down), one pod missing
    assert chat.stale_reasons == () and chat.pods is not None
    assert (chat.pods.ready_with_metric, chat.pods.missing) == (1, 1)
    assert any("1 of 2 ready pods without a valid sample" in r and "value is NaN" in r for r in chat.partial_reasons)
    assert decision_after_window(obs, UTIL).reason is Reason.METRICS_PARTIAL


def test_every_copy_of_every_gpu_invalid_is_stale(canned: CannedPrometheus) -> None:
    answers = {"util": family("util", {0: ("NaN", "-Inf"), 1: ("NaN", "NaN")})}
    obs = observe(canned, answers, UTIL)
    chat = obs.services["ml/chat"]
    assert chat.pods is None and any("2 of 2 ready pods without a valid sample" in r for r in chat.stale_reasons)
    reasons = gpu_of(obs, "GPU-0").stale_reasons
    assert reasons == ("DCGM_FI_DEV_GPU_UTIL: value is NaN", "DCGM_FI_DEV_GPU_UTIL: value is -Inf"), reasons
    assert decision_after_window(obs, UTIL).reason is Reason.METRICS_STALE


# ---- copies and the staleness bound ------------------------------------------------------------------------------


def test_a_stale_copy_gives_way_to_a_fresh_one(canned: CannedPrometheus) -> None:
    # A Prometheus replica down behind Thanos: its copy lingers in the lookback, older and older. The fresh copy is
    # the GPU's newer reading: the service is fresh, and the stale copy's value is not used, even the larger.
    util = family("util", {0: ("90", "40"), 1: ("60", "60")})
    util["data"]["result"].append(aged("util", 0, 0, 300))
    obs = observe(canned, {"util": util}, UTIL)
    gpu0 = gpu_of(obs, "GPU-0")
    assert gpu0.utilization == 40 and gpu0.stale_reasons == (), gpu0
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and chat.pods.metric_sum == 100


def test_every_copy_stale_is_stale_with_the_youngest_age(canned: CannedPrometheus) -> None:
    util = family("util", {0: ("90", "40"), 1: ("60", "60")})
    util["data"]["result"] += [aged("util", 0, 0, 300), aged("util", 0, 1, 200)]
    obs = observe(canned, {"util": util}, UTIL)
    gpu0 = gpu_of(obs, "GPU-0")
    assert gpu0.utilization is None, gpu0
    assert gpu0.stale_reasons == ("DCGM_FI_DEV_GPU_UTIL: last sample 200s old (> staleness_seconds 120)",)
    chat = obs.services["ml/chat"]
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.missing) == (1, 1)
    assert any("last sample 200s old" in r for r in chat.partial_reasons), chat.partial_reasons


def test_a_stale_copy_beside_an_invalid_one_is_a_gpu_without_a_value(canned: CannedPrometheus) -> None:
    util = family("util", {0: ("NaN", "40"), 1: ("60", "60")})
    util["data"]["result"].append(aged("util", 0, 1, 300))
    obs = observe(canned, {"util": util}, UTIL)
    gpu0 = gpu_of(obs, "GPU-0")
    assert gpu0.utilization is None
    assert set(gpu0.stale_reasons) == {
        "DCGM_FI_DEV_GPU_UTIL: value is NaN",
        "DCGM_FI_DEV_GPU_UTIL: last sample 300s old (> staleness_seconds 120)",
    }


def test_one_series_older_than_the_bound_is_still_stale(canned: CannedPrometheus) -> None:
    util = family("util", {0: ("40",), 1: ("60",)})
    util["data"]["result"].append(aged("util", 1, 0, 300))
    obs = observe(canned, {"util": util}, UTIL)
    assert gpu_of(obs, "GPU-1").utilization is None
    assert "last sample 300s old" in gpu_of(obs, "GPU-1").stale_reasons[0]


# ---- what is not a copy ----------------------------------------------------------------------------------------


def test_two_mig_instances_of_one_gpu_are_two_gpus(canned: CannedPrometheus) -> None:
    # P0 holds two MIG instances of GPU-0 (each scraped twice), P1 one of GPU-1: three GPUs, P0's mean of two
    def mig(name: str, values: dict[tuple[int, str], tuple[str, str]]) -> dict[str, Any]:
        items = []
        for (i, instance), pair in values.items():
            for k, value in enumerate(pair):
                labels = dcgm(name, i, COPIES[k], GPU_I_ID=instance, GPU_I_PROFILE="3g.40gb")
                items.append(series(labels, value))
        return vector(*items)

    util = {(0, "1"): ("20", "20"), (0, "2"): ("80", "70"), (1, "1"): ("40", "40")}
    answers = {name: mig(name, util) for name in ("util", "fb_used", "fb_free")} | {"engine": vector()}
    obs = observe(canned, answers, UTIL, snapshot(gpus_per_pod=0))
    assert sorted((g.uuid, g.pod, g.utilization) for g in obs.gpus) == [
        ("GPU-0", P0, 20),
        ("GPU-0", P0, 80),
        ("GPU-1", P1, 40),
    ]
    assert all(g.stale_reasons == () for g in obs.gpus), obs.gpus
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and chat.pods.metric_sum == (20 + 80) / 2 + 40


def test_one_gpu_time_sliced_by_two_pods_is_read_for_each_pod(canned: CannedPrometheus) -> None:
    # dcgm-exporter gives a time-sliced GPU one series per pod: two pods, not two copies (each scraped twice here)
    def shared(name: str, value: str) -> dict[str, Any]:
        return vector(*(series(dcgm(name, 0, COPIES[k], pod=pod), value) for pod in (P0, P1) for k in range(2)))

    answers = {"util": shared("util", "35"), "fb_used": shared("fb_used", "1"), "fb_free": shared("fb_free", "2")}
    obs = observe(canned, {**answers, "engine": vector()}, UTIL, snapshot(gpus_per_pod=0))
    assert sorted((g.uuid, g.pod, g.utilization) for g in obs.gpus) == sorted([("GPU-0", P0, 35), ("GPU-0", P1, 35)])
    chat = obs.services["ml/chat"]
    assert_clean(chat)
    assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.metric_sum) == (2, 70)


# ---- live: one exporter scraped by two jobs ------------------------------------------------------------------------

LIVE_PODS = ("chat-5c8d7f9b4-x2x4b", "chat-5c8d7f9b4-qz7kd")
LIVE_UTIL = (80.0, 70.0)
LIVE_RS = LIVE_PODS[0].rsplit("-", 1)[0]


@pytest.mark.integration
def test_live_exporter_scraped_by_two_jobs_scales_on_its_gpus(
    start_prometheus: Callable[..., PrometheusServer],
) -> None:
    registry = CollectorRegistry()
    names = ["gpu", "UUID", "modelName", "Hostname", "namespace", "pod"]
    gauges = {
        metric: Gauge(metric, metric, names, registry=registry)
        for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    }
    for i, pod in enumerate(LIVE_PODS):
        labels = {"gpu": str(i), "UUID": f"GPU-live-{i}", "modelName": "NVIDIA L4", "Hostname": "live-node"}
        labels |= {"namespace": "ml", "pod": pod}
        gauges["DCGM_FI_DEV_GPU_UTIL"].labels(**labels).set(LIVE_UTIL[i])
        gauges["DCGM_FI_DEV_FB_USED"].labels(**labels).set(1000)
        gauges["DCGM_FI_DEV_FB_FREE"].labels(**labels).set(22000)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    # a ServiceMonitor and a PodMonitor of the GPU operator's exporter: two jobs, one target
    config = "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + "".join(
        f"  - job_name: {job}\n    honor_labels: true\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        for job in ("nvidia-dcgm-exporter", "gpu-operator/nvidia-dcgm-exporter")
    )
    try:
        prometheus = start_prometheus(config=config)
        source = source_for(prometheus.url, staleness_seconds=10)
        policy = ServicePolicy("ml", "chat", metric=MetricKind.GPU_UTILIZATION, target=50.0, min_replicas=1)
        pods = tuple(
            PodInfo("ml", p, "live-node", 1, 0, "Running", True, owner_kind="ReplicaSet", owner_name=LIVE_RS)
            for p in LIVE_PODS
        )

        def both_jobs_scraped() -> bool:
            answer = requests.get(  # how many series per GPU
                f"{prometheus.url}/api/v1/query",
                params={"query": "count by (UUID) (DCGM_FI_DEV_GPU_UTIL)", "time": time.time()},
                timeout=5,
            ).json()
            counts = [float(item["value"][1]) for item in answer["data"]["result"]]
            return counts == [2.0, 2.0]

        deadline = time.monotonic() + 60
        while not both_jobs_scraped():
            assert time.monotonic() < deadline, prometheus.log_tail()
            time.sleep(0.25)
        now = time.time()
        cluster = ClusterSnapshot(time=now, deployments=(DeploymentInfo("ml", "chat", 2, 2),), pods=pods)
        obs = source.observe([policy], now, cluster=cluster)
        chat = obs.services["ml/chat"]
        assert_clean(chat)
        assert chat.pods is not None and (chat.pods.ready_with_metric, chat.pods.metric_sum) == (2, sum(LIVE_UTIL))
        assert sorted((g.uuid, g.utilization, g.stale_reasons) for g in obs.gpus) == [
            ("GPU-live-0", 80.0, ()),
            ("GPU-live-1", 70.0, ()),
        ]
        # (80 + 70) / 50: 3 replicas, from the GPU metric
        decision = decision_after_window(obs, policy, now)
        assert (decision.reason, decision.desired_replicas) == (Reason.METRIC_ABOVE_TARGET, 3), decision
        source.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
