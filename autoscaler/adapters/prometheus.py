"""The metrics port on Prometheus: DCGM GPU metrics and application signals, via prometheus-api-client.

One tick asks a fixed number of instant queries, whatever the cluster size: one per DCGM family (utilisation,
engine activity, framebuffer used, framebuffer free) and one per application family (request rate, queue depth,
latency quantile), each aggregated by labels; per-service query overrides are batched with ``or`` into as few
queries as fit ``max_query_length``, and so is, with the default latency query, the latency of each Deployment whose
pods' names the API server may cut to 63 characters (a name of more than 46 characters: its Deployment cannot be
read back from the pod name, so it is asked over its own pods). Results are mapped to services here, in Python: a
Deployment's pods are named ``<deployment>-<template-hash>-<random>``, and when the caller passes the cluster
snapshot its pod owner references and readiness are used instead (the HPA's own view: ready pods, missing samples,
unready pods).

Validation happens at this boundary. An empty result, NaN, ±Inf, a value out of its range, a sample older than
``staleness_seconds``, a failed or timed-out query: each makes the affected value ``None`` and adds a human reason to
``stale_reasons``; nothing is ever read as zero, and ``observe`` never raises. Several series for one GPU (one
dcgm-exporter scraped more than once) are copies of one reading: read as one GPU (see ``_COPY_CHOICE``). What leaves
the scaling metric usable but incomplete (ready pods without a sample while others have one; fewer pods reporting
than the Deployment's ready replicas; an answer carrying ``warnings``, Thanos/Mimir's partial response; the SLO
guard's latency missing, or NaN while requests wait) goes to ``partial_reasons`` instead: the core then forbids a
scale-down but not a scale-up. Per-service overrides must be self-contained expressions (balanced brackets, no
comment, one line), so that none can leave its ``label_replace`` wrapper and tag series as another service, and
(``confine_overrides_to_namespace``) must select only their own namespace's series, so that no tenant reads
another's with the controller's credentials.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
import threading
import time as _time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from autoscaler.adapters.prometheus_settings import (
    DEFAULT_LATENCY_QUERY,
    OVERRIDE_PLACEHOLDERS,
    SERVICE_LATENCY_QUERY,
    SERVICE_PLACEHOLDERS,
    PrometheusSettings,
    duration,
)
from autoscaler.adapters.promql import (
    POD_NAME_MAX_LENGTH,
    POD_TO_DEPLOYMENT_RE,
    PromQLError,
    check_confined,
    check_self_contained,
    check_template,
    deployment_pods_re,
    matcher,
    pod_names_may_be_cut,
    render,
    selector,
    string_literal,
)
from autoscaler.core.cluster import ClusterSnapshot, PodInfo
from autoscaler.core.model import GpuSample, MetricKind, Observation, PodMetrics, ServiceObservation, ServicePolicy
from autoscaler.policy import QueriesSpec
from autoscaler.ports import PortError, Series

log = logging.getLogger(__name__)

# Label the adapter adds to tag results: the service of a batched override, the age of a stale DCGM sample.
SERVICE_TAG = "autoscaler_service"
AGE_TAG = "autoscaler_sample_age"

_POD_RE = re.compile(POD_TO_DEPLOYMENT_RE)
# generateName keeps at most 58 characters of "<replicaset>-" and appends 5 random ones (names are <= 63).
_TRUNCATED_POD_NAME_LENGTH = POD_NAME_MAX_LENGTH
_MAX_EXAMPLES = 3  # pods named in one stale reason; the rest are counted
_MAX_REASON_CHARS = 500  # reasons end up in Events and logs
_MAX_COPY_LABEL_SETS = 16  # sets of labels in which copies of DCGM series differ, each logged once
# HTTP statuses of an overloaded or absent backend: retried, and never a reason to re-ask query by query
_OUTAGE_STATUSES = (429, 502, 503, 504)


class Family(StrEnum):
    """One instant query per family per tick."""

    GPU_UTIL = "gpu_util"
    ENGINE_ACTIVE = "engine_active"
    FB_USED = "fb_used"
    FB_FREE = "fb_free"
    REQUEST_RATE = "request_rate"
    QUEUE_DEPTH = "queue_depth"
    LATENCY = "latency"


GPU_FAMILIES = (Family.GPU_UTIL, Family.ENGINE_ACTIVE, Family.FB_USED, Family.FB_FREE)
APP_FAMILIES = (Family.REQUEST_RATE, Family.QUEUE_DEPTH, Family.LATENCY)
# Families every dcgm-exporter exports by default; a GPU without one of them is a partial answer. Engine activity
# needs DCGM profiling (not on every GPU, off in some setups), so its absence is not a fault.
_REQUIRED_GPU_FAMILIES = (Family.GPU_UTIL, Family.FB_USED, Family.FB_FREE)
# dcgm-exporter scraped more than once (a ServiceMonitor beside a PodMonitor, the prometheus.io/scrape job beside
# either, Prometheus replicas behind a Thanos querier that does not deduplicate) answers every DCGM family with one
# series per GPU per scrape, differing only in the scrape's labels (job, service, endpoint, prometheus_replica...).
# They are copies of one device-level reading (the key names the GPU, its MIG instance and the pod), sampled at other
# instants; they are read as one GPU with the copy that never scales down by accident:
_COPY_CHOICE: dict[Family, Callable[[list[float]], float]] = {
    # the scaling signals (PodMetrics.metric_sum / target): the largest copy asks for the most replicas, so a copy
    # scraped before a burst, reading low, is never the reason for a scale-down
    Family.GPU_UTIL: max,
    Family.ENGINE_ACTIVE: max,
    # memory scales nothing in the core (GpuSample only: `autoscaler observe`, whoever packs by memory): the most
    # used and the least free promise no room the GPU may not have
    Family.FB_USED: max,
    Family.FB_FREE: min,
}
_RANGES: dict[Family, tuple[float, float]] = {
    Family.GPU_UTIL: (0.0, 100.0),
    Family.ENGINE_ACTIVE: (0.0, 1.0),
    Family.FB_USED: (0.0, math.inf),
    Family.FB_FREE: (0.0, math.inf),
    Family.REQUEST_RATE: (0.0, math.inf),
    Family.QUEUE_DEPTH: (0.0, math.inf),
    Family.LATENCY: (0.0, math.inf),
}
_OVERRIDE_FIELDS: dict[Family, str] = {
    Family.REQUEST_RATE: "request_rate",
    Family.QUEUE_DEPTH: "queue_depth",
    Family.LATENCY: "latency",
}
_SCALING_FAMILY: dict[MetricKind, Family] = {
    MetricKind.GPU_UTILIZATION: Family.GPU_UTIL,
    MetricKind.ENGINE_ACTIVE: Family.ENGINE_ACTIVE,
    MetricKind.REQUEST_RATE: Family.REQUEST_RATE,
    MetricKind.QUEUE_DEPTH: Family.QUEUE_DEPTH,
}
HISTORY_SIGNALS: dict[str, Family] = {
    "gpu_utilization": Family.GPU_UTIL,
    "engine_active": Family.ENGINE_ACTIVE,
    "request_rate": Family.REQUEST_RATE,
    "queue_depth": Family.QUEUE_DEPTH,
    "latency": Family.LATENCY,
    "latency_s": Family.LATENCY,
}


@dataclass(frozen=True, slots=True)
class TickStats:
    """What the last ``observe`` cost, for the controller's own metrics and the benchmark."""

    queries: int
    failed_queries: int
    series: int
    seconds: float


@dataclass(frozen=True, slots=True)
class PrometheusInfo:
    url: str
    version: str | None


# ---- value validation ----------------------------------------------------------------------------------------------


def parse_value(raw: object, family: Family) -> tuple[float | None, str | None]:
    """A sample value as Prometheus encodes it (a string; "NaN", "+Inf"...) -> (value, None) or (None, problem)."""
    if type(raw) is str or (type(raw) in (int, float)):  # exact types: a JSON true must not pass as 1
        try:
            value = float(raw)  # type: ignore[arg-type]
        except ValueError:
            return None, f"value {str(raw)[:40]!r} is not a number"
    else:
        return None, f"value of type {type(raw).__name__} is not a number"
    lo, hi = _RANGES[family]
    if lo <= value <= hi and value != math.inf:  # the common case first; NaN fails every comparison
        return value, None
    if math.isnan(value):
        return None, "value is NaN"
    if math.isinf(value):
        return None, f"value is {'+' if value > 0 else '-'}Inf"
    bound = f"{lo:g}..{hi:g}" if hi < math.inf else f">= {lo:g}"
    return None, f"value {value:g} outside {bound}"


@dataclass(slots=True)
class _Sample:
    labels: dict[str, str]
    value: float | None
    problem: str | None


@dataclass(slots=True)
class _FamilyResult:
    """The parsed answer to one family's query (or the reason it has none)."""

    family: Family
    samples: list[_Sample] = field(default_factory=list)
    ages: list[tuple[dict[str, str], float]] = field(default_factory=list)  # DCGM series older than the bound
    error: str | None = None
    warnings: list[str] = field(default_factory=list)  # the answer's own: it may be partial (Thanos, Mimir...)


