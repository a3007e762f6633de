"""Does a Kafka broker answer at an address? A raw-socket ApiVersions request (no Kafka client
library), and the parsing of ``bootstrap_servers`` strings.

:func:`check_bootstrap` is what the provider and the CLI ask of a configured cluster; the local
and Docker brokers use :func:`_api_versions` to wait until they are ready. This module starts
nothing, never authenticates (TLS listeners only get a TCP connect) and imports no other module of
the package: it holds the package's one error, :class:`KafkaProviderError`.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import struct
import time


class KafkaProviderError(Exception):
    """No broker could be provided or reached; the message says why and what to do next."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Bound of the "does the external cluster answer" check of :func:`provide_broker`.
EXTERNAL_PROBE_TIMEOUT_S = 5.0


def check_bootstrap(
    bootstrap_servers: str,
    security_protocol: str = "PLAINTEXT",
    *,
    timeout_s: float = EXTERNAL_PROBE_TIMEOUT_S,
) -> str:
    """Check that a broker of ``bootstrap_servers`` answers; returns the address that did.

    Plaintext and SASL_PLAINTEXT listeners get a Kafka ApiVersions request (answered before
    authentication); TLS listeners only a TCP connect. All addresses share ``timeout_s``.
    """
    addresses = _parse_bootstrap(bootstrap_servers)
    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    for host, port in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            errors.append(f"{host}:{port}: not tried (time budget of {timeout_s:g} s spent)")
            continue
        try:
            if security_protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
                _api_versions(host, port, remaining)
            else:
                socket.create_connection((host, port), timeout=remaining).close()
        except (OSError, ValueError) as exc:
            errors.append(f"{host}:{port}: {_describe_socket_error(exc)}")
        else:
            return f"{host}:{port}"
    raise KafkaProviderError(
        f"the configured Kafka cluster {bootstrap_servers!r} does not answer ("
        + "; ".join(errors)
        + "). Start it, fix BRIDGE_KAFKA__BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS, or unset "
        "them to use a local broker."
    )


def _parse_bootstrap(bootstrap_servers: str) -> list[tuple[str, int]]:
    addresses: list[tuple[str, int]] = []
    for raw in bootstrap_servers.split(","):
        item = raw.strip()
        if not item:
            continue
        item = item.split("://", 1)[-1]
        match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", item)
        if match is None:
            raise KafkaProviderError(
                f"bootstrap server {raw.strip()!r} is not host:port (in {bootstrap_servers!r})"
            )
        host = match.group(1) or match.group(3)
        port = int(match.group(2) or match.group(4))
        if not 0 < port < 65536:
            raise KafkaProviderError(f"bootstrap server {raw.strip()!r} has no valid port")
        addresses.append((host, port))
    if not addresses:
        raise KafkaProviderError(f"no bootstrap server in {bootstrap_servers!r}")
    return addresses


def _api_versions(host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None = None) -> int:
    """Send a Kafka ApiVersions v0 request; returns the number of APIs the broker lists.

    Over ``tls`` when given (a SASL listener answers ApiVersions before authentication).
    Raises OSError when nothing answers in time (ssl.SSLError when the TLS handshake fails),
    ValueError when the answer is not Kafka's.
    """
    deadline = time.monotonic() + timeout_s
    correlation_id = int.from_bytes(os.urandom(3), "big")
    client_id = b"mcp-kafka-bridge-probe"
    request = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    with _connect(host, port, timeout_s, tls) as sock:

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {timeout_s:g} s")
            return left

        sock.settimeout(remaining())
        sock.sendall(struct.pack(">i", len(request)) + request)

        def recv_exact(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                sock.settimeout(remaining())
                chunk = sock.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("connection closed before a full answer")
                buf += chunk
            return buf

        (size,) = struct.unpack(">i", recv_exact(4))
        if not 6 <= size <= 1 << 20:
            raise ValueError(f"not a Kafka answer (frame size {size})")
        payload = recv_exact(size)
    got_id, error_code = struct.unpack(">ih", payload[:6])
    if got_id != correlation_id:
        raise ValueError("not a Kafka answer (correlation id mismatch)")
    if error_code not in (0, 35):  # 35 UNSUPPORTED_VERSION: still a Kafka broker
        raise ValueError(f"ApiVersions answered with error code {error_code}")
    if error_code == 0 and len(payload) >= 10:
        return int(struct.unpack(">i", payload[6:10])[0])
    return 0


def _connect(host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def _describe_socket_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({exc})" if str(exc) else "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host ({exc.strerror})"
    return _one_line(exc)
