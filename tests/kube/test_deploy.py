"""deploy/: the CRD is what the pydantic models generate, the kustomize output (base and the dry-run and production
overlays, rendered by the pinned kubectl that scripts/control-plane.sh builds) validates against the Kubernetes 1.30
schemas (strict), the production overlay renders no placeholder and takes its settings from one file, the examples
are valid policies, and RBAC allows exactly what the adapters do.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes import (
    ConditionUpdate,
    KubeClusterReader,
    KubeClusterWriter,
    MachineDeploymentNodePools,
    PolicyLoader,
    ReaderConfig,
    StatusUpdate,
    WriterConfig,
)
from autoscaler.adapters.kubernetes.crd import crd_yaml, generate_crd
from autoscaler.adapters.kubernetes.ledger import KubernetesMoveLedger
from autoscaler.adapters.kubernetes_lease import KubernetesLeaseStore, LeaseRecord
from autoscaler.policy import ENGINE_ACTIVE_TARGET_MESSAGE, GPU_UTILIZATION_TARGET_MESSAGE, GPUScalingPolicySpec
from autoscaler.ports import PortError
from autoscaler.settings import Settings
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer, validate_structural
from tests.realkube.control_plane import find_kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"
NOT_IN_K8S_SCHEMAS = {
    "ServiceMonitor": "a Prometheus Operator CRD, not part of the Kubernetes schemas",
    "PrometheusRule": "a Prometheus Operator CRD, not part of the Kubernetes schemas (tested with the rules)",
}


@functools.cache
def kubectl() -> str:
    found, why = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"kubectl is required in CI to render deploy/: {why}")
        pytest.skip(why)
    return str(found)


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "base")


@pytest.fixture(scope="module")
def dry_run() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / "dry-run")


PRODUCTION = DEPLOY / "overlays" / "production"


@pytest.fixture(scope="module")
def production() -> list[dict[str, Any]]:
    return kustomize(PRODUCTION)


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name))


def test_committed_crd_is_generated_from_the_models() -> None:
    committed = (DEPLOY / "base" / "crd-gpuscalingpolicies.yaml").read_text()
    assert committed == crd_yaml(), "run: python deploy/generate_crd.py"
    check = subprocess.run([sys.executable, str(DEPLOY / "generate_crd.py"), "--check"], capture_output=True)
    assert check.returncode == 0


def test_crd_shape() -> None:
    crd = generate_crd()
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["group"] == "gpuautoscaler.dev" and crd["spec"]["names"]["kind"] == "GPUScalingPolicy"
    assert crd["spec"]["scope"] == "Namespaced" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Target", "Mode", "Min", "Max", "Current", "Desired", "Ready", "Stale", "Reason", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # every field of the pydantic spec is in the schema, by its camelCase alias
    aliases = {f.alias or name for name, f in GPUScalingPolicySpec.model_fields.items()}
    assert set(spec["properties"]) == aliases
    assert spec["required"] == ["targetRef"]
    assert spec["properties"]["maxReplicas"]["minimum"] == 1
    target = spec["properties"]["metric"]["properties"]["target"]
    # ge=1e-06: the schema keeps > 0 (an integer is compared with a fractional minimum truncated), CEL the bound
    assert (target["minimum"], target["exclusiveMinimum"]) == (0, True)
    assert target["x-kubernetes-validations"] == [
        {"rule": "self >= 1e-06", "message": "should be greater than or equal to 1e-06"}
    ]
    rate = spec["properties"]["forecast"]["properties"]["ratePerReplica"]
    assert rate["x-kubernetes-validations"][0]["rule"] == "self >= 1e-06"
    # the parser's cross-field rules, as CEL with the parser's messages
    metric_rules = spec["properties"]["metric"]["x-kubernetes-validations"]
    assert [r["message"] for r in metric_rules] == [GPU_UTILIZATION_TARGET_MESSAGE, ENGINE_ACTIVE_TARGET_MESSAGE]
    behavior_rules = spec["properties"]["behavior"]["x-kubernetes-validations"]
    assert {r["fieldPath"] for r in behavior_rules} == {".scaleUp", ".scaleDown", ".scaleUp.stabilizationWindowSeconds"}
    assert spec["properties"]["latency"]["nullable"] is True


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        # The API server refuses at admission what validate_policy refuses (the HPA API: at least one policy).
        ({"behavior": {"scaleUp": {"policies": []}}}, "spec.behavior.scaleUp.policies", "at least 1 items"),
        ({"behavior": {"scaleDown": {"policies": []}}}, "spec.behavior.scaleDown.policies", "at least 1 items"),
        # int32, as Kubernetes replica counts and PriorityClass values
        ({"maxReplicas": 2**31}, "spec.maxReplicas", "less than or equal to 2147483647"),
        ({"minReplicas": 2**31}, "spec.minReplicas", "less than or equal to 2147483647"),
        ({"priority": 10**40}, "spec.priority", "less than or equal to 2147483647"),
        ({"priority": -(2**31) - 1}, "spec.priority", "greater than or equal to -2147483648"),
        (
            {"behavior": {"scaleUp": {"policies": [{"type": "Percent", "value": 2**31, "periodSeconds": 15}]}}},
            "spec.behavior.scaleUp.policies[0].value",
            "less than or equal to 2147483647",
        ),
        ({"maxReplicas": 2**31 - 1, "priority": -(2**31), "behavior": {"scaleUp": {"selectPolicy": "Disabled"}}},
         None, None),
    ],
)
def test_the_crd_schema_refuses_what_validation_refuses(
    spec: dict[str, Any], field: str | None, problem: str | None
) -> None:
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    doc = {
        "apiVersion": "gpuautoscaler.dev/v1alpha1",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": "x", "namespace": "n"},
        "spec": {"targetRef": {"name": "d"}, **spec},
    }
    _, errors = validate_structural(doc, schema)
    if field is None:
        assert errors == []
        return
    assert [f for f, _ in errors] == [field], errors
    assert problem is not None and problem in errors[0][1]


def _k8s_validate(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_base_renders_and_every_document_validates(base: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in base)
    assert kinds == sorted(
        [
            "Namespace",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "Deployment",
            "ResourceQuota",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ServiceMonitor",
            "PrometheusRule",
        ]
    )
    skipped = []
    for doc in base:
        if doc["kind"] in NOT_IN_K8S_SCHEMAS:
            skipped.append(doc["kind"])
            continue
        _k8s_validate(doc)
    assert sorted(skipped) == ["PrometheusRule", "ServiceMonitor"]
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    cluster_scoped |= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    namespaced = [d for d in base if d["kind"] not in cluster_scoped]
    # none rendered with a namespace (kustomize does not know the admission policy's kinds: the base takes it off)
    assert not [d["kind"] for d in base if d["kind"] in cluster_scoped and "namespace" in d["metadata"]]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"gpu-autoscaler"}


def test_servicemonitor_points_at_the_metrics_port(base: list[dict[str, Any]]) -> None:
    monitor = find(base, "ServiceMonitor")  # not in the k8s schemas: checked by hand
    service = find(base, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    assert service["spec"]["ports"][0]["name"] == "http"


def test_the_validator_catches_mistakes(base: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    dep = yaml.safe_load(yaml.safe_dump(find(base, "Deployment")))
    dep["spec"]["template"]["spec"]["serviceAccountNme"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_validate(dep)


def test_deployment_is_hardened(base: list[dict[str, Any]]) -> None:
    dep = find(base, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert dep["spec"]["replicas"] == 2
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == "gpu-autoscaler"
    env = {e["name"] for e in container["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env and "AUTOSCALER_DRY_RUN" not in env
    assert find(base, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_dry_run_overlay(dry_run: list[dict[str, Any]]) -> None:
    for doc in dry_run:
        if doc["kind"] not in NOT_IN_K8S_SCHEMAS:
            _k8s_validate(doc)
    env = {
        e["name"]: e.get("value")
        for e in find(dry_run, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["AUTOSCALER_DRY_RUN"] == "true"
    writes = {
        (g, r, v)
        for rule in find(dry_run, "ClusterRole")["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        if v in ("create", "update", "patch", "delete")
    }
    assert {r for _, r, _ in writes} == {"events"}  # a dry-run install can only report


def read_settings(path: Path = PRODUCTION / "settings.env") -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match
    return match.group(1)


# What an install must not carry: the documentation hosts (RFC 2606), angle-bracket or shouted fill-ins, :latest.
PLACEHOLDER = re.compile(
    r"example\.(com|org|net)|github\.com/example/|<[A-Za-z _-]+>|CHANGE[_ ]?ME|REPLACE[_ ]?ME|TODO|FIXME|:latest\b",
    re.IGNORECASE,
)


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def controller_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def alerts(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in find(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]


def test_production_renders_and_every_document_validates(
    production: list[dict[str, Any]], base: list[dict[str, Any]]
) -> None:
    assert sorted(d["kind"] for d in production) == sorted(d["kind"] for d in base)  # settings.env is not deployed
    for doc in production:
        if doc["kind"] not in NOT_IN_K8S_SCHEMAS:
            _k8s_validate(doc)
    dep = find(production, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # acting, two replicas of which a Lease elects one, at most one of them disrupted voluntarily
    assert "AUTOSCALER_DRY_RUN" not in controller_env(production) and dep["spec"]["replicas"] == 2
    assert find(production, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    lease_rules = find(production, "Role", "gpu-autoscaler-leader-election")["rules"]
    assert {"leases", "configmaps"} == {r for rule in lease_rules for r in rule["resources"]}
    # the move ledger: one named ConfigMap read and updated (create cannot be limited to a name)
    assert all(
        rule.get("resourceNames") == [Settings().rebalance.ledger_configmap]
        for rule in lease_rules
        if "configmaps" in rule["resources"] and set(rule["verbs"]) != {"create"}
    )
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert find(production, "ClusterRole")["rules"] == find(base, "ClusterRole")["rules"]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]


def test_production_renders_no_placeholder(production: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump_all(production)
    assert not [m.group(0) for m in PLACEHOLDER.finditer(text)]
    settings = read_settings()
    assert set(settings) == {"prometheus-url", "runbooks-parent-url"}
    # the image: a registry, a repository and a tag (or digest), set by the overlay's images: block
    overlay = yaml.safe_load((PRODUCTION / "kustomization.yaml").read_text())
    (image,) = overlay["images"]
    for c in containers(production):
        assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+(:\d+)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", c["image"])
        assert c["image"] == f"{image['newName']}:{image['newTag']}"
    # the release this repository builds (the Dockerfile installs the wheel of pyproject's version), and its runbooks
    bump = "bump deploy/overlays/production (images: newTag, settings.env runbooks-parent-url) with pyproject's version"
    assert image["newTag"] == project_version(), bump
    assert settings["runbooks-parent-url"].endswith(f"/v{project_version()}/deploy"), bump
    env = controller_env(production)
    assert env["AUTOSCALER_PROMETHEUS_URL"] == settings["prometheus-url"]
    rules = alerts(production)
    assert len(rules) >= 20
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{settings['runbooks-parent-url']}/runbooks/{rule['alert']}.md"
        assert (DEPLOY / "runbooks" / f"{rule['alert']}.md").is_file()


def test_production_settings_are_set_in_one_place(tmp_path: Path) -> None:
    """Another image, Prometheus and runbook home, written only in the overlay's images: and settings.env, reach
    every place they are used, and nothing of the defaults is left."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY / "base", copy / "base")
    shutil.copytree(PRODUCTION, copy / "overlays" / "production")
    defaults = read_settings()
    (copy / "overlays" / "production" / "settings.env").write_text(
        "# edited\n"
        "prometheus-url=http://kube-prometheus-stack-prometheus.observability.svc:9090\n"
        "runbooks-parent-url=https://git.corp.internal/platform/gpu-autoscaler/-/blob/v9.9.9/deploy\n"
    )
    kustomization = copy / "overlays" / "production" / "kustomization.yaml"
    text = kustomization.read_text()
    text = text.replace("newName: ghcr.io/gpu-autoscaler/gpu-autoscaler", "newName: registry.corp.internal/ml/gpu")
    text = text.replace(f"newTag: {project_version()}", "newTag: 9.9.9")
    kustomization.write_text(text)
    docs = kustomize(copy / "overlays" / "production")
    rendered = yaml.safe_dump_all(docs, width=1000)
    assert defaults["prometheus-url"] not in rendered and defaults["runbooks-parent-url"] not in rendered
    assert "ghcr.io" not in rendered
    assert [c["image"] for c in containers(docs)] == ["registry.corp.internal/ml/gpu:9.9.9"]
    env = controller_env(docs)
    assert env["AUTOSCALER_PROMETHEUS_URL"] == "http://kube-prometheus-stack-prometheus.observability.svc:9090"
    urls = {r["annotations"]["runbook_url"].rsplit("/", 1)[0] for r in alerts(docs)}
    assert urls == {"https://git.corp.internal/platform/gpu-autoscaler/-/blob/v9.9.9/deploy/runbooks"}


