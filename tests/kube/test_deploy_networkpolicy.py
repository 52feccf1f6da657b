"""deploy/: what the controller's NetworkPolicy lets through, evaluated on the rendered overlays the way a CNI does.

- DNS: the controller resolves Prometheus by its Service name, so every way clusters serve DNS must be reachable --
  kube-dns/CoreDNS pods, NodeLocal DNSCache (link-local 169.254.20.10 on the node's host network, or the kube-dns
  ClusterIP bound on the node in its iptables mode, or node-local-dns pods behind a CNI redirect), DNS pods labelled
  otherwise, OpenShift's dns-default (port 5353 behind the Service's 53: a policy sees the pod's port);
- Prometheus: the controller reaches it and it scrapes the controller, in the namespace settings.env's URL names, and
  an install whose Prometheus lives elsewhere changes that in the production overlay's ready patch;
- nothing else opens up (other ports, other namespaces), the API server stays reachable, and the gpu-placement
  scheduler of the scheduler-extender overlay can call the extender from its own namespace (gpu-placement) and is
  itself not isolated, while a pod labelled like it anywhere else cannot.
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.kube.test_deploy import DEPLOY, PRODUCTION, _k8s_validate, find, kustomize, read_settings

OVERLAYS = ("base", "overlays/dry-run", "overlays/production", "overlays/scheduler-extender")
NAMESPACE = "gpu-autoscaler"
SCHEDULER_NAMESPACE = "gpu-placement"  # the scheduler-extender overlay's scheduler: not the controller's namespace
CONTROLLER = {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/component": "controller"}
SCHEDULER = {"app.kubernetes.io/name": "gpu-placement-scheduler", "app.kubernetes.io/component": "scheduler"}


# ---- a NetworkPolicy evaluator (networking.k8s.io/v1 semantics, numeric ports) ---------------------------------------


@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (namespace and labels) or, with namespace None, an address that is no pod
    (a node's host network, a link-local address, a ClusterIP answered on the node, anything outside the cluster)."""

    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _namespace_labels(namespace: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace}


def _peer_matches(rule_peer: Mapping[str, Any], peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in rule_peer:
        block = rule_peer["ipBlock"]
        ip = ipaddress.ip_address(peer.ip)
        networks = [ipaddress.ip_network(block["cidr"])]
        excepted = [ipaddress.ip_network(c) for c in block.get("except") or []]
        return any(ip in n for n in networks if n.version == ip.version) and not any(
            ip in n for n in excepted if n.version == ip.version
        )
    if peer.namespace is None:  # pod and namespace selectors select pods only
        return False
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], _namespace_labels(peer.namespace)):
            return False
    elif peer.namespace != policy_namespace:
        return False
    return "podSelector" not in rule_peer or _selects(rule_peer["podSelector"], peer.labels)