def parse_vector(raw: object, family: Family, now: float, staleness_s: float) -> _FamilyResult:
    """Parse an instant-vector ``result`` list. Never raises: malformed input becomes errors or sample problems."""
    out = _FamilyResult(family)
    if not isinstance(raw, list):
        out.error = f"unexpected answer: result is {type(raw).__name__}, not a vector"
        return out
    samples = out.samples
    oldest, newest = now - staleness_s, now + staleness_s
    for entry in raw:
        labels = entry.get("metric") if type(entry) is dict else None
        if type(labels) is not dict:
            out.error = "unexpected answer: result items are not series (scalar or string result?)"
            return out
        # The decoded JSON is ours and used once: no copy. Labels are strings per the API; a value that is not (a
        # broken relabelling proxy) is dropped, so that the series spoils only itself (a number as ``pod`` raised
        # TypeError in the pod-name parsing, and every service of the tick held on "metrics adapter error").
        for label_value in labels.values():
            if type(label_value) is not str:
                labels = {k: v for k, v in labels.items() if type(v) is str}
                break
        pair = entry.get("value")
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            shape = "a range vector" if "values" in entry else "no value"
            out.samples.append(_Sample(labels, None, f"unexpected sample shape ({shape})"))
            continue
        ts, raw_value = pair
        if AGE_TAG in labels:
            del labels[AGE_TAG]
            age, _ = parse_value(raw_value, Family.FB_USED)  # any non-negative finite number
            out.ages.append((labels, age if age is not None else math.inf))
            continue
        value, problem = parse_value(raw_value, family)
        if problem is None:
            if type(ts) not in (int, float) or not math.isfinite(ts):
                value, problem = None, f"timestamp {ts!r} is not a number"
            elif ts < oldest:
                # Prometheus answers at the time we ask for; an older answer is a cache or a proxy ignoring ?time=.
                value, problem = None, f"answer evaluated {now - ts:.0f}s before the tick (> {staleness_s:g}s)"
            elif ts > newest:
                # The same proxy when the tick is in the past (`plan --time`, `observe --time`): an answer about a
                # later time than the one asked for is not the tick's either.
                value, problem = None, f"answer evaluated {ts - now:.0f}s after the time asked for (> {staleness_s:g}s)"
        samples.append(_Sample(labels, value, problem))
    return out


# ---- pods to services ----------------------------------------------------------------------------------------------


def deployment_of_pod(pod: str) -> str | None:
    """``chat-7d9f8b6c5-x2x4z`` -> ``chat``; None when the name is not a Deployment pod's."""
    m = _POD_RE.fullmatch(pod)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=4096)
def _deployment_pods(deployment: str) -> re.Pattern[str]:
    """The names generateName can give the pods of ``deployment`` (see ``deployment_pods_re``), compiled."""
    return re.compile(deployment_pods_re(deployment))


def _owning_deployment(pod: PodInfo) -> str | None:
    """The Deployment a pod belongs to, from its controller owner.

    The Kubernetes reader resolves a ReplicaSet owner to its Deployment (``owner_kind="Deployment"``); a snapshot
    built elsewhere may still name the ReplicaSet ``<deployment>-<pod-template-hash>``. Both must count, or the
    ready pods without a sample go unseen and a partial answer looks complete.
    """
    if not pod.owner_name:
        return None
    if pod.owner_kind == "Deployment":
        return pod.owner_name
    if pod.owner_kind == "ReplicaSet":
        return pod.owner_name.rsplit("-", 1)[0]
    return None


class PodMapper:
    """Which managed service a pod belongs to, and which of its pods the cluster says are ready.

    With a cluster snapshot, a pod's owner ReplicaSet (``<deployment>-<hash>``) names its Deployment and the pod's
    readiness is known. Without one, the pod name is parsed; a name cut to 63 characters by ``generateName`` (a
    Deployment name of more than 46 characters) goes to the longest managed long name whose pods can be named so
    (``deployment_pods_re``), not to any name that merely prefixes it.
    """

    def __init__(self, services: Sequence[ServicePolicy], cluster: ClusterSnapshot | None = None) -> None:
        self._names: dict[str, dict[str, str]] = defaultdict(dict)
        for service in services:
            self._names[service.namespace][service.name] = service.key
        self._explicit: dict[tuple[str, str], str] = {}
        # pods the snapshot lists with another controller owner, or finished: never read as a service's by their
        # name (Job ``chat-v2``'s pod ``chat-v2-x2x4b`` parses as Deployment ``chat``'s)
        self._not_ours: set[tuple[str, str]] = set()
        self.ready: dict[str, set[str]] = {}
        self.unready: dict[str, set[str]] = {}
        self.replicas: dict[str, tuple[int, int]] = {}
        # GPUs each managed pod requests, by (namespace, pod): a pod reporting fewer GPU series is incomplete
        self._gpus: dict[tuple[str, str], int] = {}
        self._cache: dict[tuple[str, str], str | None] = {}
        if cluster is None:
            return
        for dep in cluster.deployments:
            key = self._names.get(dep.namespace, {}).get(dep.name)
            if key:
                self.replicas[key] = (dep.spec_replicas, dep.ready_replicas)
        for pod in cluster.pods:
            deployment = _owning_deployment(pod)
            key = self._names.get(pod.namespace, {}).get(deployment) if deployment is not None else None
            if key is None or pod.phase in ("Succeeded", "Failed"):
                if pod.owner_kind is not None or pod.phase in ("Succeeded", "Failed"):
                    self._not_ours.add((pod.namespace, pod.name))
                continue
            self._explicit[(pod.namespace, pod.name)] = key
            self._gpus[(pod.namespace, pod.name)] = pod.gpus
            if not pod.terminating:
                # As the HPA's groupPods: a pod being deleted is neither ready nor unready (counted as 0 on a
                # scale-up, a rollout's draining pods would hold the new ones back). Its samples still map to the
                # service: the requests it serves while it drains are the service's load.
                (self.ready if pod.ready else self.unready).setdefault(key, set()).add(pod.name)
            self.ready.setdefault(key, set())
            self.unready.setdefault(key, set())

    def knows_pods(self, key: str) -> bool:
        """True when the cluster snapshot listed this service's pods (then readiness comes from it)."""
        return key in self.ready

    def requested_gpus(self, namespace: str, pod: str) -> int:
        """GPUs the cluster snapshot says the pod requests; 0 when unknown (no snapshot, or not a GPU request)."""
        return self._gpus.get((namespace, pod), 0)

    def service_of(self, namespace: str | None, pod: str | None) -> str | None:
        if not namespace or not pod:
            return None
        cache_key = (namespace, pod)
        if cache_key in self._cache:
            return self._cache[cache_key]
        key = self._explicit.get(cache_key)
        names = self._names.get(namespace)
        if key is None and names and cache_key not in self._not_ours:
            deployment = deployment_of_pod(pod)
            key = names.get(deployment) if deployment else None
            if key is None and len(pod) == _TRUNCATED_POD_NAME_LENGTH:
                cut = (n for n in names if pod_names_may_be_cut(n) and _deployment_pods(n).fullmatch(pod))
                best = max(cut, key=lambda n: (len(n), n), default=None)
                key = names[best] if best else None
        self._cache[cache_key] = key
        return key

    def service_by_name(self, namespace: str | None, name: str | None) -> str | None:
        if not namespace or not name:
            return None
        return self._names.get(namespace, {}).get(name)


# ---- the adapter ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tick:
    now: float
    unreachable: str | None = None
    queries: int = 0
    failed: int = 0
    series: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # queries run on several threads


@dataclass(slots=True)
class _GpuAcc:
    node: str
    gpu: str
    uuid: str
    model: str
    namespace: str | None
    pod: str | None
    values: dict[Family, float] = field(default_factory=dict)
    problems: dict[Family, list[str]] = field(default_factory=dict)
    # a value read from the valid copies of its series while another copy was invalid: usable, but no scale-down
    notes: dict[Family, str] = field(default_factory=dict)

    def problem(self, family: Family, text: str) -> None:
        self.problems.setdefault(family, []).append(text)

    def describe(self) -> str:
        return f"GPU {self.gpu} of node {self.node}"


@dataclass(slots=True)
class _Signal:
    value: float | None
    problems: list[str]
    partial: list[str] = field(default_factory=list)  # usable, but maybe incomplete (no scale-down)


@dataclass(slots=True)
class _Answer:
    """One instant query's answer: its result and warnings, or why there is none (and the HTTP status, if any)."""

    result: Any = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    status: int | None = None