def test_examples_are_valid_policies(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    apiserver.seed(generate_crd())
    custom = client.CustomObjectsApi(api_client)
    files = sorted((DEPLOY / "examples").glob("*.yaml"))
    assert len(files) >= 3
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            GPUScalingPolicySpec.model_validate(doc["spec"])
            _, errors = validate_structural(doc, schema)
            assert errors == [], f"{path.name}: {errors}"
            ns = doc["metadata"]["namespace"]
            created = custom.create_namespaced_custom_object(
                "gpuautoscaler.dev", "v1alpha1", ns, "gpuscalingpolicies", doc
            )
            # what the API server stores (defaulted, pruned) is still the same policy
            assert GPUScalingPolicySpec.model_validate(created["spec"]) == GPUScalingPolicySpec.model_validate(
                doc["spec"]
            )


# ---- RBAC: every request the adapters make is allowed, and nothing is a wildcard ------------------------------------


def _request_permissions(server: FakeApiServer) -> set[tuple[str, str, str, str | None]]:
    """(apiGroup, resource[/subresource], verb, namespace) of every request the server saw."""
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    seen = set()
    for req in server.requests:
        parts = req.path.strip("/").split("/")
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        verb = verbs.get(req.method) or ("get" if len(rest) > 1 else "list")
        seen.add((group, resource, verb, namespace))
    return seen


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_rbac_allows_exactly_what_a_full_tick_does(
    base: list[dict[str, Any]], apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.seed(
        o.policy_crd(),
        o.podgroup_crd(),
        o.jobset_crd(),
        o.workload_crd(),
        o.machine_deployment_crd(),
        o.simple_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
        o.simple_crd("kubeflow.org", "v1", "TFJob", "tfjobs"),
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf", "namespace": "ml"}, "spec": {}},
        o.node("gpu-0"),
        o.deployment("chat", "ml"),
        o.deployment_pod("chat", 0, "ml"),
        o.pod("v0", "ml", annotations={"scheduling.k8s.io/group-name": "pg"}),
        o.podgroup("pg", "ml"),
        o.pdb("chat", "ml", selector={"app": "chat"}, disruptions_allowed=1, current=1),
        o.priority_class("p", 1),
        o.gpu_policy("chat", "ml"),
        o.gpu_policy("bad", "ml", maxReplicas=0),
        o.job("train", "ml"),
        o.jobset("js", "ml"),
        o.workload("wl", "ml"),
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "pt", "namespace": "ml"},
            "spec": {},
        },
        o.machine_deployment("burst"),
        o.machine_crd(),
        o.machine("burst-a", "burst", "gpu-0", "capi-system"),
    )
    reader = KubeClusterReader(api_client, ReaderConfig())
    writer = KubeClusterWriter(api_client, WriterConfig(reporting_instance="t"))
    writer_v1 = KubeClusterWriter(api_client, WriterConfig(reporting_instance="t", event_api="v1"))
    reader.snapshot(0)
    PolicyLoader(api_client).load()
    reads = _request_permissions(apiserver)  # what a dry-run tick does besides Events
    PolicyLoader(api_client).sync(writer, 0)
    chat_pod = o.deployment_pod("chat", 0, "ml")["metadata"]["name"]
    writer.set_pod_deletion_cost("ml", chat_pod, -1)  # a scale-down's replica chosen (get + patch)
    writer.set_pod_deletion_cost("ml", chat_pod, None)  # the mark removed
    writer.scale_deployment("ml", "chat", 3)
    writer.evict_pod("ml", "v0")
    for kind, name in (("Job", "train"), ("JobSet", "js"), ("Workload", "wl"), ("PyTorchJob", "pt"), ("TFJob", "tf")):
        writer.suspend_workload(kind, "ml", name)
        writer.resume_workload(kind, "ml", name)
    for w in (writer, writer_v1):
        for _ in range(2):  # the second one takes the dedup path: get + patch
            w.emit_event("Pod", "ml", "v0", "Preempted", "for inference")
    fresh = KubeClusterWriter(api_client, WriterConfig(reporting_instance="t"))  # no uid cached yet
    fresh.emit_event("Deployment", "ml", "chat", "MetricAboveTarget", "2 -> 3")
    fresh.emit_event("Node", "", "gpu-0", "Rebalance", "drain")
    writer.update_policy_status("ml", "chat", StatusUpdate(conditions=(ConditionUpdate("Ready", True, "Active"),)))
    nodes = MachineDeploymentNodePools(api_client, "capi-system")
    nodes.node_count("burst")
    nodes.scale("burst", 2)
    nodes.scale("burst", 1, expected=2, remove_node="gpu-0")  # marks the node's Machine, then lowers the size
    # A size write refused (422) whose mark take-back meets a conflict (the Machine controller wrote the Machine):
    # the take-back re-reads the Machine (GET) before it unmarks again (review 40: the GET was not granted).
    serve, conflicted = apiserver.handle, []

    def refuse_size_then_conflict(method: str, target: str, headers: Any, body: bytes) -> Any:
        path = target.split("?")[0]
        if method == "PATCH" and path.endswith("/scale"):
            return 422, {}, {"kind": "Status", "apiVersion": "v1", "code": 422, "reason": "Invalid"}
        if method == "PATCH" and "/machines/" in path and b"null" in (body or b"") and not conflicted:
            conflicted.append(path)
            return 409, {}, {"kind": "Status", "apiVersion": "v1", "code": 409, "reason": "Conflict"}
        return serve(method, target, headers, body)

    second = o.machine_deployment("burst-b", "capi-system", replicas=2)
    second["status"].update(replicas=2, observedGeneration=1)
    apiserver.seed(
        second, o.machine("burst-b-0", "burst-b", "gpu-1", "capi-system"),
        o.machine("burst-b-1", "burst-b", "gpu-2", "capi-system"),
    )  # fmt: skip
    monkeypatch.setattr(apiserver, "handle", refuse_size_then_conflict)
    with pytest.raises(PortError):
        nodes.scale("burst-b", 1, expected=2, remove_node="gpu-1")
    monkeypatch.setattr(apiserver, "handle", serve)
    assert conflicted, "the take-back met no conflict: the replay does not exercise its re-read"
    store = KubernetesLeaseStore(client.CoordinationV1Api(api_client), "gpu-autoscaler", "gpu-autoscaler")
    created = store.create(LeaseRecord(holder="a", lease_duration_s=15))
    store.get()
    store.update(created)
    ledger = KubernetesMoveLedger(api_client, "gpu-autoscaler", Settings().rebalance.ledger_configmap)
    ledger.read()
    ledger.write((1.0,))  # create
    ledger.write((1.0, 2.0))  # update

    cluster_rules = find(base, "ClusterRole")["rules"]
    role = find(base, "Role")
    seen = _request_permissions(apiserver)
    assert len(seen) > 20
    for group, resource, verb, namespace in sorted(seen, key=str):
        if resource in ("leases", "configmaps"):
            assert namespace == role["metadata"]["namespace"] and _allowed(role["rules"], group, resource, verb)
            # leases and the move ledger only in the own namespace
            assert not _allowed(cluster_rules, group, resource, verb)
        else:
            assert _allowed(cluster_rules, group, resource, verb), f"RBAC misses {verb} {group}/{resource}"
    # least privilege: no wildcard, no delete, nothing granted that no request used (watch aside: informers)
    granted = {
        (g, r, v)
        for rule in cluster_rules + role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert not any("*" in item for item in granted) and not any(v == "delete" for _, _, v in granted)
    used = {(g, r, v) for g, r, v, _ in seen}
    # "watch" goes with "list" so that an informer-based reader needs no RBAC change
    unused = {item for item in granted - used if item[2] != "watch"}
    assert unused == set(), f"granted but never used: {unused}"
    # the dry-run overlay can still read everything a tick reads
    dry_rules = kustomize(DEPLOY / "overlays" / "dry-run")
    dry_cluster = find(dry_rules, "ClusterRole")["rules"]
    events = {p for p in seen if p[1] == "events"}
    for group, resource, verb, _ in reads | events:
        assert _allowed(dry_cluster, group, resource, verb), f"dry-run misses {verb} {group}/{resource}"


@pytest.mark.parametrize("overlay", ["base", "overlays/dry-run", "overlays/production", "overlays/scheduler-extender"])
def test_every_namespace_used_is_rendered(overlay: str) -> None:
    """`kubectl apply -k` of an overlay creates the namespaces its objects go to (kube-system aside, which every
    cluster has): the scheduler-extender overlay's gpu-placement as well as gpu-autoscaler. A kustomization-wide
    ``namespace:`` in an overlay would also move the objects that must stay elsewhere (the scheduler's own namespace,
    its kube-system RoleBinding): the expected namespaces are checked by name."""
    docs = kustomize(DEPLOY / overlay)
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    used = {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]}
    assert used - {"kube-system"} <= namespaces
    expected = {"gpu-autoscaler", "gpu-placement"} if overlay.endswith("scheduler-extender") else {"gpu-autoscaler"}
    assert namespaces == expected
    assert used == expected | ({"kube-system"} if overlay.endswith("scheduler-extender") else set())


@pytest.mark.parametrize("overlay", ["base", "overlays/dry-run", "overlays/production", "overlays/scheduler-extender"])
def test_the_rendered_controller_environment_is_settings_the_controller_accepts(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every AUTOSCALER_* variable the manifests set is one ``autoscaler run`` starts with (a misspelt name, such
    as AUTOSCALER_PROMETHEUS__URL for AUTOSCALER_PROMETHEUS_URL, would make the deployed pod exit at start)."""
    from autoscaler.settings import load_settings

    (container,) = find(kustomize(DEPLOY / overlay), "Deployment")["spec"]["template"]["spec"]["containers"]
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert any(name.startswith("AUTOSCALER_") for name in literal)
    for name, value in literal.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()  # raises SettingsError naming the variable
    if "AUTOSCALER_PROMETHEUS_URL" in literal:
        assert settings.prometheus.url == literal["AUTOSCALER_PROMETHEUS_URL"]
