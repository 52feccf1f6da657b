"""deploy/ installed as the README says, for real (issue 13, item 4 in part): ``kubectl apply -k`` of the production
and the dry-run overlays against the real control plane, with the pinned kubectl that ``scripts/control-plane.sh``
builds and the admin kubeconfig. Every rendered object is created and the real admission chain accepts it: the CRD
becomes Established and serves the example policy, the Deployment's pods pass PodSecurity ``restricted`` (the
namespace enforces it), are scheduled on the kwok nodes and become Ready, RBAC objects are accepted by the RBAC API
(which refuses a grant the admin itself lacks). ``kubectl delete -k`` removes it all again.

The Prometheus Operator is not part of this control plane, and deploy/base ships a ServiceMonitor and a
PrometheusRule. The first test applies production without the operator's CRDs, as a cluster without it would: exactly
those two objects fail ("ensure CRDs are installed first") and everything else is created. The others install two
minimal stand-in CRDs for ``monitoring.coreos.com/v1`` (kind and plural, schema open) so that the overlays apply
whole as shipped: they show that the two objects are accepted by the API machinery, not that the operator would load
them (the rules themselves are checked by promtool in tests/observability).

The scheduler-extender overlay is applied too: its gpu-placement scheduler's pod passes PodSecurity ``restricted`` in
its own namespace, and the real authorizer (``kubectl auth can-i``, a SubjectAccessReview) lets the controller's
ServiceAccount patch pods in gpu-autoscaler (the leader's label) but not touch the scheduler's pods, Deployment or
ServiceAccount tokens in gpu-placement, while the scheduler's ServiceAccount may renew its Lease there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realkube.control_plane import DEFAULT_NODES, REPO, ControlPlane, find_kubectl, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

OVERLAYS = REPO / "deploy" / "overlays"
NAMESPACE = "gpu-autoscaler"
CRD = "gpuscalingpolicies.gpuautoscaler.dev"
MONITORING = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        # kubectl's discovery cache goes to $HOME/.kube/cache: a throwaway one, never the user's
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
        self.env["HOME"] = str(home)

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def render(self, overlay: Path) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.run("kustomize", str(overlay)).stdout) if d]


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    found, why = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and kubectl is unavailable: {why}", pytrace=False)
        pytest.skip(why)
    return Kubectl(found, control_plane.admin_kubeconfig, tmp_path_factory.mktemp("kubectl-home"))


def monitoring_crd(kind: str, plural: str) -> dict[str, Any]:
    """A stand-in for the Prometheus Operator's CRD: the kind is served, the spec is not checked."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def monitoring_crds(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    path = tmp_path_factory.mktemp("monitoring-crds") / "crds.yaml"
    path.write_text(yaml.safe_dump_all([monitoring_crd(k, p) for k, p in MONITORING.items()]))
    kubectl.run("apply", "-f", str(path))
    names = [f"crd/{p}.monitoring.coreos.com" for p in MONITORING.values()]
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", *names)
    try:
        yield
    finally:
        kubectl.run("delete", "--ignore-not-found", "--wait=true", "--timeout=120s", *names, check=False)