class PrometheusMetricsSource:
    """``MetricsSource`` backed by Prometheus. Build it with :func:`connect` to check the connection at start-up.

    ``service_queries`` maps a service key (``namespace/name``) to its ``spec.queries`` overrides; update it with
    :meth:`set_service_queries` when policies change.
    """

    def __init__(
        self,
        settings: PrometheusSettings,
        service_queries: Mapping[str, QueriesSpec] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.settings = settings
        self._service_queries: dict[str, QueriesSpec] = dict(service_queries or {})
        self._session = session or requests.Session()
        self._session.verify = (
            False if settings.insecure_skip_verify else (str(settings.ca_bundle) if settings.ca_bundle else True)
        )
        if settings.client_cert_file and settings.client_key_file:
            self._session.cert = (str(settings.client_cert_file), str(settings.client_key_file))
        retry = Retry(
            total=settings.retries,
            connect=settings.retries,
            read=settings.retries,
            status=settings.retries,
            backoff_factor=settings.retry_backoff_seconds,
            backoff_max=settings.timeout_seconds,
            status_forcelist=_OUTAGE_STATUSES,
            allowed_methods=None,  # the query API is read-only: retrying is always safe
            raise_on_status=False,  # hand back the last 5xx so its body ends up in the stale reason
            **_bounded_retry_after(settings.timeout_seconds),
        )
        self._pc = PrometheusConnect(
            url=settings.url,
            headers=dict(settings.extra_headers),
            retry=retry,
            session=self._session,
            timeout=settings.timeout_seconds,  # seconds; requests accepts floats
        )
        self.last_stats = TickStats(0, 0, 0, 0.0)
        # the sets of labels in which copies of one GPU's DCGM series were seen to differ, each logged once
        self._copy_labels_logged: set[tuple[str, ...]] = set()

    # -- configuration ------------------------------------------------------------------------------------------

    def set_service_queries(self, service_queries: Mapping[str, QueriesSpec]) -> None:
        """Replace the per-service query overrides (call when GPUScalingPolicies change); ``ValueError`` naming the
        service first (``<namespace>/<name>: spec.queries.<field>: <why>``) for one that a tick would refuse, so
        that its policy is InvalidSpec from the start rather than its service held on stale data at every tick.

        Checked as the tick checks it, rendered for its service, but with the settings' ``{quantile}``: the
        policy's own is not handed over, and it changes only the length of the text (``too complex``).
        """
        trusted = self._template_values()
        for key, spec in service_queries.items():
            namespace, _, service = key.partition("/")
            for name, query in _override_items(spec):
                try:
                    validate_service_query(query)
                    self._rendered_override(query, trusted, namespace, service)
                except PromQLError as exc:
                    raise ValueError(f"{key}: spec.queries.{name}: {exc}") from None
        self._service_queries = dict(service_queries)

    def close(self) -> None:
        self._session.close()

    # -- start-up check -----------------------------------------------------------------------------------------

    def check(self) -> PrometheusInfo:
        """Prove Prometheus answers queries with these settings; raise ``PortError`` with a readable message if not."""
        url = self.settings.url
        headers, auth = self._credentials()  # PortError when a token/password file is missing
        try:
            self._pc.headers = headers
            self._pc.auth = auth
            result = self._pc.custom_query("vector(1)")
        except requests.exceptions.SSLError as exc:
            raise PortError(f"Prometheus at {url}: TLS error ({_short(exc)}); check ca_bundle") from None
        except requests.exceptions.Timeout:
            raise PortError(
                f"Prometheus at {url} did not answer within {self.settings.timeout_seconds:g}s (timeout_seconds)"
            ) from None
        except requests.exceptions.ConnectionError as exc:
            raise PortError(f"cannot reach Prometheus at {url}: {_short(exc)}") from None
        except PrometheusApiClientException as exc:
            status = _status_of(exc)
            if status in (401, 403):
                raise PortError(
                    f"Prometheus at {url} refused the credentials (HTTP {status}); check bearer_token_file / "
                    "basic_auth_*"
                ) from None
            raise PortError(f"Prometheus at {url} failed a test query: {_short(exc)}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PortError(f"{url} does not look like the Prometheus HTTP API: {_short(exc)}") from None
        except requests.RequestException as exc:
            raise PortError(f"cannot query Prometheus at {url}: {_short(exc)}") from None
        if not isinstance(result, list) or not result:
            raise PortError(f"{url} answered the test query 'vector(1)' with {result!r}; is it Prometheus?")
        version = None
        try:
            answer = self._session.get(
                f"{url}/api/v1/status/buildinfo",
                headers=headers,
                auth=auth,
                verify=self._session.verify,
                timeout=self.settings.timeout_seconds,
            )
            if answer.ok:
                version = answer.json().get("data", {}).get("version")
        except (requests.RequestException, ValueError, AttributeError):
            pass  # Thanos/Mimir may not serve buildinfo; the query above already proved the API works
        return PrometheusInfo(url=url, version=version)

    # -- one tick -----------------------------------------------------------------------------------------------

    def observe(
        self, services: Sequence[ServicePolicy], now: float, *, cluster: ClusterSnapshot | None = None
    ) -> Observation:
        """Every service and GPU at ``now``. Never raises: problems become ``None`` values and stale reasons.

        ``cluster`` (optional) supplies spec/ready replicas and pod readiness; without it replicas are 0 and every
        pod with a DCGM sample counts as ready.
        """
        started = _time.perf_counter()
        unique = list({s.key: s for s in services}.values())
        try:
            tick = _Tick(now=now)
            self._pc.headers, self._pc.auth = self._credentials()
        except PortError as exc:
            tick = _Tick(now=now, unreachable=str(exc))
        try:
            observation = self._observe(unique, tick, PodMapper(unique, cluster))
        except Exception as exc:  # a bug here must not stop the controller: hold everything and say why
            log.exception("observe failed")
            reason = f"metrics adapter error: {_short(exc)}"
            observation = Observation(
                time=now, services={s.key: ServiceObservation(s.key, 0, 0, stale_reasons=(reason,)) for s in unique}
            )
        self.last_stats = TickStats(tick.queries, tick.failed, tick.series, _time.perf_counter() - started)
        stale = [o for o in observation.services.values() if o.stale_reasons]
        if stale:
            log.warning(
                "metrics stale for %d of %d services (first: %s: %s)",
                len(stale),
                len(observation.services),
                stale[0].key,
                stale[0].stale_reasons[0],
            )
        return observation

    def _observe(self, services: list[ServicePolicy], tick: _Tick, mapper: PodMapper) -> Observation:
        # Utilisation goes first and alone: when Prometheus is down or slow we learn it for the price of one request
        # and skip the rest. The others then run concurrently, so Prometheus evaluates one answer while we parse
        # another (at 40,000 GPUs on 2 cores: 12.6 s -> about 9 s per tick).
        results = {Family.GPU_UTIL: self._family_query(Family.GPU_UTIL, tick)}
        rest = [f for f in (*GPU_FAMILIES, *APP_FAMILIES) if f is not Family.GPU_UTIL and f is not Family.LATENCY]
        # Services whose pods' names may be cut have their latency asked over their own pods (batched as well).
        own = [s for s in services if self._asks_own_latency(s)]
        own_keys = {s.key for s in own}
        # One latency query per quantile the other services' SLOs apply to (spec.latency.quantile); usually one.
        default_q = self.settings.latency_quantile
        quantiles = sorted({s.latency_quantile or default_q for s in services if s.key not in own_keys}) or [default_q]
        with ThreadPoolExecutor(self.settings.max_concurrent_queries, thread_name_prefix="prometheus") as pool:
            pending = {family: pool.submit(self._family_query, family, tick) for family in rest}
            pending_q = {q: pool.submit(self._family_query, Family.LATENCY, tick, q) for q in quantiles}
            pending_overrides = {f: pool.submit(self._override_results, f, services, tick) for f in APP_FAMILIES}
            pending_own = pool.submit(self._own_latency_results, own, tick) if own else None
            results.update({family: future.result() for family, future in pending.items()})
            latency_results = {q: future.result() for q, future in pending_q.items()}
            overrides = {family: future.result() for family, future in pending_overrides.items()}
            own_latency = pending_own.result() if pending_own is not None else {}

        gpus = self._assemble_gpus(results)
        by_service: dict[str, dict[str, list[_GpuAcc]]] = defaultdict(lambda: defaultdict(list))
        for acc in gpus:
            key = mapper.service_of(acc.namespace, acc.pod)
            if key is not None and acc.pod is not None:
                by_service[key][acc.pod].append(acc)
        latency_by_q = {q: self._app_by_service(r, mapper) for q, r in latency_results.items()}
        additive = (Family.REQUEST_RATE, Family.QUEUE_DEPTH)
        app = {family: self._app_by_service(results[family], mapper) for family in additive}

        out: dict[str, ServiceObservation] = {}
        for service in services:
            key = service.key
            reasons: list[str] = []
            rate = self._additive_signal(Family.REQUEST_RATE, service, app, overrides, mapper)
            queue = self._additive_signal(Family.QUEUE_DEPTH, service, app, overrides, mapper)
            latency_data = latency_by_q.get(service.latency_quantile or default_q) or _AppFamily()
            latency = self._latency_signal(service, latency_data, overrides, own_latency, rate, queue)
            pods: PodMetrics | None = None
            total: float | None = None
            scaling = _SCALING_FAMILY[service.metric]
            partial: list[str] = []
            if scaling in GPU_FAMILIES:
                pods, problems = self._pod_metrics(service, scaling, by_service.get(key, {}), results, mapper)
                # With some pods' samples the metric is partial (no scale-down), without any it is unknown.
                (partial if pods is not None else reasons).extend(problems)
                if results[scaling].error is None:
                    partial += _warning_reasons(self._metric_name(scaling), results[scaling].warnings)
            else:
                signal = rate if scaling is Family.REQUEST_RATE else queue
                total = signal.value
                reasons += signal.problems
                partial += signal.partial
            if service.latency_slo_s is not None and service.slo_guard:
                # The guard's signal missing stops only what it guards: a scale-down below the SLO-safe count.
                partial += latency.problems + latency.partial
            spec, ready = mapper.replicas.get(key, (0, 0))
            out[key] = ServiceObservation(
                key=key,
                spec_replicas=spec,
                ready_replicas=ready,
                pods=pods,
                metric_total=total,
                latency_s=latency.value,
                request_rate=rate.value,
                queue_depth=queue.value,
                stale_reasons=tuple(dict.fromkeys(_clip(r) for r in reasons)),
                partial_reasons=tuple(dict.fromkeys(_clip(r) for r in partial)),
            )
        gpu_samples = tuple(self._gpu_sample(acc, results) for acc in gpus)
        return Observation(time=tick.now, services=out, gpus=gpu_samples)

    # -- queries ------------------------------------------------------------------------------------------------

    def family_query(
        self,
        family: Family,
        extra_matchers: Iterable[str] = (),
        quantile: float | None = None,
        window_s: float | None = None,
    ) -> str:
        """The PromQL of one family, for a tick (no extra matchers) or a service's history (its matchers).

        ``quantile`` fills ``{quantile}`` (a service's ``spec.latency.quantile``); None: ``latency_quantile``.
        ``window_s`` fills ``{window}`` (a history's, see :meth:`history_query`); None: ``rate_window_seconds``.
        """
        s = self.settings
        values = self._template_values(quantile, window_s)
        if family in GPU_FAMILIES:
            metric = {
                Family.GPU_UTIL: s.gpu_util_metric,
                Family.ENGINE_ACTIVE: s.engine_active_metric,
                Family.FB_USED: s.fb_used_metric,
                Family.FB_FREE: s.fb_free_metric,
            }[family]
            values.update(
                metric=metric,
                selector=selector(extra_matchers, s.dcgm_matchers),
                namespace_label=s.dcgm_namespace_label,
                pod_label=s.dcgm_pod_label,
            )
            return render(s.gpu_query, values)
        metric, template = {
            Family.REQUEST_RATE: (s.request_count_metric, s.request_rate_query),
            Family.QUEUE_DEPTH: (s.queue_depth_metric, s.queue_depth_query),
            Family.LATENCY: (s.latency_bucket_metric, s.latency_query),
        }[family]
        values.update(
            metric=metric,
            selector=selector(extra_matchers, s.app_matchers),
            namespace_label=s.app_namespace_label,
            pod_label=s.app_pod_label,
        )
        return render(template, values)

    def _family_query(self, family: Family, tick: _Tick, quantile: float | None = None) -> _FamilyResult:
        query = self.family_query(family, quantile=quantile)
        if family in GPU_FAMILIES and self.settings.check_sample_age:
            # One request returns every series and, tagged, the age of those older than the bound: exact ages for
            # the reason text at no cost in the healthy case (the right-hand side is then empty).
            bound = f"{self.settings.staleness_seconds:g}"
            query = f'({query}) or label_replace(time() - timestamp({query}) > {bound}, "{AGE_TAG}", "x", "", "")'
        answer = self._instant(query, tick)
        if answer.error is not None:
            return _FamilyResult(family, error=answer.error)
        result = parse_vector(answer.result, family, tick.now, self.settings.staleness_seconds)
        result.warnings = answer.warnings
        with tick.lock:
            tick.series += len(result.samples)
        return result

    def _instant(self, query: str, tick: _Tick) -> _Answer:
        """The answer to one instant query, or the reason there is none. Never raises; a connection failure marks
        the tick unreachable.

        The query API is called through the session directly (the same retries, credentials and TLS as the
        client's): prometheus-api-client returns only ``data.result`` and drops ``warnings``, with which Thanos,
        Mimir and Prometheus flag a partial answer under HTTP 200 and status success.
        """
        with tick.lock:
            if tick.unreachable is not None:
                return _Answer(error=tick.unreachable)
            tick.queries += 1
        url = self.settings.url
        slow = f"Prometheus at {url} did not answer within {self.settings.timeout_seconds:g}s (timeout_seconds)"
        unreachable: str | None = None
        problem: str | None = None
        status: int | None = None
        try:
            response = self._session.get(
                f"{url}/api/v1/query",
                params={"query": query, "time": _fmt_time(tick.now)},
                headers=self._pc.headers,
                auth=self._pc.auth,
                verify=self._session.verify,  # see _range
                timeout=self.settings.timeout_seconds,
            )
            if response.status_code == 200:
                body = response.json()
                if isinstance(body, dict) and body.get("status") == "success":
                    return _Answer(result=body["data"]["result"], warnings=_warnings_of(body))
                # A 200 whose body says "error" (a proxy or query frontend passing on a failed evaluation, maybe
                # with a half-built "data") is a failed query, whatever else it carries.
                status = response.status_code
                problem = f"Prometheus query failed: {_api_error(body)}"
            else:
                status = response.status_code
                # the client's wording, which the reasons (and their readers) know
                problem = f"Prometheus query failed: HTTP Status Code {status} ({_short_body(response.content)!r})"
        except requests.exceptions.Timeout:
            unreachable = slow
        except requests.exceptions.SSLError as exc:  # a ConnectionError too, but the server did answer
            unreachable = f"Prometheus at {url}: TLS error ({_short(exc)}); check ca_bundle"
        except requests.exceptions.ConnectionError as exc:
            text = _short(exc)
            unreachable = slow if "timed out" in text.lower() else f"Prometheus at {url} unreachable: {text}"
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"Prometheus answer is not the query API's JSON: {_short(exc)}"
        except requests.RequestException as exc:
            unreachable = f"Prometheus at {url}: {_short(exc)}"
        with tick.lock:
            tick.failed += 1
            if status in _OUTAGE_STATUSES and problem is not None:
                # Still overloaded or absent after the retries: asking the tick's other queries would cost each
                # of them the same retries (and Retry-After waits). Like a connection failure, it ends the tick.
                unreachable = problem
            if unreachable is not None and tick.unreachable is None:
                tick.unreachable = unreachable
            return _Answer(error=problem if problem is not None else tick.unreachable, status=status)

    def _override_results(self, family: Family, services: Sequence[ServicePolicy], tick: _Tick) -> dict[str, _Signal]:
        """Run every service's override for ``family``, batched; service key -> its single value (or problems)."""
        attr = _OVERRIDE_FIELDS[family]
        parts: list[tuple[str, str]] = []  # (service key, tagged query part)
        out: dict[str, _Signal] = {}
        trusted_by_quantile: dict[float | None, dict[str, str]] = {}  # the settings' values, per {quantile}
        for service in services:
            spec = self._service_queries.get(service.key)
            template = getattr(spec, attr, None) if spec is not None else None
            if not template:
                continue
            trusted = trusted_by_quantile.get(service.latency_quantile)
            if trusted is None:
                trusted = trusted_by_quantile[service.latency_quantile] = self._template_values(
                    service.latency_quantile
                )
            try:
                # Also checked when the policy is loaded, but the constructor takes overrides unchecked, and the
                # service's own {quantile} is known only here.
                rendered = self._rendered_override(template, trusted, service.namespace, service.name)
            except PromQLError as exc:
                out[service.key] = _Signal(None, [f"spec.queries.{_camel(attr)}: {exc}"])
                continue
            parts.append(_tagged(service.key, rendered))
        for batch in _batches(parts, self.settings.max_query_length):
            self._run_override_batch(family, batch, tick, out)
        return out

    def _rendered_override(self, template: str, trusted: Mapping[str, str], namespace: str, name: str) -> str:
        """The override ``template`` of the service ``namespace/name`` as a tick sends it, or ``PromQLError`` for
        one never to send."""
        rendered = render(template, trusted, {"namespace": namespace, "name": name})
        # The override goes inside label_replace((...)) joined with others by ``or``: one that could close the
        # wrapper could tag series as another service (which would then read this tenant's numbers).
        check_self_contained(rendered)
        self._check_confined(rendered, namespace)
        return rendered

    def _check_confined(self, rendered: str, namespace: str) -> None:
        """Raise ``PromQLError`` unless a rendered override of a service in ``namespace`` reads only that
        namespace's series (when ``confine_overrides_to_namespace``): it runs with the controller's credentials, and
        what it reads reaches the policy's status, its Events and the controller's metrics."""
        if self.settings.confine_overrides_to_namespace:
            check_confined(rendered, self.settings.app_namespace_label, namespace)

    def _asks_own_latency(self, service: ServicePolicy) -> bool:
        """True when the latency of ``service`` is asked by :meth:`service_latency_query` rather than read from the
        batched ``latency_query``: the latter is the default, which derives the Deployment from the pod name, the
        names of this Deployment's pods may be cut (more than 46 characters), and the policy has no latency
        override. An operator's own ``latency_query`` is used for every service, as documented."""
        if self.settings.latency_query != DEFAULT_LATENCY_QUERY or not pod_names_may_be_cut(service.name):
            return False
        spec = self._service_queries.get(service.key)
        return not (spec is not None and getattr(spec, _OVERRIDE_FIELDS[Family.LATENCY], None))

    def service_latency_query(self, service: ServicePolicy, window_s: float | None = None) -> str:
        """The latency quantile of one Deployment over its own pods' buckets (one series, no labels)."""
        s = self.settings
        values = self._template_values(service.latency_quantile, window_s)
        values.update(
            metric=s.latency_bucket_metric,
            selector=selector(self._own_pods(service, Family.LATENCY), s.app_matchers),
            namespace_label=s.app_namespace_label,
            pod_label=s.app_pod_label,
        )
        return render(SERVICE_LATENCY_QUERY, values)

    def _own_latency_results(self, services: Sequence[ServicePolicy], tick: _Tick) -> dict[str, _Signal]:
        """:meth:`service_latency_query` of each service, tagged and batched as the overrides are."""
        parts = [_tagged(service.key, self.service_latency_query(service)) for service in services]
        out: dict[str, _Signal] = {}
        for batch in _batches(parts, self.settings.max_query_length):
            self._run_override_batch(Family.LATENCY, batch, tick, out, what="latency")
        return out

    def _run_override_batch(
        self,
        family: Family,
        batch: list[tuple[str, str]],
        tick: _Tick,
        out: dict[str, _Signal],
        what: str | None = None,
    ) -> None:
        """Ask one batch of tagged per-service queries; ``what`` names them in reasons (default: the override)."""
        name = what or f"spec.queries.{_camel(_OVERRIDE_FIELDS[family])}"
        answer = self._instant(" or ".join(part for _, part in batch), tick)
        error = answer.error
        failed_alone = answer.status is not None and answer.status not in _OUTAGE_STATUSES
        if error is not None and len(batch) > 1 and failed_alone and tick.unreachable is None:
            # One bad override (a parse error: 400, an evaluation error: 422, a query too expensive...) must not
            # blind its neighbours: find it by asking one at a time. An outage (429/502/503/504, no answer) is not
            # the override's fault: asking again one by one would only load a struggling server further.
            for item in batch:
                self._run_override_batch(family, [item], tick, out, what)
            return
        if error is not None:
            for key, _ in batch:
                out[key] = _Signal(None, [f"{name}: {error}"])
            return
        result = parse_vector(answer.result, family, tick.now, self.settings.staleness_seconds)
        if result.error:
            for key, _ in batch:
                out[key] = _Signal(None, [f"{name}: {result.error}"])
            return
        found: dict[str, list[_Sample]] = defaultdict(list)
        for sample in result.samples:
            found[sample.labels.get(SERVICE_TAG, "")].append(sample)
        for key, _ in batch:
            samples = found.get(key, [])
            if not samples:
                out[key] = _Signal(None, [f"{name} returned no series"])
            elif len(samples) > 1:
                out[key] = _Signal(None, [f"{name} returned {len(samples)} series, expected 1"])
            elif samples[0].problem:
                out[key] = _Signal(None, [f"{name}: {samples[0].problem}"])
            else:
                out[key] = _Signal(samples[0].value, [])
            out[key].partial.extend(_warning_reasons(name, answer.warnings))

    # -- assembling ---------------------------------------------------------------------------------------------

    def _assemble_gpus(self, results: Mapping[Family, _FamilyResult]) -> list[_GpuAcc]:
        s = self.settings
        node_l, uuid_l, gpu_l, mig_l = s.node_label, s.uuid_label, s.gpu_label, s.gpu_instance_label
        ns_l, pod_l, model_l = s.dcgm_namespace_label, s.dcgm_pod_label, s.model_label
        gpus: dict[tuple[str, str, str, str, str], _GpuAcc] = {}

        def key_of(labels: Mapping[str, str]) -> tuple[str, str, str, str, str]:
            # A GPU is (its UUID, else node and index; MIG instance); the pod is part of the key because a shared
            # GPU (time-slicing, MIG) legitimately has one series per pod. The same key twice is a copy of the same
            # reading (the exporter scraped more than once; see _COPY_CHOICE). The UUID alone names a GPU: two
            # exporters reading one GPU may name the node differently (dcgm-exporter without NODE_NAME says its own
            # pod's name), and counted as two GPUs it would weigh twice in its pod's mean and stand in for a GPU of
            # that pod that did not report.
            get = labels.get
            uuid = get(uuid_l)
            node = "" if uuid else get(node_l, "")
            return (node, uuid or get(gpu_l, ""), get(mig_l, ""), get(ns_l, ""), get(pod_l, ""))

        for family in GPU_FAMILIES:
            result = results[family]
            if result.error:
                continue
            groups: dict[tuple[str, str, str, str, str], list[_Sample]] = {}
            # the series older than the bound, by GPU key (asked with the family: empty in the healthy case)
            aged: dict[tuple[str, str, str, str, str], list[tuple[dict[str, str], float]]] = defaultdict(list)
            for labels, age in result.ages:
                aged[key_of(labels)].append((labels, age))
            for sample in result.samples:
                key = key_of(sample.labels)
                found = groups.get(key)
                if found is None:
                    groups[key] = [sample]
                else:
                    found.append(sample)
            for key, samples in groups.items():
                first = samples[0]
                acc = gpus.get(key)
                if acc is None:
                    labels = first.labels
                    acc = gpus[key] = _GpuAcc(
                        node=labels.get(node_l, ""),
                        gpu=labels.get(gpu_l, ""),
                        uuid=labels.get(uuid_l, ""),
                        model=labels.get(model_l, ""),
                        namespace=key[3] or None,
                        pod=key[4] or None,
                    )
                elif not acc.model:
                    acc.model = first.labels.get(model_l, "")
                if len(samples) == 1 and key not in aged:  # the common case, kept cheap
                    if first.problem:
                        acc.problem(family, first.problem)
                    elif first.value is not None:
                        acc.values[family] = first.value
                else:
                    self._read_copies(acc, family, samples, aged.get(key, []))
        required = [f for f in _REQUIRED_GPU_FAMILIES if results[f].error is None]
        for acc in gpus.values():
            for family in required:
                if family not in acc.values and family not in acc.problems:
                    acc.problem(family, "no sample (partial answer)")
        return list(gpus.values())

    def _read_copies(
        self, acc: _GpuAcc, family: Family, samples: list[_Sample], ages: list[tuple[dict[str, str], float]]
    ) -> None:
        """The value of one GPU in ``family`` from its series: one older than the bound, or copies of one reading.

        A copy older than ``staleness_seconds`` gives way to a fresh one: it is an earlier reading of the same GPU,
        superseded (a Prometheus replica down behind Thanos leaves its copy in the lookback, older and older). The
        GPU is stale only when no copy is fresh and valid, and then says why, with the youngest age.

        A copy with an invalid value (NaN, ±Inf, out of range) beside a valid one is not dropped silently: copies
        of one exporter read alike, so it may be the GPU's newer reading or another, broken exporter's. The valid
        copies' value is used (the service is not held: it can still scale up) and the invalid copy is noted: a
        partial reason for the service (no scale-down on it) and a reason on the GPU.
        """
        bound = self.settings.staleness_seconds
        age_of: list[float | None] = [None] * len(samples)
        if ages:
            exact = {_without_name(labels): age for labels, age in ages}
            names = [_without_name(sample.labels) for sample in samples]
            age_of = [exact.get(name) for name in names]
            unmatched = [age for name, age in exact.items() if name not in names]
            if unmatched:
                # an age naming no copy exactly (a template's own labels): it may be any copy's, so that of each
                # copy without its own (with one series: what the key alone said before there were copies)
                age_of = [min(unmatched) if a is None else a for a in age_of]
        valid: list[float] = []
        invalid: list[str] = []
        problems: list[str] = []  # of the copies without a usable value, in their order ("": too old)
        old: list[float] = []
        for sample, age in zip(samples, age_of, strict=True):
            if sample.problem is not None or sample.value is None:
                text = sample.problem or "no value"
                invalid.append(text)
                problems.append(text)
            elif age is not None:
                old.append(age)
                problems.append("")
            else:
                valid.append(sample.value)
        if len(samples) > 1:
            self._log_copies(acc, samples)
        if valid:
            acc.values[family] = valid[0] if len(valid) == 1 else _COPY_CHOICE[family](valid)
            if invalid:
                acc.notes[family] = (
                    f"{len(invalid)} of {len(samples)} copies of its series{_differing_labels(samples)}: "
                    f"{'; '.join(dict.fromkeys(invalid))}; the valid copies' value used"
                )
            return
        too_old = f"last sample {min(old):.0f}s old (> staleness_seconds {bound:g})" if old else ""
        for text in dict.fromkeys(p or too_old for p in problems):
            acc.problem(family, text)

    def _log_copies(self, acc: _GpuAcc, samples: Sequence[_Sample]) -> None:
        """Say once per set of differing labels that the exporter is scraped more than once: read as one GPU, the
        copies are no fault, but they cost Prometheus twice the series and the operator may want to drop one."""
        names = _label_names_differing(samples)
        if names in self._copy_labels_logged or len(self._copy_labels_logged) >= _MAX_COPY_LABEL_SETS:
            return
        self._copy_labels_logged.add(names)
        log.warning(
            "dcgm-exporter is scraped more than once: %d series for %s (%s/%s), differing in %s; each GPU is read "
            "once (largest utilisation, engine activity and memory used, least memory free). Drop one of the "
            "scrapes (a ServiceMonitor beside a PodMonitor, the prometheus.io/scrape job) or deduplicate the "
            "Prometheus replicas (Thanos --query.replica-label)",
            len(samples),
            acc.describe(),
            acc.namespace or "-",
            acc.pod or "-",
            ", ".join(names) or "nothing",
        )

    def _gpu_sample(self, acc: _GpuAcc, results: Mapping[Family, _FamilyResult]) -> GpuSample:
        reasons: list[str] = []
        for family in GPU_FAMILIES:
            error = results[family].error
            if error is not None:
                reasons.append(f"{self._metric_name(family)}: {error}")
        for family, problems in acc.problems.items():
            reasons += [f"{self._metric_name(family)}: {p}" for p in problems]
        reasons += [f"{self._metric_name(family)}: {note}" for family, note in acc.notes.items()]
        values = acc.values
        return GpuSample(
            node=acc.node,
            gpu=acc.gpu,
            uuid=acc.uuid,
            model_name=acc.model,
            utilization=values.get(Family.GPU_UTIL),
            engine_active=values.get(Family.ENGINE_ACTIVE),
            fb_used_mib=values.get(Family.FB_USED),
            fb_free_mib=values.get(Family.FB_FREE),
            namespace=acc.namespace,
            pod=acc.pod,
            stale_reasons=tuple(dict.fromkeys(_clip(r) for r in reasons)) if reasons else (),
        )

    def _pod_metrics(
        self,
        service: ServicePolicy,
        family: Family,
        pods: Mapping[str, list[_GpuAcc]],
        results: Mapping[Family, _FamilyResult],
        mapper: PodMapper,
    ) -> tuple[PodMetrics | None, list[str]]:
        """The HPA's per-pod view of a GPU metric: mean over each pod's GPUs, ready/missing/unready counts."""
        metric = self._metric_name(family)
        error = results[family].error
        if error is not None:
            return None, [f"{metric}: {error}"]
        values: dict[str, float] = {}
        problems: dict[str, str] = {}
        noted: dict[str, str] = {}  # pods valued from the valid copies of a GPU's series, another copy invalid
        for pod, accs in pods.items():
            pod_values = []
            for acc in accs:
                if family in acc.values:
                    pod_values.append(acc.values[family])
                    if family in acc.notes and pod not in noted:
                        noted[pod] = f"{acc.describe()}: {acc.notes[family]}"
                else:
                    found = acc.problems.get(family)
                    text = found[0] if found else "no sample"
                    problems[pod] = f"{acc.describe()}: {text}"
                    break
            else:
                # dcgm-exporter leaves out a GPU it cannot read: the series is just absent from every family. A pod
                # averaged over the GPUs that did report would read as complete, so fewer GPUs than it requests
                # makes it a pod without a valid sample (partial: no scale-down), like a GPU reporting NaN.
                requested = mapper.requested_gpus(service.namespace, pod)
                if len(pod_values) < requested:
                    problems[pod] = f"series for only {len(pod_values)} of its {requested} GPUs"
                else:
                    values[pod] = sum(pod_values) / len(pod_values)
        if mapper.knows_pods(service.key):
            ready = mapper.ready[service.key]
            unready = len(mapper.unready[service.key])
            for pod in ready - values.keys() - problems.keys():
                problems[pod] = "ready pod has no GPU series (dcgm-exporter pod mapping on?)"
        else:
            ready = set(values) | set(problems)
            unready = 0
        with_metric = [pod for pod in ready if pod in values]
        missing = sorted(pod for pod in ready if pod not in values)
        reasons: list[str] = []
        if not ready:
            what = "no ready pods" if mapper.knows_pods(service.key) else f"no {metric} series for any pod"
            reasons.append(f"{metric}: {what} of {service.key}")
            return None, reasons
        reasons += _too_few_reporting(metric, len(ready), mapper, service.key)
        if missing:
            examples = ", ".join(f"{pod} ({problems[pod]})" for pod in missing[:_MAX_EXAMPLES])
            more = f" and {len(missing) - _MAX_EXAMPLES} more" if len(missing) > _MAX_EXAMPLES else ""
            reasons.append(
                f"{metric}: {len(missing)} of {len(ready)} ready pods without a valid sample: {examples}{more}"
            )
        doubted = sorted(pod for pod in with_metric if pod in noted)
        if doubted:
            examples = ", ".join(f"{pod} ({noted[pod]})" for pod in doubted[:_MAX_EXAMPLES])
            more = f" and {len(doubted) - _MAX_EXAMPLES} more" if len(doubted) > _MAX_EXAMPLES else ""
            reasons.append(
                f"{metric}: {len(doubted)} of {len(ready)} ready pods read from valid copies only (dcgm-exporter "
                f"scraped more than once, a copy invalid): {examples}{more}"
            )
        if not with_metric:
            return None, reasons  # nothing usable: no PodMetrics whose zero sum could be mistaken for idle
        metrics = PodMetrics(
            ready_with_metric=len(with_metric),
            metric_sum=sum(values[pod] for pod in with_metric),
            missing=len(missing),
            unready=unready,
        )
        return metrics, reasons

    def _app_by_service(self, result: _FamilyResult, mapper: PodMapper) -> _AppFamily:
        s = self.settings
        out = _AppFamily(error=result.error, warnings=result.warnings)
        for sample in result.samples:
            labels = sample.labels
            namespace = labels.get(s.app_namespace_label)
            key = mapper.service_by_name(namespace, labels.get(s.deployment_label))
            if key is not None:
                out.whole[key].append(sample)
                continue
            pod = labels.get(s.app_pod_label)
            key = mapper.service_of(namespace, pod)
            if key is not None and pod is not None:
                out.pods[key][pod].append(sample)
        return out

    def _additive_signal(
        self,
        family: Family,
        service: ServicePolicy,
        app: Mapping[Family, _AppFamily],
        overrides: Mapping[Family, Mapping[str, _Signal]],
        mapper: PodMapper,
    ) -> _Signal:
        """Request rate or queue depth of a whole service: its override, its Deployment-level series, or the sum
        over its pods, with every pod the cluster (or the sibling family) says should report accounted for."""
        key = service.key
        name = family.value.replace("_", " ")
        if key in overrides[family]:
            return overrides[family][key]
        data = app[family]
        if data.error is not None:
            return _Signal(None, [f"{name}: {data.error}"])
        warned = _warning_reasons(name, data.warnings)
        whole = data.whole.get(key, [])
        if whole:
            signal = _single(whole, name)
            signal.partial += warned
            return signal
        pods = data.pods.get(key, {})
        if mapper.knows_pods(key):
            expected = mapper.ready[key]
        else:
            # Without the cluster's pod list, a pod reporting the sibling family is one we expect here too.
            sibling = Family.QUEUE_DEPTH if family is Family.REQUEST_RATE else Family.REQUEST_RATE
            expected = set(app[sibling].pods.get(key, {})) if app[sibling].error is None else set()
            expected |= set(pods)
        if not pods and not expected:
            return _Signal(None, [f"{name}: no series for {key}"])
        total = 0.0
        problems: list[str] = []
        for pod in sorted(expected | set(pods)):
            samples = pods.get(pod)
            if not samples:
                if pod in expected:
                    problems.append(f"pod {pod}: no sample")
                continue
            if len(samples) > 1:
                problems.append(f"pod {pod}: {len(samples)} series{_differing_labels(samples)}")
            elif samples[0].problem:
                problems.append(f"pod {pod}: {samples[0].problem}")
            else:
                total += samples[0].value or 0.0
        if problems:
            more = f" and {len(problems) - _MAX_EXAMPLES} more" if len(problems) > _MAX_EXAMPLES else ""
            return _Signal(None, [f"{name}: {'; '.join(problems[:_MAX_EXAMPLES])}{more}"])
        return _Signal(total, [], warned + _too_few_reporting(name, len(expected | set(pods)), mapper, key))

    def _latency_signal(
        self,
        service: ServicePolicy,
        data: _AppFamily,
        overrides: Mapping[Family, Mapping[str, _Signal]],
        own: Mapping[str, _Signal],
        rate: _Signal,
        queue: _Signal,
    ) -> _Signal:
        """``data``: the latency query's answer at the service's own quantile; ``own``: the answers of
        :meth:`service_latency_query` (services whose pods' names may be cut), which come first."""
        key = service.key
        if key in overrides[Family.LATENCY]:
            signal = overrides[Family.LATENCY][key]
        elif key in own:
            signal = own[key]
        else:
            if data.error is not None:
                return _Signal(None, [f"latency: {data.error}"])
            samples = data.whole.get(key, []) or [s for v in data.pods.get(key, {}).values() for s in v]
            if not samples:
                return _Signal(None, [f"latency: no series for {key}"])
            signal = _single(samples, "latency")
            signal.partial += _warning_reasons("latency", data.warnings)
        if signal.value is None and rate.value == 0 and any("NaN" in p for p in signal.problems):
            # histogram_quantile is NaN when no request finished in the window. That is "no traffic, nothing to
            # guard" only when nothing waits either; with requests queued (or the queue unknown) the guard's
            # signal is unknown, not absent: the caller keeps it as a partial reason (no scale-down). So it is when
            # a zero or the NaN itself may be a partial answer's (a warning, replicas not reporting).
            complete = not (queue.problems or queue.partial or rate.partial or signal.partial)
            if queue.value == 0 and complete:
                return _Signal(None, [])
            if queue.value is None:
                waiting = "queue depth unknown"
            elif queue.value > 0:
                waiting = f"{queue.value:g} requests waiting"
            else:
                waiting = "the request rate, queue depth or latency answer may be partial"
            problem = f"latency: NaN with no finished requests in the window but {waiting}"
            return _Signal(None, [problem], signal.partial)
        return signal

    # -- history ------------------------------------------------------------------------------------------------

    def history_query(self, service: ServicePolicy, signal: str, step_s: float | None = None) -> str:
        """PromQL of one service's signal over time (one series); see :data:`HISTORY_SIGNALS`. ``PromQLError`` for an
        override refused as the tick refuses it (``confine_overrides_to_namespace``): it is never asked either.

        Each point of a history stands for the step ending at it (the forecaster's grid), so with a ``step_s``
        longer than ``rate_window_seconds`` the rates are taken over the step: over the tick's window, a point
        measured only the end of its step (two minutes of every hour), and traffic between the windows was never
        seen. Otherwise (and without ``step_s``: the series' identity) the text is the tick's own.
        """
        family = HISTORY_SIGNALS.get(str(getattr(signal, "value", signal)))
        if family is None:
            raise ValueError(f"unknown signal {signal!r}; one of {', '.join(HISTORY_SIGNALS)}")
        s = self.settings
        window_s = step_s if step_s is not None and step_s > s.rate_window_seconds else None
        if family in _OVERRIDE_FIELDS:
            spec = self._service_queries.get(service.key)
            template = getattr(spec, _OVERRIDE_FIELDS[family], None) if spec is not None else None
            if template:
                values = self._template_values(service.latency_quantile, window_s)
                rendered = render(template, values, {"namespace": service.namespace, "name": service.name})
                try:
                    self._check_confined(rendered, service.namespace)
                except PromQLError as exc:
                    raise PromQLError(f"spec.queries.{_camel(_OVERRIDE_FIELDS[family])}: {exc}") from None
                return rendered
        if family is Family.LATENCY and self._asks_own_latency(service):
            return self.service_latency_query(service, window_s)
        query = self.family_query(family, self._own_pods(service, family), service.latency_quantile, window_s)
        if family in GPU_FAMILIES:
            # The same quantity as PodMetrics.metric_sum: each pod's mean over its GPUs, summed over pods.
            return f"sum(avg by ({s.dcgm_namespace_label}, {s.dcgm_pod_label}) ({query}))"
        if family is Family.LATENCY:
            return query
        # The tick's per-pod series (each pod's copies already counted once, scrape_copy_labels), summed as
        # _additive_signal sums them.
        return f"sum({query})"

    def _own_pods(self, service: ServicePolicy, family: Family) -> list[str]:
        """Matchers selecting the series of the service's pods in ``family``: its namespace, and every name the
        API server's generateName can give its pods, cut to 63 characters or not (``deployment_pods_re``)."""
        s = self.settings
        if family in GPU_FAMILIES:
            ns_label, pod_label = s.dcgm_namespace_label, s.dcgm_pod_label
        else:
            ns_label, pod_label = s.app_namespace_label, s.app_pod_label
        return [matcher(ns_label, "=", service.namespace), matcher(pod_label, "=~", deployment_pods_re(service.name))]

    def history(self, service: ServicePolicy, signal: str, start: float, end: float, step_s: float) -> Series:
        """Range query of one signal, split so that no request exceeds ``max_points_per_series`` points.

        Raises ``PortError`` when Prometheus fails or the query yields several series; gaps, NaN and ±Inf points
        are left out (the forecaster sees an irregular series rather than invented values).
        """
        if step_s <= 0 or end < start:
            raise ValueError(f"need step_s > 0 and start <= end, got step {step_s}, {start}..{end}")
        query = self.history_query(service, signal, step_s)
        headers, auth = self._credentials()
        points: dict[float, float] = {}
        for chunk_start, chunk_end in chunk_range(start, end, step_s, self.settings.max_points_per_series):
            result = self._range(f"history of {service.key} {signal}", query, chunk_start, chunk_end, step_s,
                                 headers, auth)  # fmt: skip
            if not isinstance(result, list):
                raise PortError(f"history of {service.key} {signal}: unexpected answer {type(result).__name__}")
            if len(result) > 1:
                raise PortError(f"history of {service.key} {signal}: {len(result)} series, expected 1 ({query})")
            for series in result:
                for pair in series.get("values", []) if isinstance(series, dict) else []:
                    try:
                        t, v = float(pair[0]), float(pair[1])
                    except (TypeError, ValueError, IndexError):
                        continue
                    if math.isfinite(v):
                        points[t] = v
        times = tuple(sorted(points))
        return Series(times=times, values=tuple(points[t] for t in times))

    def _range(
        self, what: str, query: str, start: float, end: float, step_s: float,
        headers: dict[str, str], auth: tuple[str, str] | None,
    ) -> Any:  # fmt: skip
        """``data.result`` of one range query, through the session directly, as ``_instant`` does: the client's
        ``custom_query_range`` returned only the result, so a 200 whose body says ``status: error`` and an answer
        flagged partial (``warnings``: Thanos or Mimir with a store down) were fitted as the whole history -- a
        forecast too low, which then holds no scale-down it should. Either is now a ``PortError``: the refit keeps
        its previous fit rather than fitting a part of the demand."""
        try:
            response = self._session.get(
                f"{self.settings.url}/api/v1/query_range",
                params={"query": query, "start": _fmt_time(start), "end": _fmt_time(end), "step": _fmt_time(step_s)},
                headers=headers,
                auth=auth,
                # Given, as the client gives it: left out, requests puts REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE before
                # the session's own, and ca_bundle and insecure_skip_verify are ignored wherever that is set.
                verify=self._session.verify,
                timeout=self.settings.timeout_seconds,
            )
            if response.status_code != 200:
                raise PortError(
                    f"{what}: Prometheus query failed: HTTP Status Code {response.status_code} "
                    f"({_short_body(response.content)!r})"
                )
            body = response.json()
        except ValueError as exc:  # first: requests' JSONDecodeError is a RequestException too
            raise PortError(f"{what}: Prometheus answer is not the query API's JSON: {_short(exc)}") from None
        except requests.RequestException as exc:
            raise PortError(f"{what}: {_short(exc)}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PortError(f"{what}: Prometheus query failed: {_api_error(body)}")
        warnings = _warnings_of(body)
        if warnings:
            raise PortError(f"{what}: Prometheus answered with a warning (the answer may be partial): {warnings[0]}")
        data = body.get("data")
        if not isinstance(data, dict) or "result" not in data:
            raise PortError(f"{what}: Prometheus answer is not the query API's JSON: no data.result")
        return data["result"]

    # -- helpers ------------------------------------------------------------------------------------------------

    def _template_values(self, quantile: float | None = None, window_s: float | None = None) -> dict[str, str]:
        """The settings' trusted placeholder values, ``{quantile}`` being a service's own when it has one and
        ``{window}`` a history's when it is given."""
        values = self.settings.template_values()
        if quantile is not None:
            values["quantile"] = repr(float(quantile))
        if window_s is not None:
            values["window"] = duration(window_s)
        return values

    def _metric_name(self, family: Family) -> str:
        s = self.settings
        return {
            Family.GPU_UTIL: s.gpu_util_metric,
            Family.ENGINE_ACTIVE: s.engine_active_metric,
            Family.FB_USED: s.fb_used_metric,
            Family.FB_FREE: s.fb_free_metric,
            Family.REQUEST_RATE: s.request_count_metric,
            Family.QUEUE_DEPTH: s.queue_depth_metric,
            Family.LATENCY: s.latency_bucket_metric,
        }[family]

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        """Headers and basic auth for this tick; files are re-read so that rotated secrets are picked up."""
        s = self.settings
        headers = dict(s.extra_headers)
        auth = None
        if s.bearer_token_file is not None:
            token = _read_secret(s.bearer_token_file, "bearer_token_file")
            headers["Authorization"] = f"Bearer {token}"
        if s.basic_auth_username:
            if s.basic_auth_password_file is not None:
                password = _read_secret(s.basic_auth_password_file, "basic_auth_password_file")
            else:
                password = s.basic_auth_password.get_secret_value() if s.basic_auth_password else ""
            auth = (s.basic_auth_username, password)
        return headers, auth


@dataclass(slots=True)
class _AppFamily:
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    whole: dict[str, list[_Sample]] = field(default_factory=lambda: defaultdict(list))
    pods: dict[str, dict[str, list[_Sample]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))


def connect(
    settings: PrometheusSettings | None = None,
    *,
    service_queries: Mapping[str, QueriesSpec] | None = None,
    check: bool = True,
) -> PrometheusMetricsSource:
    """Build the adapter, failing fast (``PortError``) on a missing secret file or an unreachable Prometheus."""
    settings = settings or PrometheusSettings()
    for name in ("bearer_token_file", "basic_auth_password_file", "ca_bundle", "client_cert_file", "client_key_file"):
        path = getattr(settings, name)
        if path is not None and not Path(path).is_file():
            raise PortError(f"{name}: {path} does not exist or is not a file")
    source = PrometheusMetricsSource(settings, service_queries=service_queries)
    if check:
        source.check()
    return source


def validate_service_query(query: str) -> None:
    """Raise ``PromQLError`` unless ``query`` is a usable per-service override (call when a policy is loaded).

    Its placeholders are those an override is rendered with (``OVERRIDE_PLACEHOLDERS``), not every template's:
    ``{metric}``, ``{selector}``, ``{namespace_label}`` and ``{pod_label}`` belong to one family's default query.
    What it reads (``confine_overrides_to_namespace``) depends on the settings and the policy's namespace:
    :meth:`PrometheusMetricsSource.set_service_queries` checks that too.
    """
    check_template(query, OVERRIDE_PLACEHOLDERS, SERVICE_PLACEHOLDERS)
    check_self_contained(query)


def services_from_gpus(gpus: Iterable[GpuSample]) -> list[ServicePolicy]:
    """The Deployments that own GPU pods, as default policies (``autoscaler observe`` without ``--policy``)."""
    found: dict[tuple[str, str], ServicePolicy] = {}
    for gpu in gpus:
        deployment = deployment_of_pod(gpu.pod) if gpu.pod else None
        if gpu.namespace and deployment:
            found.setdefault((gpu.namespace, deployment), ServicePolicy(namespace=gpu.namespace, name=deployment))
    return [found[k] for k in sorted(found)]


def chunk_range(start: float, end: float, step_s: float, max_points: int) -> list[tuple[float, float]]:
    """[start, end] cut into aligned chunks of at most ``max_points`` evaluation points, none shared."""
    chunks = []
    span = (max_points - 1) * step_s
    last = start + math.floor((end - start) / step_s + 1e-9) * step_s  # the last evaluation point on the grid
    t = start
    while t <= last + 1e-9:
        chunk_end = min(t + span, last)
        chunks.append((t, chunk_end))
        t = chunk_end + step_s
    return chunks


# ---- small helpers -------------------------------------------------------------------------------------------------


def _single(samples: list[_Sample], name: str) -> _Signal:
    if len(samples) > 1:
        return _Signal(None, [f"{name}: {len(samples)} series for one service{_differing_labels(samples)}"])
    sample = samples[0]
    if sample.problem:
        return _Signal(None, [f"{name}: {sample.problem}"])
    return _Signal(sample.value, [])


def _too_few_reporting(what: str, reporting: int, mapper: PodMapper, key: str) -> list[str]:
    """A partial reason when fewer pods are accounted for than the Deployment has ready replicas.

    Pods requesting no ``nvidia.com/gpu`` (time-slicing renamed to ``nvidia.com/gpu.shared``, MIG profiles) are
    not in the cluster snapshot, and dcgm-exporter may label a shared GPU with one pod only: without this count a
    ready replica without a series would vanish silently and the rest would read as the whole service.
    """
    ready_replicas = mapper.replicas.get(key, (0, 0))[1]
    if reporting >= ready_replicas:
        return []
    return [f"{what}: {reporting} of {ready_replicas} ready replicas reporting (the others have no pod or series)"]


def _without_name(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """A series' labels as a key, without the metric name (``timestamp()`` drops it from the age series)."""
    return frozenset(item for item in labels.items() if item[0] != "__name__")


def _label_names_differing(samples: Sequence[_Sample]) -> tuple[str, ...]:
    """The label names whose values (or presence) are not the same on every series, sorted."""
    return tuple(sorted({k for s in samples for k in s.labels if len({x.labels.get(k) for x in samples}) > 1}))


def _differing_labels(samples: Sequence[_Sample]) -> str:
    names = _label_names_differing(samples)
    return f" (differing in {', '.join(names)})" if names else ""


def _batches(parts: list[tuple[str, str]], max_chars: int) -> list[list[tuple[str, str]]]:
    """``parts`` joined by `` or `` into batches of at most ``max_chars`` characters *as sent*: URL-encoded, the
    form a proxy's URL limit counts (quotes, braces, parentheses and commas take 3 characters each there, so raw
    PromQL of 8,000 characters made a URL of 12 kB and more, refused with 414 and re-asked one override at a time).
    """
    batches: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    size = 0
    for item in parts:
        extra = len(quote_plus(item[1])) + len("+or+")
        if current and size + extra > max_chars:
            batches.append(current)
            current, size = [], 0
        current.append(item)
        size += extra
    if current:
        batches.append(current)
    return batches


def _tagged(key: str, query: str) -> tuple[str, str]:
    """``(key, query)`` with the query's series labelled ``SERVICE_TAG="<key>"``, to be batched with ``or`` and read
    back per service; ``query`` must be self-contained (``check_self_contained``), or it could leave the wrapper."""
    return key, f'label_replace(({query}), "{SERVICE_TAG}", {string_literal(key)}, "", "")'


def _override_items(spec: QueriesSpec) -> list[tuple[str, str]]:
    return [(_camel(attr), q) for attr in _OVERRIDE_FIELDS.values() if (q := getattr(spec, attr, None))]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _bounded_retry_after(timeout_s: float) -> dict[str, Any]:
    """Retry-After honoured, but never longer than one request's timeout.

    A rate limiter asking for minutes (urllib3's default cap is 6 h) must cost the tick a bounded wait and a stale
    observation, not a stalled controller. urllib3 < 2.5 cannot cap it: the header is then ignored and the
    (``backoff_max``-bounded) exponential backoff applies.
    """
    if "retry_after_max" in inspect.signature(Retry.__init__).parameters:
        return {"respect_retry_after_header": True, "retry_after_max": max(1, math.ceil(timeout_s))}
    return {"respect_retry_after_header": False}


def _read_secret(path: Path, setting: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise PortError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def _status_of(exc: PrometheusApiClientException) -> int | None:
    m = re.search(r"HTTP Status Code (\d+)", str(exc))
    return int(m.group(1)) if m else None


_CAUSE = re.compile(
    r"\[Errno -?\d+\] [^'\")]+|\[SSL: \w+\] [^'\"()]*[^'\"() ]"  # "[SSL: ...] <cause>", without "(_ssl.c:...)"
    r"|Read timed out|Connection refused|Name or service not known"
)


# PromQL's info annotations ("metric might not be a counter", "histogram_quantile needed to be fixed for
# monotonicity") may be false positives by design and say nothing about missing data. Prometheus 2.47-2.53 and
# Thanos send them under "warnings" (Prometheus >= 2.54 under "infos"); read as a partial answer they would forbid
# every scale-down of a service whose counter lacks "_total" (Triton) or whose latency buckets need that fix.
_INFO_PREFIX = "PromQL info:"


def _warnings_of(body: Any) -> list[str]:
    """The ``warnings`` of a query API answer (status success, but maybe partial), as short strings; PromQL
    info annotations left out."""
    found = body.get("warnings") if isinstance(body, dict) else None
    if not found:
        return []
    items = found if isinstance(found, list) else [found]
    texts = (" ".join(str(w).split()) for w in items)
    return [w[:200] for w in texts if not w.startswith(_INFO_PREFIX)][:_MAX_EXAMPLES]


def _api_error(body: Any) -> str:
    """What a query API answer that is not a success says about itself (``errorType: error``), shortened."""
    if not isinstance(body, dict):
        return f"answer is a JSON {type(body).__name__}, not the query API's object"
    kind, error = body.get("errorType"), body.get("error")
    if not error:
        return f"answer has status {str(body.get('status'))[:40]!r} and no error"
    text = " ".join(f"{kind}: {error}".split()) if kind else " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _warning_reasons(what: str, warnings: Sequence[str]) -> list[str]:
    return [f"{what}: Prometheus answered with a warning (the answer may be partial): {w}" for w in warnings]


def _short_body(content: bytes) -> bytes:
    return content if len(content) <= 500 else content[:497] + b"..."


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, requests.exceptions.ConnectionError) and (m := _CAUSE.search(text)):
        return m.group(0)  # urllib3's wrapping repeats the URL and pool; the cause is what a human needs
    return text if len(text) <= 200 else text[:197] + "..."


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


def _fmt_time(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".")