def _port_matches(rule: Mapping[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    for p in ports:
        assert "port" not in p or isinstance(p["port"], int), f"named port {p['port']!r}: not evaluated here"
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p or p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


def allows(policies: list[dict[str, Any]], direction: str, pod: Peer, other: Peer, port: int, protocol: str) -> bool:
    """Whether the policies let `pod` send to (Egress) or receive from (Ingress) `other` on `port`/`protocol` (for
    Ingress, the port is `pod`'s; for Egress, `other`'s: the pod's port behind a Service, as a CNI sees it)."""
    assert pod.namespace is not None
    key = "egress" if direction == "Egress" else "ingress"
    peers_key = "to" if key == "egress" else "from"
    isolating = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and _selects(p["spec"]["podSelector"], pod.labels)
        and direction in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if peers and not any(_peer_matches(r, other, policy["metadata"]["namespace"]) for r in peers):
                continue
            if _port_matches(rule, port, protocol):
                return True
    return False


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


CONTROLLER_POD = Peer("10.0.1.5", NAMESPACE, CONTROLLER)


def controller_may_send(docs: list[dict[str, Any]], to: Peer, port: int, protocol: str = "TCP") -> bool:
    return allows(policies(docs), "Egress", CONTROLLER_POD, to, port, protocol)


def controller_may_receive(docs: list[dict[str, Any]], source: Peer, port: int, protocol: str = "TCP") -> bool:
    return allows(policies(docs), "Ingress", CONTROLLER_POD, source, port, protocol)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: kustomize(DEPLOY / overlay) for overlay in OVERLAYS}


def test_the_evaluator() -> None:
    """The evaluator on a hand-written policy: it is what the tests below rely on."""
    policy = {
        "metadata": {"namespace": "ns"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": _namespace_labels("db")}}], "ports": [{"port": 5432}]},
                {"to": [{"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.9.0/24"]}}]},
                {"to": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}]}}]},
            ],
        },
    }
    me = Peer("10.0.0.1", "ns", {"app": "a"})
    assert allows([policy], "Egress", me, Peer("10.1.0.1", "db"), 5432, "TCP")
    assert not allows([policy], "Egress", me, Peer("10.1.0.1", "db"), 5432, "UDP")
    assert not allows([policy], "Egress", me, Peer("10.1.0.1", "other"), 5432, "TCP")
    assert allows([policy], "Egress", me, Peer("10.9.1.1"), 1, "UDP")
    assert not allows([policy], "Egress", me, Peer("10.9.9.1"), 1, "UDP")
    assert allows([policy], "Egress", me, Peer("10.2.0.1", "ns", {"tier": "x"}), 80, "TCP")
    assert not allows([policy], "Egress", me, Peer("10.2.0.1", "db", {"tier": "x"}), 80, "TCP")  # own namespace only
    assert allows([policy], "Egress", Peer("10.0.0.2", "ns", {"app": "b"}), Peer("1.1.1.1"), 80, "TCP")  # not isolated
    assert allows([policy], "Ingress", me, Peer("1.1.1.1"), 80, "TCP")  # Egress-only policy
    # both selectors in one peer: that namespace's pods with those labels (two peers would be either)
    both = {"namespaceSelector": {"matchLabels": _namespace_labels("s")}, "podSelector": {"matchLabels": {"app": "x"}}}
    ingress = {
        "metadata": {"namespace": "ns"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [both]}]},
    }
    assert allows([ingress], "Ingress", me, Peer("10.3.0.1", "s", {"app": "x"}), 80, "TCP")
    assert not allows([ingress], "Ingress", me, Peer("10.3.0.1", "s", {"app": "y"}), 80, "TCP")
    assert not allows([ingress], "Ingress", me, Peer("10.3.0.1", "ns", {"app": "x"}), 80, "TCP")


# ---- DNS -----------------------------------------------------------------------------------------------------------

