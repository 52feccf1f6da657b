"""deploy/ as a platform engineer meets it: what the rendered overlays do on a real cluster beyond validating.

- the dry-run overlay writes nothing but Events and its own Lease (no ConfigMap: a dry run never keeps a move ledger);
- the Lease rules name the Lease the rendered controller uses (not every Lease of the namespace), and the
  scheduler-extender overlay's gpu-placement scheduler keeps its own Lease in its own namespace, out of the reach
  of the controller's Roles;
- the PodDisruptionBudget never blocks a node drain on a replica that is not Ready anyway;
- the two replicas never share a node when another one can take them, and a rollout cannot deadlock on that rule;
- the memory request and limit cover what README.md and benchmarks/README.md document.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import yaml

from autoscaler.app import lease_name
from autoscaler.settings import DRY_RUN_LEASE_SUFFIX, ForecastSettings, LeaderElectionSettings, Settings, load_settings
from tests.kube.test_deploy import DEPLOY, NOT_IN_K8S_SCHEMAS, _k8s_validate, find, kustomize

OVERLAYS = ("base", "overlays/dry-run", "overlays/production", "overlays/scheduler-extender")
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: kustomize(DEPLOY / overlay) for overlay in OVERLAYS}


def controller_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", "gpu-autoscaler")["spec"]["template"]["spec"]
    return spec


def controller_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (container,) = controller_pod(docs)["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def rendered_settings(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the rendered controller starts with (its env through the real settings loader)."""
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    for name, value in controller_env(docs).items():
        monkeypatch.setenv(name, value)
    return load_settings()


