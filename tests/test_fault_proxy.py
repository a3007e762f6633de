"""The fault proxy (bridgedev.kafka.proxy) over real loopback sockets, in front of an echo server.

Timing assertions are lower bounds only (a fault adds at least so much); how fast the proxy is
belongs to no test.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from bridgedev.kafka.proxy import CHUNK_BYTES, FaultProxy, Route

#: Bound of every socket operation expected to succeed.
IO_TIMEOUT_S = 10.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy() as running:
        yield running


@pytest.fixture
def route(proxy: FaultProxy, echo_port: int) -> Route:
    return proxy.add_route("127.0.0.1", echo_port)


def _connect(route: Route) -> socket.socket:
    return socket.create_connection(("127.0.0.1", route.listen_port), timeout=IO_TIMEOUT_S)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def _echo_round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
    sender.start()  # send while receiving: a large payload would fill both buffers otherwise
    try:
        return _recv_exact(sock, len(payload))
    finally:
        sender.join(IO_TIMEOUT_S)


def _is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bytes_pass_through_both_ways_unchanged(route: Route) -> None:
    payload = os.urandom(3 * CHUNK_BYTES + 17)
    with _connect(route) as sock:
        assert _echo_round_trip(sock, payload) == payload
        assert _echo_round_trip(sock, b"again") == b"again"


def test_the_proxy_counts_its_open_connections(proxy: FaultProxy, route: Route) -> None:
    with _connect(route) as sock:
        _echo_round_trip(sock, b"x")
        assert proxy.connection_count() == 1


def test_a_cut_closes_live_connections_and_refuses_new_ones(
    proxy: FaultProxy, route: Route
) -> None:
    with _connect(route) as sock:
        assert _echo_round_trip(sock, b"before") == b"before"
        proxy.cut()
        assert _is_closed(sock)
    with pytest.raises(ConnectionRefusedError):
        _connect(route)
    assert proxy.connection_count() == 0


def test_a_restore_forwards_again_on_the_same_port(proxy: FaultProxy, route: Route) -> None:
    proxy.cut()
    proxy.restore()
    with _connect(route) as sock:
        assert _echo_round_trip(sock, b"after") == b"after"
    assert proxy.routes == [route]


def test_a_route_added_during_a_cut_refuses_until_the_restore(
    proxy: FaultProxy, echo_port: int
) -> None:
    proxy.cut()
    late = proxy.add_route("127.0.0.1", echo_port)
    with pytest.raises(ConnectionRefusedError):
        _connect(late)
    proxy.restore()
    with _connect(late) as sock:
        assert _echo_round_trip(sock, b"late") == b"late"


def test_a_blackhole_cut_accepts_new_connections_but_never_answers(
    proxy: FaultProxy, route: Route
) -> None:
    with _connect(route) as live:
        _echo_round_trip(live, b"x")
        proxy.cut(blackhole=True)
        assert _is_closed(live)
    with _connect(route) as sock:
        sock.sendall(b"anyone there?")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        proxy.restore()  # drops the blackholed connection: its client reconnects
        sock.settimeout(IO_TIMEOUT_S)
        assert _is_closed(sock)
    with _connect(route) as again:
        assert _echo_round_trip(again, b"back") == b"back"


def test_slow_adds_at_least_the_latency_each_way(proxy: FaultProxy, route: Route) -> None:
    with _connect(route) as sock:
        _echo_round_trip(sock, b"warm")
        proxy.slow(0.2)  # reaches the live connection too
        started = time.monotonic()
        assert _echo_round_trip(sock, b"slow") == b"slow"
        assert time.monotonic() - started >= 2 * 0.2


def test_a_bandwidth_cap_paces_the_bytes(proxy: FaultProxy, route: Route) -> None:
    rate = 1_000_000.0
    payload = os.urandom(4 * CHUNK_BYTES)
    proxy.slow(0.0, bytes_per_s=rate)
    with _connect(route) as sock:
        started = time.monotonic()
        assert _echo_round_trip(sock, payload) == payload
        # each direction sends a chunk, then waits its size at the rate before the next one
        assert time.monotonic() - started >= (len(payload) - CHUNK_BYTES) / rate


def test_clear_ends_a_cut_and_keeps_forwarding(proxy: FaultProxy, route: Route) -> None:
    proxy.slow(0.05)
    proxy.cut()
    proxy.clear()
    with _connect(route) as sock:
        assert _echo_round_trip(sock, b"clear") == b"clear"
    assert "forwarding" in repr(proxy)


def test_a_target_that_is_down_closes_the_client_connection(proxy: FaultProxy) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = int(placeholder.getsockname()[1])  # bound, never listening: refuses
        route = proxy.add_route("127.0.0.1", dead_port)
        with _connect(route) as sock:
            assert _is_closed(sock)


def test_slow_refuses_a_negative_latency_or_a_zero_rate(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="latency_s >= 0"):
        proxy.slow(-1.0)
    with pytest.raises(ValueError, match="bytes_per_s > 0"):
        proxy.slow(0.1, bytes_per_s=0)


def test_a_closed_proxy_refuses_calls_and_frees_its_ports(echo_port: int) -> None:
    proxy = FaultProxy()
    route = proxy.add_route("127.0.0.1", echo_port)
    proxy.close()
    proxy.close()
    with pytest.raises(ConnectionRefusedError):
        _connect(route)
    with pytest.raises(RuntimeError, match="closed"):
        proxy.cut()