# Where a pod's DNS queries go (the destination address and pod port a CNI sees), by cluster setup.
DNS_SERVERS = {
    "kube-dns / CoreDNS pods": (Peer("10.0.2.10", "kube-system", {"k8s-app": "kube-dns"}), 53),
    "NodeLocal DNSCache, link-local address": (Peer("169.254.20.10"), 53),
    "NodeLocal DNSCache, iptables mode (binds the kube-dns ClusterIP on the node)": (Peer("10.96.0.10"), 53),
    "NodeLocal DNSCache pods behind a CNI redirect": (
        Peer("10.0.3.7", "kube-system", {"k8s-app": "node-local-dns"}),
        53,
    ),
    "DNS pods labelled otherwise": (Peer("10.0.2.11", "kube-system", {"k8s-app": "coredns"}), 53),
    "IPv6 node-local cache": (Peer("fd00::a"), 53),
    "OpenShift dns-default (5353 behind the Service's 53)": (
        Peer("10.128.0.5", "openshift-dns", {"dns.operator.openshift.io/daemonset-dns": "default"}),
        5353,
    ),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("setup", DNS_SERVERS)
@pytest.mark.parametrize("protocol", ["UDP", "TCP"])
def test_the_controller_can_resolve_names(
    overlay: str, setup: str, protocol: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Every DNS lookup of the controller (Prometheus's Service name first) must get through whichever way the
    cluster serves DNS; UDP and TCP (large answers fall back to TCP)."""
    server, port = DNS_SERVERS[setup]
    assert controller_may_send(rendered[overlay], server, port, protocol), f"{overlay}: DNS to {setup} is blocked"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dns_opens_nothing_else(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered[overlay]
    kube_dns = DNS_SERVERS["kube-dns / CoreDNS pods"][0]
    assert not controller_may_send(docs, kube_dns, 9153)  # CoreDNS's metrics
    assert not controller_may_send(docs, Peer("203.0.113.9"), 5353, "UDP")  # mDNS port: only OpenShift's DNS pods
    assert not controller_may_send(docs, Peer("10.0.4.4", "default", {"app": "x"}), 5353, "UDP")
    assert not controller_may_send(docs, Peer("10.0.4.4", "openshift-dns", {"app": "x"}), 8080)
    for port, protocol in [(80, "TCP"), (8080, "TCP"), (123, "UDP"), (9090, "TCP")]:
        assert not controller_may_send(docs, Peer("203.0.113.9"), port, protocol), (port, protocol)


# ---- Prometheus and the API server ---------------------------------------------------------------------------------


def url_namespace(url: str) -> str | None:
    """The namespace of an in-cluster Service URL (http://<service>.<namespace>.svc[.cluster.local]:port)."""
    host = urlsplit(url).hostname or ""
    parts = host.split(".")
    return parts[1] if len(parts) >= 3 and parts[2] == "svc" else None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_and_the_controller_reach_each_other(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """As shipped: Prometheus in the namespace (and on the port) of settings.env's URL, which the controller
    queries and which scrapes the controller's /metrics on 8080; not from or to any other namespace."""
    docs = rendered[overlay]
    url = read_settings()["prometheus-url"]
    namespace = url_namespace(url)
    port = urlsplit(url).port
    assert namespace == "monitoring" and port == 9090
    prometheus = Peer("10.0.5.5", namespace, {"app.kubernetes.io/name": "prometheus"})
    assert controller_may_send(docs, prometheus, port)
    assert controller_may_receive(docs, prometheus, 8080)
    elsewhere = Peer("10.0.6.6", "team-a", {"app.kubernetes.io/name": "prometheus"})
    assert not controller_may_send(docs, elsewhere, port)
    assert not controller_may_receive(docs, elsewhere, 8080)
    assert not controller_may_receive(docs, prometheus, 8081)  # the extender is the scheduler's only


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_server_stays_reachable(overlay: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    for port in (443, 6443):
        assert controller_may_send(rendered[overlay], Peer("172.20.0.1"), port)


# ---- the production overlay: where Prometheus runs -----------------------------------------------------------------


def prometheus_patch_ops(kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON6902 operations of the production overlay's patch of the NetworkPolicy."""
    patches = [
        p
        for p in kustomization.get("patches") or []
        if (p.get("target") or {}).get("kind") == "NetworkPolicy" and "patch" in p
    ]
    assert len(patches) == 1, "deploy/overlays/production/kustomization.yaml has no NetworkPolicy patch to edit"
    ops = yaml.safe_load(patches[0]["patch"])
    assert isinstance(ops, list)
    return ops


def test_the_production_overlay_documents_where_prometheus_runs() -> None:
    """The overlay says "Everything to set is here": the namespace and port of Prometheus in the NetworkPolicy are
    set there, in a patch whose values restate the defaults (so it is ready to edit)."""
    text = (PRODUCTION / "kustomization.yaml").read_text()
    header = text.split("apiVersion:", 1)[0]
    assert "NetworkPolicy" in header and "patches:" in header
    ops = prometheus_patch_ops(yaml.safe_load(text))
    values = {op["path"]: op["value"] for op in ops if op["op"] == "replace"}
    assert len(values) == len(ops) == 3
    assert sorted(map(str, values.values())) == ["9090", "monitoring", "monitoring"]


def test_a_prometheus_elsewhere_is_one_edit_of_the_production_overlay(tmp_path: Path) -> None:
    """Prometheus in "observability" behind a Thanos querier on 10902: the values of the production overlay's patch
    (and settings.env's URL) are all there is to change, and every overlay built on it follows."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY / "base", copy / "base")
    for overlay in ("production", "dry-run", "scheduler-extender"):
        shutil.copytree(DEPLOY / "overlays" / overlay, copy / "overlays" / overlay)
    (copy / "overlays" / "production" / "settings.env").write_text(
        "prometheus-url=http://thanos-query.observability.svc:10902\n"
        + "".join(f"{k}={v}\n" for k, v in read_settings().items() if k != "prometheus-url")
    )
    path = copy / "overlays" / "production" / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    ops = prometheus_patch_ops(kustomization)
    for op in ops:
        op["value"] = {"monitoring": "observability", 9090: 10902}[op["value"]]
    (patch,) = [p for p in kustomization["patches"] if p["target"]["kind"] == "NetworkPolicy"]
    patch["patch"] = yaml.safe_dump(ops)
    path.write_text(yaml.safe_dump(kustomization))
    thanos = Peer("10.0.7.7", "observability", {"app.kubernetes.io/name": "thanos-query"})
    old = Peer("10.0.5.5", "monitoring", {"app.kubernetes.io/name": "prometheus"})
    for overlay in ("production", "dry-run", "scheduler-extender"):
        docs = kustomize(copy / "overlays" / overlay)
        _k8s_validate(find(docs, "NetworkPolicy"))
        assert controller_may_send(docs, thanos, 10902), overlay
        assert controller_may_receive(docs, thanos, 8080), overlay
        assert not controller_may_send(docs, old, 9090) and not controller_may_receive(docs, old, 8080), overlay
        assert controller_may_send(docs, Peer("169.254.20.10"), 53, "UDP"), overlay


# ---- the scheduler-extender overlay --------------------------------------------------------------------------------


def test_the_gpu_placement_scheduler_reaches_the_extender_and_is_not_isolated(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The gpu-placement scheduler calls http://gpu-autoscaler-extender.gpu-autoscaler.svc:8081 (DNS, then the
    controller's pod port 8081) from its own namespace, watches the API server and is probed by the kubelet: no
    policy of the overlay isolates its pods, and the controller's admits it on 8081 only."""
    docs = rendered["overlays/scheduler-extender"]
    dep = find(docs, "Deployment", "gpu-placement-scheduler")
    assert dep["metadata"]["namespace"] == SCHEDULER_NAMESPACE
    scheduler = Peer("10.0.8.8", SCHEDULER_NAMESPACE, SCHEDULER)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels.items() >= SCHEDULER.items()
    assert not [p for p in policies(docs) if _selects(p["spec"]["podSelector"], labels)]
    assert controller_may_receive(docs, scheduler, 8081)
    assert not controller_may_receive(docs, scheduler, 8080)
    for overlay in ("base", "overlays/production"):
        assert not controller_may_receive(rendered[overlay], scheduler, 8081)  # no extender there
    for port, protocol in [(53, "UDP"), (53, "TCP"), (443, "TCP"), (8081, "TCP")]:
        assert allows(policies(docs), "Egress", scheduler, Peer("169.254.20.10"), port, protocol)


@pytest.mark.parametrize("namespace", [NAMESPACE, "default", "team-a"])
def test_a_pod_labelled_like_the_scheduler_elsewhere_is_not_admitted(
    namespace: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The rule admits the scheduler's labels in the scheduler's namespace only: anyone may label a pod of their own
    namespace gpu-placement-scheduler, and the controller's namespace holds no scheduler (its pods' images are
    writable by the controller's Role); nor does another pod of gpu-placement get in."""
    docs = rendered["overlays/scheduler-extender"]
    assert not controller_may_receive(docs, Peer("10.0.8.9", namespace, SCHEDULER), 8081)
    assert not controller_may_receive(docs, Peer("10.0.8.10", SCHEDULER_NAMESPACE, {"app": "other"}), 8081)
