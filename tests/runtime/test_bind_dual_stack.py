"""The HTTP servers' default bind address: every interface, IPv6 and IPv4 (stop 41).

The default was 0.0.0.0, which takes no IPv6 connection: on an IPv6-only cluster the kubelet's probes and
Prometheus' scrapes of the pod's address failed, and "::" (the fix a user would try) fails at start-up where IPv6 is
disabled. Now the default is empty: "::" with IPv4 mapped in where the kernel has IPv6 (as Go's ``:8080``), else
0.0.0.0."""

from __future__ import annotations

import errno
import socket
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from autoscaler import telemetry
from autoscaler.settings import Settings


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _get(host: str, port: int) -> bytes:
    with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as answer:
        return answer.read()


def _serve(server):
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_the_default_listens_on_ipv4_and_on_ipv6_where_the_host_has_it() -> None:
    server = telemetry.http_server("", 0, _Hello)
    _serve(server)
    try:
        port = server.server_address[1]
        assert _get("127.0.0.1", port) == b"hello\n"
        if _ipv6_loopback():
            assert server.address_family == socket.AF_INET6
            assert _get("[::1]", port) == b"hello\n"
    finally:
        server.shutdown()
        server.server_close()


def test_without_ipv6_the_default_falls_back_to_every_ipv4_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoIpv6:
        def __init__(self, *args: object) -> None:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(telemetry, "_Ipv6HttpServer", NoIpv6)
    server = telemetry.http_server("", 0, _Hello)
    _serve(server)
    try:
        assert server.address_family == socket.AF_INET and server.server_address[0] == "0.0.0.0"
        assert _get("127.0.0.1", server.server_address[1]) == b"hello\n"
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_taken_is_an_error_not_a_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    class Taken:
        def __init__(self, *args: object) -> None:
            raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(telemetry, "_Ipv6HttpServer", Taken)
    with pytest.raises(OSError) as raised:
        telemetry.http_server("", 0, _Hello)
    assert raised.value.errno == errno.EADDRINUSE


def test_an_explicit_ipv4_address_stays_ipv4() -> None:
    server = telemetry.http_server("0.0.0.0", 0, _Hello)
    try:
        assert server.address_family == socket.AF_INET
    finally:
        server.server_close()


def test_the_settings_default_to_every_interface() -> None:
    settings = Settings()
    assert settings.http.bind_address == "" and settings.scheduler_extender.bind_address == ""