def expected_lease(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> str:
    """The Lease name the rendered controller elects on."""
    return lease_name(rendered_settings(docs, monkeypatch))


def role_grants(docs: list[dict[str, Any]]) -> list[tuple[str, str, str, tuple[str, ...] | None]]:
    role = find(docs, "Role", "gpu-autoscaler-leader-election")
    return [
        (g, r, v, tuple(rule["resourceNames"]) if "resourceNames" in rule else None)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    ]


# ---- RBAC ----------------------------------------------------------------------------------------------------------


def test_the_dry_run_install_writes_only_events_and_its_lease(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A dry run keeps no move ledger (app._move_ledger: None when dry_run): its namespace Role must not let it
    create ConfigMaps (any name) or update the acting install's ledger. "Not even a bug can make a dry-run install
    act" is the overlay's promise."""
    docs = rendered["overlays/dry-run"]
    writes = {(g, r, v) for g, r, v, _ in role_grants(docs) if v in WRITES}
    assert {r for _, r, _ in writes} == {"leases"}, f"the dry-run Role writes {sorted(writes)}"
    cluster = find(docs, "ClusterRole", "gpu-autoscaler")["rules"]
    cluster_writes = {r for rule in cluster for r in rule["resources"] for v in rule["verbs"] if v in WRITES}
    assert cluster_writes == {"events"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_lease_reads_and_updates_name_the_controllers_lease(
    overlay: str, rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """get/update of Leases are limited to the Lease the rendered controller uses (create cannot be limited by
    name): otherwise the controller may take over any Lease of its namespace. The scheduler-extender overlay's
    gpu-placement scheduler elects on a Lease of its own namespace, where no Role of the controller's applies (not
    even create: it could take the name before the scheduler does)."""
    docs = rendered[overlay]
    lease = expected_lease(docs, monkeypatch)
    assert lease.endswith(DRY_RUN_LEASE_SUFFIX) == (overlay == "overlays/dry-run")
    for _group, resource, verb, names in role_grants(docs):
        if resource != "leases" or verb == "create":
            continue
        assert names == (lease,), f"{overlay}: {verb} leases on {names or 'every Lease'}, not only {lease!r}"
    granted = {(v, names) for g, r, v, names in role_grants(docs) if r == "leases"}
    assert {("get", (lease,)), ("update", (lease,)), ("create", None)} <= granted
    if overlay == "overlays/scheduler-extender":
        sched = find(docs, "ConfigMap")  # the scheduler's configuration names its Lease
        election = yaml.safe_load(sched["data"]["kube-scheduler-config.yaml"])["leaderElection"]
        assert election["resourceName"] == "gpu-placement-scheduler" != lease
        assert election["resourceNamespace"] == sched["metadata"]["namespace"]
        controller_roles = {
            d["metadata"]["namespace"]
            for d in docs
            if d["kind"] == "RoleBinding"
            and {"kind": "ServiceAccount", "name": "gpu-autoscaler", "namespace": "gpu-autoscaler"} in d["subjects"]
        }
        assert controller_roles == {"gpu-autoscaler"}
        assert election["resourceNamespace"] not in controller_roles


def test_the_default_lease_name_is_what_the_roles_name() -> None:
    assert LeaderElectionSettings.model_fields["lease_name"].default == "gpu-autoscaler"


# ---- disruption and placement --------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pdb_never_blocks_a_drain_on_an_unready_replica(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """minAvailable 1 of 2 with the default unhealthyPodEvictionPolicy (IfHealthyBudget): when the replicas are not
    Ready -- a crash loop on a bad setting, a leader whose first tick has not succeeded (readyz) -- the budget has no
    disruption left and `kubectl drain` of their nodes waits for ever. AlwaysAllow lets not-Ready pods go; a Ready
    replica is still protected."""
    pdb = find(rendered[overlay], "PodDisruptionBudget", "gpu-autoscaler")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
    _k8s_validate(pdb)
    dep = find(rendered[overlay], "Deployment", "gpu-autoscaler")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_replicas_never_share_a_node(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """``whenUnsatisfiable: ScheduleAnyway`` is only a score: image locality or free resources outweigh it and both
    replicas (leader and standby) land on one node, which one node failure or drain then takes down together. The
    hostname spread must be a rule, counted per ReplicaSet (``matchLabelKeys: [pod-template-hash]``: the surge pod
    of a rollout with maxUnavailable 0 is not held back by the old pods) over the nodes the pod may use
    (``nodeTaintsPolicy: Honor``: tainted GPU or control-plane nodes with no replica would otherwise count as empty
    domains and leave no node the surge pod may take)."""
    dep = find(rendered[overlay], "Deployment", "gpu-autoscaler")
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    hard = [
        c
        for c in pod.get("topologySpreadConstraints", [])
        if c["topologyKey"] == "kubernetes.io/hostname" and c["whenUnsatisfiable"] == "DoNotSchedule"
    ]
    assert len(hard) == 1, "no hard per-node spread: both replicas may run on one node"
    (spread,) = hard
    assert spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert "pod-template-hash" in spread.get("matchLabelKeys", [])
    assert spread.get("nodeTaintsPolicy") == "Honor"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    for doc in rendered[overlay]:
        if doc["kind"] == "Deployment":
            _k8s_validate(doc)


# ---- resources -----------------------------------------------------------------------------------------------------

# Documented memory figures (MB and MiB are not told apart here: the margins below are wider than the difference).
PARENT_MIB = 87  # benchmarks/README.md, refit cost: "Peak RSS: parent 87 MB"
TICK_PEAK_MIB = 90  # README.md, benchmarks: Kubernetes tick, 5,000 nodes / 20,000 pods: "90 MiB peak in the tick"
ADAPTER_PEAK_MIB = 390  # README.md: observation, 2,000 services: "adapter peak 390 MB"
WORKER_RSS_MIB = {"phase_naive": 156, "quantile_gbm": 205}  # benchmarks/README.md, bench_refit: "worker RSS"
LIMIT_HEADROOM = 1.25  # Python's allocator returns little to the OS: the limit is a ceiling, not an estimate


def quantity_mib(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|M|G)?", str(value))
    assert match, value
    factor = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20, None: 1 / 2**20}[match.group(2)]
    return float(match.group(1)) * factor


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_memory_covers_the_documented_use(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The request is what the controller uses steadily with forecasting on: the process, a tick's snapshot and the
    ``forecast.workers`` spawned fit workers of the default model (a pod using more than it requests is the first
    evicted under node memory pressure). The limit holds the documented peaks at once -- a large tick, the
    Prometheus adapter at 2,000 services and the workers fitting the heaviest model -- with headroom, or the leader
    is OOM-killed mid-tick and the standby waits out the Lease."""
    (container,) = controller_pod(rendered[overlay])["containers"]
    resources = container["resources"]
    workers = ForecastSettings.model_fields["workers"].default
    default_model = ForecastSettings.model_fields["model"].default
    steady = PARENT_MIB + TICK_PEAK_MIB + workers * WORKER_RSS_MIB[default_model]
    peak = PARENT_MIB + TICK_PEAK_MIB + ADAPTER_PEAK_MIB + workers * max(WORKER_RSS_MIB.values())
    request = quantity_mib(resources["requests"]["memory"])
    limit = quantity_mib(resources["limits"]["memory"])
    assert request >= steady, f"memory request {request:g} MiB < steady use {steady} MiB"
    assert limit >= peak * LIMIT_HEADROOM, f"memory limit {limit:g} MiB < {LIMIT_HEADROOM} x peak {peak} MiB"
    assert request <= limit


def test_every_rendered_document_still_validates(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        for doc in docs:
            if doc["kind"] not in NOT_IN_K8S_SCHEMAS:
                _k8s_validate(doc)


# ---- shutdown (a guard: consistent as shipped) ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_the_controllers_shutdown(
    overlay: str, rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM: a running tick may finish within shutdown_grace_seconds, then the Lease is released (one request of
    at most min(request timeout, renew deadline / 2), app.build_runtime), then the HTTP servers stop (a join of up
    to 5 s each). The kubelet's SIGKILL must come after that, or the Lease is never released and the standby waits
    out the lease duration."""
    settings = rendered_settings(rendered[overlay], monkeypatch)
    release = min(settings.kubernetes.request_timeout_seconds, settings.leader_election.renew_deadline_seconds / 2)
    servers = 5.0 * (1 + settings.scheduler_extender.enabled)
    budget = settings.shutdown_grace_seconds + release + servers
    assert controller_pod(rendered[overlay])["terminationGracePeriodSeconds"] >= budget


CRITICAL_CLASSES = ("system-cluster-critical", "system-node-critical")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_critical_pods_have_a_quota_that_admits_them(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """GKE (and any cluster whose ResourceQuota admission lists the system-*-critical classes as limitedResources)
    admits a pod of those classes only in a namespace holding a quota scoped to its class: without one the
    ReplicaSet's creations are refused and the Deployment never starts. The quota must hold a rollout: the replicas,
    the surge pods, and the old replicas while they terminate."""
    deployments = [d for d in rendered[overlay] if d.get("kind") == "Deployment"]
    critical = [d for d in deployments if d["spec"]["template"]["spec"].get("priorityClassName") in CRITICAL_CLASSES]
    assert critical, "the controller runs at a system-*-critical class"
    for dep in critical:
        namespace = dep["metadata"].get("namespace")
        cls = dep["spec"]["template"]["spec"]["priorityClassName"]
        quotas = [
            q
            for q in rendered[overlay]
            if q.get("kind") == "ResourceQuota"
            and q["metadata"].get("namespace") == namespace
            and any(
                e.get("scopeName") == "PriorityClass" and e.get("operator") == "In" and cls in e.get("values", [])
                for e in (q["spec"].get("scopeSelector") or {}).get("matchExpressions", [])
            )
        ]
        name = dep["metadata"]["name"]
        assert quotas, f"{overlay}: no ResourceQuota in {namespace} scoped to {cls} for Deployment {name}"
        replicas = int(dep["spec"].get("replicas", 1))
        surge = (dep["spec"].get("strategy") or {}).get("rollingUpdate", {}).get("maxSurge", "25%")
        surge = -(-replicas * int(surge[:-1]) // 100) if isinstance(surge, str) else int(surge)
        for quota in quotas:
            _k8s_validate(quota)
            assert int(quota["spec"]["hard"]["pods"]) >= 2 * replicas + surge
