"""Plumbing shared by the Kubernetes adapters: error mapping, bounded read retries, JSON calls, pagination, times.

Why raw JSON (``_preload_content=False`` + ``json.loads``) instead of the client's typed models: the generated
models validate every field with pydantic, which costs ~6x more per page of 500 pods (benchmarks/bench_kube.py)
and rejects objects the server itself accepts (a pod without containers, an event without eventTime). The paths,
verbs, auth and error handling are still the official client's.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from autoscaler.ports import PortError, WriteGuard, WriteNotAllowed

log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")

# The content type of a JSON merge patch (RFC 7386): what every partial write of these adapters sends.
MERGE_PATCH = "application/merge-patch+json"

# Statuses worth retrying for a read: throttling (APF 429) and server-side trouble. 4xx otherwise mean the request
# itself is wrong and retrying cannot help.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class KubeApiError(PortError):
    """The API server answered with an error status."""

    def __init__(self, what: str, status: int, reason: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{what}: HTTP {status} {reason}: {message}" if message else f"{what}: HTTP {status} {reason}")
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s

    @classmethod
    def from_exception(cls, what: str, exc: ApiException) -> KubeApiError:
        reason, message = str(exc.reason or ""), ""
        if exc.body:
            try:
                body = json.loads(exc.body)
                reason = body.get("reason") or reason
                message = body.get("message") or ""
            except (ValueError, AttributeError):
                message = str(exc.body)[:200]
        retry_after = None
        headers = exc.headers or {}
        value = headers.get("Retry-After") if hasattr(headers, "get") else None
        if value:
            try:
                retry_after = float(value)
            except ValueError:
                retry_after = None  # an HTTP-date (the apiserver sends seconds): our own backoff instead
            if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
                retry_after = None  # "-5", "nan": no duration; handed to time.sleep it raised ValueError
        error_cls = ConflictError if exc.status == 409 else cls
        return error_cls(what, int(exc.status or 0), reason, message, retry_after)

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES


class ConflictError(KubeApiError):
    """409: the object changed since it was read (or already exists); retries on a fresh read were exhausted."""


class KubeUnavailable(PortError):
    """No answer: connection refused or reset, DNS, TLS, or the request timed out."""


class UnsupportedWorkloadError(PortError):
    """The workload kind cannot be suspended through its spec (e.g. a Volcano Job): evict its pods instead."""


def call_json(what: str, fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> JSON:
    """Call a generated client method and return the JSON body; map every failure to a PortError subclass."""
    try:
        response = fn(*args, _preload_content=False, _request_timeout=timeout_s, **kwargs)
        data = response.data
    except ApiException as exc:
        raise KubeApiError.from_exception(what, exc) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    if not data:
        return {}
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise KubeApiError(what, 200, "BadResponse", f"response is not JSON: {data[:100]!r}") from exc
    return parsed if isinstance(parsed, dict) else {"items": parsed}


# The time (``clock()``) after which no retry of a read starts, for the job running in this context (a tick): its
# reads each retry a bounded number of times, but a tick makes many of them, and several answering only on their last
# try would outlast the tick's liveness bound (/healthz, the livenessProbe restarting the controller through an API
# server that is only flaky). Past the deadline a failed read fails at once; the tick holds, as on any failed read.
_retry_deadline: contextvars.ContextVar[tuple[float, Callable[[], float]] | None] = contextvars.ContextVar(
    "kubernetes_read_retry_deadline", default=None
)


@contextlib.contextmanager
def read_retry_deadline(deadline: float, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Within the block, a read's retry (``with_read_retries``) starts only if its backoff sleep ends by
    ``deadline`` (in ``clock()``'s time; ``time.monotonic`` by default)."""
    token = _retry_deadline.set((deadline, clock))
    try:
        yield
    finally:
        _retry_deadline.reset(token)


def _past_retry_deadline(delay_s: float) -> bool:
    bound = _retry_deadline.get()
    return bound is not None and bound[1]() + delay_s > bound[0]


