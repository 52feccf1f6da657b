"""Review 40 of the kube-scheduler extender (extender_http.py, core/extender.py).

1. WRONG: a GET with a body (``curl -X GET -d @args.json``, a probe tool sending one) on a kept-alive connection was
   answered (404 on a verb's path, 200 on /healthz) with its body left unread and the connection kept: the body was
   then parsed as the next request line and the client's next request got a ``400 Bad request syntax`` echoing the
   previous body -- one answer too many, every later answer on that connection off by one. RIGHT: a request whose
   body is not read ends its connection (``Connection: close``), as POST's refusals already do.
2. WRONG: any method but POST on ``/scheduler/filter`` or ``/scheduler/prioritize`` said the path does not exist
   (GET: 404 "not found") or answered an HTML page (PUT, DELETE, PATCH, HEAD, OPTIONS: 501 from the stdlib) --
   an operator checking the Service with ``curl`` is sent looking for a wrong ``urlPrefix``. RIGHT: 405 Method Not
   Allowed with ``Allow: POST`` and a JSON ``Error`` (none to a HEAD), the connection closed when a body went
   unread.
3. WRONG: the read timeout (5 s) bounded each read of a request's request line and headers, not the whole head
   (test_extender_review bounded the body's): a client sending a header byte every 4 s held a handler thread -- and its
   connection -- for as long as it kept dripping (up to 64 KiB a line, 100 header lines). RIGHT: the head, from its
   first byte, has ``read_timeout_s`` in all; past it the connection is closed unanswered (as a silent one is).

The plain tests pin behaviour checked here that no earlier test pinned: a quantity too long for ``int`` and JSON's
non-standard ``NaN`` fail open (never a 500), a node-list request on a stale snapshot passes every item back
unchanged, a pipelined pair of POSTs on one connection gets two answers in order, and /healthz stays a 200 on GET.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo
from autoscaler.core.extender import ExtenderConfig
from autoscaler.extender_http import Extender, ExtenderServer

T = 1_700_000_000.0
A100 = "NVIDIA-A100-SXM4-80GB"


def cluster(time_: float = T) -> ClusterSnapshot:
    return ClusterSnapshot(
        time_,
        nodes=(NodeInfo("a100-0", 8, A100, None, True), NodeInfo("a100-1", 8, A100, None, True)),
        pods=(PodInfo("ml", "big", "a100-0", 7, 0, "Running", True),),
    )


def v1_pod(gpus: Any = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    }


ARGS = {"Pod": v1_pod(), "Nodes": None, "NodeNames": ["a100-1", "a100-0"]}


@pytest.fixture
def server() -> Iterator[ExtenderServer]:
    snapshot = cluster()
    served = ExtenderServer(
        Extender(lambda: snapshot, ExtenderConfig(60), clock=lambda: T + 5), "127.0.0.1", 0, read_timeout_s=0.5
    )
    served.start()
    try:
        yield served
    finally:
        served.stop()


def raw_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def exchange(port: int, data: bytes) -> list[tuple[bytes, bytes]]:
    """Send ``data`` (one or more requests) on one connection; every (head, body) answered until the server closes
    it or stops answering."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # no more requests: a server keeping the connection alive closes it at once
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
    answers: list[tuple[bytes, bytes]] = []
    while b"\r\n\r\n" in received:
        head, _, rest = received.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        answers.append((head, rest[:length]))
        received = rest[length:]
    return answers


def closes(head: bytes) -> bool:
    return b"\r\nconnection: close" in head.lower()


# ---- defects ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/scheduler/filter"])
def test_a_get_with_a_body_does_not_desynchronise_its_connection(server: ExtenderServer, path: str) -> None:
    """Fixed (was a strict xfail). Defect 1 (see the module doc): the GET's body must not become the connection's
    next request."""
    body = json.dumps(ARGS).encode()
    answers = exchange(server.port, raw_request("GET", path, body) + raw_request("POST", "/scheduler/filter", body))
    first_head = answers[0][0]
    if closes(first_head):
        return  # the client opens a new connection for its next request: nothing was misread
    assert len(answers) >= 2 and answers[1][0].startswith(b"HTTP/1.1 200"), answers[1:]


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_another_method_on_a_verbs_path_is_405_post_only(server: ExtenderServer, method: str, verb: str) -> None:
    """Fixed (was a strict xfail). Defect 2 (see the module doc)."""
    body = json.dumps(ARGS).encode() if method not in ("GET", "HEAD") else b""
    answers = exchange(server.port, raw_request(method, f"/scheduler/{verb}", body))
    head, payload = answers[0]
    assert head.startswith(b"HTTP/1.1 405"), head
    assert b"\r\nallow: post" in head.lower(), head
    if method == "HEAD":
        assert payload == b"" and len(answers) == 1
    else:
        assert "POST" in json.loads(payload)["Error"]
    assert closes(head) or not body


