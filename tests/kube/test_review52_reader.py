"""Review 52: a suspended workload's pods' required anti-affinity read from its pod template.

A term's ``matchLabelKeys`` (``mismatchLabelKeys``) is merged into its labelSelector by the API server when the pod
is created (KEP-3633, MatchLabelKeysInPodAffinity, on by default since 1.31): ``key In (<the pod's value>)``
(``NotIn``). A running pod's terms are read merged; a Job's template is not a pod, and is stored unmerged. Read as its
selector alone, a template's term is wider than its pods' -- "this Job's workers one per node" becomes "one per node
with every other trainer's pods": the stand-in is kept off every node another trainer runs on, and the resume is
refused for as long as they run (the direction that refuses forever).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import PodAntiAffinityTerm, PodInfo
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
HOST = "kubernetes.io/hostname"
UID = "batch.kubernetes.io/controller-uid"


def _read(
    apiserver: FakeApiServer, api_client: client.ApiClient, term: dict[str, Any]
) -> tuple[PodAntiAffinityTerm, ...]:
    job = o.job(
        "train", "ml", gpus=4, parallelism=2, suspend=True,
        template_labels={"app": "trainer", UID: "u-train"},  # the API server's defaulting puts the uid there
    )  # fmt: skip
    job["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    apiserver.seed(job)
    (got,) = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW).workloads
    return got.pod_anti_affinity


def _pod(labels: dict[str, str]) -> PodInfo:
    return PodInfo("ml", "x", "n1", 4, 100, "Running", True, labels=labels)


def test_match_label_keys_narrow_a_templates_term_to_its_own_pods(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    term = {"labelSelector": {"matchLabels": {"app": "trainer"}}, "matchLabelKeys": [UID], "topologyKey": HOST}
    (got,) = _read(apiserver, api_client, term)
    # its own pods (the job's uid): kept apart, as the real pods are
    assert got.selects(_pod({"app": "trainer", UID: "u-train"}))
    # another trainer Job's pod: not selected by the real pods' merged term (uid In (u-train))
    assert not got.selects(_pod({"app": "trainer", UID: "u-other"}))


def test_a_match_label_key_whose_value_is_not_known_does_not_widen_the_term(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A key the template does not carry (one a controller sets per pod, or none): the real term selects fewer pods
    than its selector, by a value not known here -- the term is not kept as its wider selector."""
    term = {
        "labelSelector": {"matchLabels": {"app": "trainer"}},
        "matchLabelKeys": ["jobset.sigs.k8s.io/job-key"],
        "topologyKey": HOST,
    }
    assert not any(t.selects(_pod({"app": "trainer", UID: "u-other"})) for t in _read(apiserver, api_client, term))


def test_mismatch_label_keys_leave_the_pods_own_value_out(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """``mismatchLabelKeys: [app]``: away from the pods of every other app, not from its own."""
    term = {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
            "mismatchLabelKeys": ["app"], "topologyKey": HOST}  # fmt: skip
    (got,) = _read(apiserver, api_client, term)
    assert not got.selects(_pod({"app": "trainer"}))
    assert got.selects(_pod({"app": "chat"}))


def test_a_job_with_a_manual_selector_gets_no_job_name_labels(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The job-name labels are put on a Job's template by the API server when it generates the Job's selector --
    not with ``manualSelector: true`` (the Job controller adds none to the pods either): the pods carry the
    template's labels alone, and a term selecting job-name (an inference service kept off nodes running batch Jobs,
    ``batch.kubernetes.io/job-name Exists``) does not select them."""
    job = o.job("train", "ml", gpus=4, parallelism=2, suspend=True, template_labels={"app": "trainer"})
    job["spec"]["manualSelector"] = True
    job["spec"]["selector"] = {"matchLabels": {"app": "trainer"}}
    apiserver.seed(job)
    (got,) = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW).workloads
    assert got.pod_labels == {"app": "trainer"}
