"""The training workloads that can be stopped through their spec, and the annotations this controller puts on them.

Shared by the writer (suspend / resume) and the reader (``ClusterSnapshot.workloads``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from autoscaler.adapters.kubernetes._api import KubeApiError

T = TypeVar("T")


@dataclass(frozen=True)
class WorkloadKind:
    """How to suspend and resume one kind of workload through its spec."""

    group: str
    version: str
    plural: str
    path: tuple[str, ...]  # the boolean field
    suspended_value: bool  # spec.suspend=true, or Kueue's spec.active=false
    resumed_value: bool  # spec.suspend=false, or Kueue's spec.active=true
    # Versions read and written when ``version`` is not served (404): another release of the operator. The fields
    # above mean the same in each of them.
    fallback_versions: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def versions(self) -> tuple[str, ...]:
        """Every version to try, the preferred one first."""
        return (self.version, *self.fallback_versions)


# Kinds whose controllers support suspension (the pods are deleted, the work resumes from its checkpoint later).
WORKLOAD_KINDS: dict[str, WorkloadKind] = {
    "Job": WorkloadKind("batch", "v1", "jobs", ("spec", "suspend"), True, False),
    "JobSet": WorkloadKind("jobset.x-k8s.io", "v1alpha2", "jobsets", ("spec", "suspend"), True, False),
    "PyTorchJob": WorkloadKind("kubeflow.org", "v1", "pytorchjobs", ("spec", "runPolicy", "suspend"), True, False),
    "TFJob": WorkloadKind("kubeflow.org", "v1", "tfjobs", ("spec", "runPolicy", "suspend"), True, False),
    # Kueue serves v1beta2 since 0.15 and no v1beta1 from 0.20 on: read at v1beta1 only, its Workloads vanished (404,
    # "not installed"), what we deactivated was never resumed and the Jobs it runs were suspended directly
    "Workload": WorkloadKind(
        "kueue.x-k8s.io", "v1beta1", "workloads", ("spec", "active"), False, True, fallback_versions=("v1beta2",)
    ),
}


def served_first(kind: WorkloadKind, served: str | None) -> tuple[str, ...]:
    """``kind.versions`` with ``served`` (the version the API server last answered at) moved to the front."""
    if served not in kind.versions:
        return kind.versions
    return (served, *(v for v in kind.versions if v != served))


def at_first_served(versions: Sequence[str], call: Callable[[str], T]) -> tuple[str, T]:
    """(version, answer) of ``call`` at the first of ``versions`` that answers: a 404 (a CRD not installed, a version
    not served, no such object) tries the next one; the last version's 404 is raised."""
    *earlier, last = versions
    for version in earlier:
        try:
            return version, call(version)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
    return last, call(last)


# Written in the same patch that suspends, removed in the one that resumes: only what we suspended is resumed by us.
SUSPENDED_BY_ANNOTATION = "gpuautoscaler.dev/suspended-by"
SUSPENDED_BY_VALUE = "gpu-autoscaler"
SUSPENDED_AT_ANNOTATION = "gpuautoscaler.dev/suspended-at"  # RFC 3339 UTC
# The metadata.generation our suspension produced: a later spec change (someone resumed and suspended it again by
# hand) makes the other annotations stale, and the reader then no longer reports the workload as suspended by us.
SUSPENDED_GENERATION_ANNOTATION = "gpuautoscaler.dev/suspended-generation"
OUR_ANNOTATIONS = (SUSPENDED_BY_ANNOTATION, SUSPENDED_AT_ANNOTATION, SUSPENDED_GENERATION_ANNOTATION)
# The workload's own minimum runtime before it may be stopped again (seconds), else the training rules' default.
MIN_RUNTIME_ANNOTATION = "gpuautoscaler.dev/min-runtime-seconds"


def is_suspended(obj: dict[str, Any], kind: str) -> bool:
    """Whether the workload object is suspended (Kueue: deactivated) through its spec."""
    spec = WORKLOAD_KINDS[kind]
    node: Any = obj
    for part in spec.path:
        if not isinstance(node, dict):
            return False
        node = node.get(part)
    return bool(node == spec.suspended_value)