@pytest.mark.parametrize("where", ["request line", "headers"])
def test_a_request_head_dripped_a_byte_at_a_time_is_cut_off(where: str) -> None:
    """Fixed (was a strict xfail). Defect 3 (see the module doc): a head dripped one byte per 0.2 s, each read well
    within the 0.3 s read timeout, is cut off soon after that timeout, not left to run for as long as it drips."""
    snapshot = cluster()
    served = ExtenderServer(
        Extender(lambda: snapshot, ExtenderConfig(60), clock=lambda: T + 5), "127.0.0.1", 0, read_timeout_s=0.3
    )
    served.start()
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=2) as sock:
            drip = b"POST /scheduler/" + b"a" * 40
            if where == "headers":
                sock.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n")
                drip = b"X-Drip: " + b"a" * 40
            started = time.monotonic()
            cut_off_after: float | None = None
            for byte in drip:
                if time.monotonic() - started > 4:
                    break
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    cut_off_after = time.monotonic() - started
                    break
                readable, _, _ = select.select([sock], [], [], 0.2)
                if readable:  # the server closed it (a timed-out head gets no answer)
                    cut_off_after = time.monotonic() - started
                    break
        assert cut_off_after is not None and cut_off_after < 2.0, cut_off_after
    finally:
        served.stop()


# ---- behaviour verified and pinned --------------------------------------------------------------------------------


def test_pipelined_posts_on_one_connection_are_answered_in_order(server: ExtenderServer) -> None:
    body = json.dumps(ARGS).encode()
    answers = exchange(
        server.port, raw_request("POST", "/scheduler/prioritize", body) + raw_request("POST", "/scheduler/filter", body)
    )
    assert [head.split(b"\r\n", 1)[0] for head, _ in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert json.loads(answers[0][1]) == [{"Host": "a100-1", "Score": 1}, {"Host": "a100-0", "Score": 10}]
    assert json.loads(answers[1][1])["NodeNames"] == ["a100-1", "a100-0"]


def test_healthz_answers_a_plain_get(server: ExtenderServer) -> None:
    ((head, payload),) = exchange(server.port, raw_request("GET", "/healthz") + b"")[:1]
    assert head.startswith(b"HTTP/1.1 200") and json.loads(payload) == {"status": "ok"}


@pytest.mark.parametrize(
    "pod",
    [
        v1_pod("9" * 5000),  # longer than int() converts (sys.get_int_max_str_digits)
        {**v1_pod(), "spec": {**v1_pod()["spec"], "priority": float("nan")}},  # Python's json writes NaN; Go never
    ],
    ids=["a quantity of 5000 digits", "NaN priority"],
)
def test_a_pod_python_cannot_convert_fails_open(pod: dict[str, Any]) -> None:
    snapshot = cluster()
    extender = Extender(lambda: snapshot, ExtenderConfig(60), clock=lambda: T + 5)
    for verb in ("filter", "prioritize"):
        status, body = extender.handle(verb, json.dumps({"Pod": pod, "NodeNames": ["a100-0", "a100-1"]}).encode())
        assert status == 200, body
    assert json.loads(body) == [{"Host": "a100-0", "Score": 0}, {"Host": "a100-1", "Score": 0}]


def test_a_node_list_request_on_a_stale_snapshot_passes_every_item_back_unchanged() -> None:
    snapshot = cluster(T - 3600)
    extender = Extender(lambda: snapshot, ExtenderConfig(60), clock=lambda: T)
    items = [
        {"metadata": {"name": "a100-0", "labels": {"nvidia.com/gpu.product": A100}}, "status": {"capacity": {}}},
        {"metadata": {"name": "joined-since"}, "spec": {"unschedulable": False}},
    ]
    args = {"Pod": v1_pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    status, body = extender.handle("filter", json.dumps(args).encode())
    assert status == 200
    assert json.loads(body) == {
        "Nodes": {"items": items},
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    _, scored = extender.handle("prioritize", json.dumps(args).encode())
    assert json.loads(scored) == [{"Host": "a100-0", "Score": 0}, {"Host": "joined-since", "Score": 0}]