def key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def present(kubectl: Kubectl, docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """The rendered objects the API server has (one `kubectl get` per object: kinds may be unknown to it)."""
    found = set()
    for doc in docs:
        kind, namespace, name = key(doc)
        group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
        resource = f"{kind.lower()}.{group}" if group else kind.lower()
        args = ["get", resource, name, "--ignore-not-found", "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        done = kubectl.run(*args, check=False)
        if done.returncode == 0 and done.stdout.strip():
            found.add((kind, namespace, name))
    return found


def versions(kubectl: Kubectl, overlay: Path) -> dict[tuple[str, str, str], str]:
    """Per object, its generation (spec changes) where the kind keeps one, else its resourceVersion."""
    items = kubectl.json("get", "-k", str(overlay))["items"]
    return {key(i): str(i["metadata"].get("generation") or i["metadata"]["resourceVersion"]) for i in items}


def uninstall(kubectl: Kubectl, overlay: Path, namespaces: tuple[str, ...] = (NAMESPACE,)) -> None:
    kubectl.run("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true", "--timeout=180s", check=False)
    wait_for(
        f"namespaces {', '.join(namespaces)} and the CRD gone",
        lambda: (
            not any(
                kubectl.run("get", "namespace", ns, "--ignore-not-found", "-o", "name").stdout.strip()
                for ns in namespaces
            )
            and not kubectl.run("get", "crd", CRD, "--ignore-not-found", "-o", "name").stdout.strip()
        ),
        timeout_s=180,
        interval_s=1.0,
    )


def check_installed(kubectl: Kubectl, overlay: Path, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every object there, the CRD Established, the Deployment rolled out; returns the live Deployment."""
    assert present(kubectl, docs) == {key(d) for d in docs}
    # `kubectl get -k` reads back exactly the kustomization's objects
    listed = kubectl.json("get", "-k", str(overlay))["items"]
    assert sorted(key(i) for i in listed) == sorted(key(d) for d in docs)
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    # ReplicaSet -> 2 pods admitted under PodSecurity "restricted", scheduled on kwok nodes, Ready
    kubectl.run("rollout", "status", "deployment/gpu-autoscaler", "-n", NAMESPACE, "--timeout=180s", timeout=200)
    deployment: dict[str, Any] = kubectl.json("get", "deployment", "gpu-autoscaler", "-n", NAMESPACE)
    assert deployment["status"]["readyReplicas"] == 2
    pods = kubectl.json(
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/name=gpu-autoscaler,app.kubernetes.io/component=controller",
    )["items"]
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} <= {n.name for n in DEFAULT_NODES}
    assert {p["spec"]["serviceAccountName"] for p in pods} == {"gpu-autoscaler"}
    namespace = kubectl.json("get", "namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    return deployment


def the_example_policy_is_served(kubectl: Kubectl) -> None:
    """README's next step: a GPUScalingPolicy example applies (the CRD's schema admits it) and `kubectl get gsp` lists
    it with the printer columns."""
    kubectl.run("create", "namespace", "inference")
    try:
        kubectl.run("apply", "-f", str(REPO / "deploy" / "examples" / "chat-inference.yaml"))
        table = kubectl.run("get", "gsp", "-A").stdout
        assert "TARGET" in table and "MODE" in table and "chat" in table, table
    finally:
        kubectl.run("delete", "namespace", "inference", "--wait=false", check=False)


def test_production_without_the_prometheus_operator(control_plane: ControlPlane, kubectl: Kubectl) -> None:
    overlay = OVERLAYS / "production"
    for plural in MONITORING.values():
        if kubectl.run("get", "crd", f"{plural}.monitoring.coreos.com", "--ignore-not-found", "-o", "name").stdout:
            pytest.skip("the monitoring.coreos.com CRDs are installed already")
    docs = kubectl.render(overlay)
    try:
        done = kubectl.run("apply", "-k", str(overlay), check=False)
        assert done.returncode != 0
        for kind in MONITORING:
            assert f'no matches for kind "{kind}"' in done.stderr, done.stderr
        # kubectl warns (and carries on) when an object it applies was created earlier without `kubectl apply`,
        # as the CRD is when another test of the session installed it through the API: not an error of the apply.
        errors = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
        assert all("monitoring.coreos.com" in line or "ensure CRDs" in line for line in errors), done.stderr
        wanted = {key(d) for d in docs if d["kind"] not in MONITORING}
        assert present(kubectl, [d for d in docs if d["kind"] not in MONITORING]) == wanted
    finally:
        uninstall(kubectl, overlay)


def test_apply_and_delete_production(control_plane: ControlPlane, kubectl: Kubectl, monitoring_crds: None) -> None:
    overlay = OVERLAYS / "production"
    docs = kubectl.render(overlay)
    settings = dict(
        line.split("=", 1)
        for line in (overlay / "settings.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    try:
        applied = kubectl.run("apply", "-k", str(overlay))
        assert applied.stdout.count(" created") == len(docs), applied.stdout
        deployment = check_installed(kubectl, overlay, docs)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        rendered_image = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
        assert container["image"] == rendered_image[0]["image"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["AUTOSCALER_PROMETHEUS_URL"] == settings["prometheus-url"] and "AUTOSCALER_DRY_RUN" not in env
        rule = kubectl.json("get", "prometheusrule.monitoring.coreos.com", "gpu-autoscaler", "-n", NAMESPACE)
        urls = {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
        assert urls and all(u.startswith(settings["runbooks-parent-url"] + "/runbooks/") for u in urls)
        # the settings are not an object of the install
        assert not kubectl.run("get", "configmap", "-n", NAMESPACE, "install-settings", "--ignore-not-found").stdout
        the_example_policy_is_served(kubectl)
        # a second apply of the same overlay changes nothing on the server (kubectl still says "configured" for the
        # PodDisruptionBudget: its selector is patched with the "replace" strategy, so the patch is never empty)
        before = versions(kubectl, overlay)
        again = kubectl.run("apply", "-k", str(overlay))
        assert again.stdout.count(" unchanged") >= len(docs) - 1, again.stdout
        assert versions(kubectl, overlay) == before
    finally:
        uninstall(kubectl, overlay)
    assert present(kubectl, docs) == set()


def test_apply_and_delete_dry_run(control_plane: ControlPlane, kubectl: Kubectl, monitoring_crds: None) -> None:
    overlay = OVERLAYS / "dry-run"
    docs = kubectl.render(overlay)
    try:
        kubectl.run("apply", "-k", str(overlay))
        deployment = check_installed(kubectl, overlay, docs)
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["AUTOSCALER_DRY_RUN"] == "true"
        role = kubectl.json("get", "clusterrole", "gpu-autoscaler")
        writes = {
            r
            for rule in role["rules"]
            for r in rule["resources"]
            for v in rule["verbs"]
            if v not in ("get", "list", "watch")
        }
        assert writes == {"events"}
        # the real authorizer agrees: the ServiceAccount may not scale or evict
        sa = f"system:serviceaccount:{NAMESPACE}:gpu-autoscaler"
        for verb, resource, allowed in (
            ("patch", "deployments.apps --subresource=scale", "no"),
            ("create", "pods --subresource=eviction", "no"),
            ("list", "pods", "yes"),
        ):
            done = kubectl.run("auth", "can-i", verb, *resource.split(), "--as", sa, "-A", check=False)
            assert done.stdout.strip() == allowed, (verb, resource, done.stdout, done.stderr)
    finally:
        uninstall(kubectl, overlay)
    assert present(kubectl, docs) == set()


def can_i(kubectl: Kubectl, user: str, verb: str, resource: str, namespace: str) -> bool:
    """The real authorizer's answer (`kubectl auth can-i` sends a SubjectAccessReview) for `user` in `namespace`;
    `resource` may name a subresource (pods/ephemeralcontainers) and an object (leases/name)."""
    args = ["auth", "can-i", verb, resource, "--as", user, "-n", namespace]
    if "/" in resource:
        kind, rest = resource.split("/", 1)
        args[3:4] = [kind, f"--subresource={rest}"] if rest in ("ephemeralcontainers", "token") else [resource]
    done = kubectl.run(*args, check=False)
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), (args, done.stdout, done.stderr)
    return answer == "yes"


def test_apply_and_delete_scheduler_extender(
    control_plane: ControlPlane, kubectl: Kubectl, monitoring_crds: None
) -> None:
    overlay = OVERLAYS / "scheduler-extender"
    docs = kubectl.render(overlay)
    scheduler = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-placement-scheduler"
    )
    sched_ns = scheduler["metadata"]["namespace"]
    sched_account = scheduler["spec"]["template"]["spec"]["serviceAccountName"]
    namespaces = tuple(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
    assert set(namespaces) == {NAMESPACE, sched_ns}
    try:
        applied = kubectl.run("apply", "-k", str(overlay))
        assert applied.stdout.count(" created") == len(docs), applied.stdout
        check_installed(kubectl, overlay, docs)
        # the scheduler's pod: admitted under PodSecurity "restricted" in its own namespace, scheduled, Ready
        labels = kubectl.json("get", "namespace", sched_ns)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        kubectl.run("rollout", "status", "deployment/gpu-placement-scheduler", "-n", sched_ns, "--timeout=180s",
                    timeout=200)  # fmt: skip
        pods = kubectl.json("get", "pods", "-n", sched_ns, "-l", "app.kubernetes.io/name=gpu-placement-scheduler")
        assert [p["spec"]["serviceAccountName"] for p in pods["items"]] == [sched_account]

        # The controller's ServiceAccount: its pod label in its own namespace, and nothing that reaches the scheduler
        # (a pod's image is mutable: patching the scheduler's pod would run code as system:kube-scheduler).
        controller = f"system:serviceaccount:{NAMESPACE}:gpu-autoscaler"
        assert can_i(kubectl, controller, "patch", "pods", NAMESPACE)
        assert can_i(kubectl, controller, "list", "pods", NAMESPACE)
        for verb, resource in (
            ("update", "pods"),
            ("create", "pods"),
            ("patch", "pods/ephemeralcontainers"),
            ("patch", "deployments.apps"),
            ("patch", "replicasets.apps"),
            ("patch", "configmaps"),
            ("create", "serviceaccounts/token"),
            ("create", "secrets"),
            ("update", "leases.coordination.k8s.io/gpu-placement-scheduler"),
        ):
            assert not can_i(kubectl, controller, verb, resource, sched_ns), (verb, resource, sched_ns)
        # pods/patch is the base ClusterRole's (the deletion-cost marks of a scale-down's replicas, any namespace):
        # the admission policy lets the controller change only those two annotations of a pod there -- the
        # scheduler's image, its labels, anything else is refused (dry run: nothing changes either way)
        sched_pod = pods["items"][0]
        container = sched_pod["spec"]["containers"][0]["name"]
        def refused(body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            return kubectl.run(
                "patch", "pod", sched_pod["metadata"]["name"], "-n", sched_ns, "--as", controller, "--dry-run=server",
                "-p", json.dumps(body), check=False,
            )  # fmt: skip

        image = {"spec": {"containers": [{"name": container, "image": "attacker.example/miner:1"}]}}
        deadline = time.monotonic() + 30  # the policy is enforced shortly after it is created (its informers)
        while refused(image).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        for body in (image, {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}},
                     {"metadata": {"annotations": {"note": "x"}}}):  # fmt: skip
            done = refused(body)
            assert done.returncode != 0 and "gpu-autoscaler-patch-scope" in done.stderr, (body, done.stderr)
        marked = {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1",
                                               "gpuautoscaler.dev/deletion-cost-by": "gpu-autoscaler"}}}  # fmt: skip
        kubectl.run(
            "patch", "pod", sched_pod["metadata"]["name"], "-n", sched_ns, "--as", controller, "--dry-run=server",
            "--type=merge", "-p", json.dumps(marked),
        )  # fmt: skip
        # The scheduler's ServiceAccount kept what it needs after the move: its Lease in its namespace, and binding
        # pods anywhere (system:kube-scheduler, bound to the ServiceAccount of its new namespace).
        sched_user = f"system:serviceaccount:{sched_ns}:{sched_account}"
        assert can_i(kubectl, sched_user, "update", "leases.coordination.k8s.io/gpu-placement-scheduler", sched_ns)
        assert can_i(kubectl, sched_user, "create", "leases.coordination.k8s.io", sched_ns)
        assert not can_i(kubectl, sched_user, "update", "leases.coordination.k8s.io/gpu-placement-scheduler",
                         NAMESPACE)  # fmt: skip
        done = kubectl.run("auth", "can-i", "create", "pods", "--subresource=binding", "--as", sched_user, "-A",
                           check=False)  # fmt: skip
        assert done.stdout.strip() == "yes", done.stdout + done.stderr
    finally:
        uninstall(kubectl, overlay, namespaces)
    assert present(kubectl, docs) == set()