def with_read_retries(
    what: str,
    op: Callable[[], T],
    *,
    retries: int,
    backoff_s: float,
    max_backoff_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run a read, retrying throttling, 5xx and transport errors a bounded number of times (fewer once the running
    job's ``read_retry_deadline`` is near: the error is raised instead of a retry that would end after it).

    Only for reads: a write that timed out may have happened, so writes are retried by the caller after a fresh
    read (or left to the next tick), never blindly here.
    """
    attempt = 0
    while True:
        failure: PortError
        try:
            return op()
        except KubeApiError as exc:
            if not exc.retryable or attempt >= retries:
                raise
            delay = exc.retry_after_s if exc.retry_after_s is not None else backoff_s * 2**attempt
            failure = exc
        except KubeUnavailable as exc:
            if attempt >= retries:
                raise
            delay = backoff_s * 2**attempt
            failure = exc
        wait = min(delay, max_backoff_s)
        if _past_retry_deadline(wait):
            log.info("%s: not retried: the tick's time for read retries is spent", what)
            raise failure
        attempt += 1
        log.debug("%s: retry %d/%d in %.2fs", what, attempt, retries, wait)
        sleep(wait)


class Pager:
    """``limit``/``continue`` pagination of one list, with a consistent restart when a token expires (410)."""

    def __init__(
        self,
        *,
        page_size: int,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        max_backoff_s: float,
        max_restarts: int = 2,
        sleep: Callable[[float], None] = time.sleep,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        self.page_size = page_size
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_restarts = max_restarts
        self.sleep = sleep
        self.on_call = on_call

    def items(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[JSON]:
        """Every item of the list, or an exception: never a partial list (a partial pod list would look like free
        GPUs and could drive a wrong decision)."""
        return self.converted(what, _as_is, fn, *args, **kwargs)[0]

    def converted(
        self, what: str, convert: Callable[[JSON], T | None], fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> tuple[list[T], int]:
        """Every item of the list through ``convert`` (an item it maps to None is left out), and how many items the
        list had; or an exception, never a partial list. Each page is converted as it arrives and its raw JSON
        dropped: a cluster's pod list is a few KiB per pod, and held whole until the last page it was most of a
        snapshot's memory (20,000 pods: the raw list, then the converted pods beside it)."""
        restarts = 0
        while True:
            out: list[T] = []
            seen = 0
            try:
                for item in self._pages(what, fn, *args, **kwargs):
                    seen += 1
                    value = convert(item)
                    if value is not None:
                        out.append(value)
                return out, seen
            except KubeApiError as exc:
                # 410: the snapshot behind the continue token is gone; only a list from scratch is consistent.
                if exc.status != 410:
                    raise
                if restarts >= self.max_restarts:
                    whole = self._whole(what, fn, *args, **kwargs)
                    return [v for v in map(convert, whole) if v is not None], len(whole)
                restarts += 1
                log.info("%s: continue token expired, restarting the list (%d/%d)", what, restarts, self.max_restarts)

    def _whole(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[JSON]:
        """The list in one request, as client-go's pager does once its pages keep expiring (``FullListIfExpired``):
        they take longer than the API server keeps the list's revision (a very large cluster, a slow API server), so
        every paged restart would expire the same way and every tick would hold. One request is consistent by
        itself; it costs the API server and this process a whole list in memory at once."""
        log.warning(
            "%s: the continue token expired %d times: listing in one request instead of pages of %d",
            what,
            self.max_restarts + 1,
            self.page_size,
        )
        return list(self._request(what, fn, args, kwargs).get("items") or [])

    def _request(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> JSON:
        """One list request (a page, or the whole list), with the bounded read retries."""

        def fetch() -> JSON:
            if self.on_call is not None:
                self.on_call()
            return call_json(what, fn, *args, timeout_s=self.timeout_s, **kwargs)

        return with_read_retries(
            what,
            fetch,
            retries=self.retries,
            backoff_s=self.backoff_s,
            max_backoff_s=self.max_backoff_s,
            sleep=self.sleep,
        )

    def _pages(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[JSON]:
        token: str | None = None
        while True:
            page_kwargs = dict(kwargs, limit=self.page_size)
            if token:
                page_kwargs["_continue"] = token
            page = self._request(what, fn, args, page_kwargs)
            token = (page.get("metadata") or {}).get("continue")
            items = list(page.get("items") or [])
            del page  # only ``items`` holds the page's objects now: each is freed once the caller has converted it
            items.reverse()
            while items:
                yield items.pop()  # in list order, and no longer referenced here
            if not token:
                return


def _as_is(item: JSON) -> JSON:
    return item


def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2024-01-01T00:00:00Z``, fractional seconds allowed) or Unix seconds -> Unix seconds; None when
    unset, unreadable or not finite."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number if math.isfinite(number) else None  # "nan", "inf", "1e400": no time
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_time(seconds: float) -> str:
    """Unix seconds -> RFC 3339 ``metav1.Time`` (whole seconds, UTC)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(seconds: float) -> str:
    """Unix seconds -> ``metav1.MicroTime`` (what events.k8s.io/v1 ``eventTime`` requires)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_write(what: str, can_write: WriteGuard | None) -> None:
    """Ask the write guard immediately before a request that changes something (or that only serves one); raise
    ``WriteNotAllowed`` instead of sending it: a replica that may have lost the Lease sends nothing more."""
    if can_write is not None and not can_write():
        log.info("%s: not sent: the write guard refused (not the leader any more?)", what)
        raise WriteNotAllowed(
            f"{what}: not written: not the leader any more (the write guard refused just before the request)"
        )
