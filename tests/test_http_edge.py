"""The HTTP edge (issue 26, item 7): the Origin check compares scheme, host and port;
``/admin/*`` takes ``/mcp``'s authentication and refuses cross-site requests; the view token's
access-log redaction decodes parameter names, in one linear pass.

In-process (``httpx.ASGITransport``): only the gate is under test, so no Kafka is needed. A
request the gate lets through reaches the handlers with a request they refuse (400), which
is told apart from the gate's own 403.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.routing import Route
from support.layout import merged

from bridge.config import Settings, load_settings
from bridge.metrics import Metrics
from bridge.server.app import create_app
from bridge.server.auth import Authenticator
from bridge.server.browser import install_log_redaction, redact_tokens
from bridge.server.handlers import MethodHandlers
from bridge.server.http import McpHttp

# --- the Origin check --------------------------------------------------------------------------


def endpoint_of(settings: Settings) -> McpHttp:
    handlers = MethodHandlers(settings, None, [], None)  # type: ignore[arg-type]  # never reached
    return McpHttp(settings, Authenticator(settings.auth), handlers, Metrics(), lambda *_: 0)


async def gate_status(headers: dict[str, str], *, scheme: str = "http", **overrides: Any) -> int:
    """The status of ``POST /mcp`` with ``headers`` (403: refused by the Host/Origin check)."""
    settings = load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"}, tool_packs=[], **overrides)
    app = Starlette(routes=[Route("/mcp", endpoint_of(settings).post, methods=["POST"])])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://localhost") as http:
        return (await http.post("/mcp", content=b"{}", headers=headers)).status_code


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8080", "http://localhost:8080"),
        ("localhost:8080", "http://127.0.0.1:8080"),  # another name of this server, same port
        ("localhost", "http://localhost"),  # the default port on both sides
        ("localhost", "http://localhost:80"),
        ("localhost:80", "http://localhost"),
        ("LOCALHOST:8080", "HTTP://LocalHost:8080"),
        ("[::1]:8080", "http://[::1]:8080"),
    ],
)
async def test_an_origin_of_this_server_is_accepted(host, origin):
    assert await gate_status({"host": host, "origin": origin}) != 403


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8080", "http://localhost:9999"),  # same host, another port
        ("localhost:8080", "http://localhost"),  # another port: the default one
        ("localhost", "http://localhost:8080"),
        ("localhost:8080", "https://localhost:8080"),  # another scheme
        ("localhost", "https://localhost"),
        ("localhost:443", "https://localhost"),  # https's port, but the request came over http
        ("[::1]:8080", "http://[::1]:9999"),
        ("localhost:8080", "null"),  # a sandboxed frame or a file: page
        ("localhost:8080", "ftp://localhost:8080"),
    ],
)
async def test_an_origin_on_another_port_or_scheme_is_refused(host, origin):
    assert await gate_status({"host": host, "origin": origin}) == 403


async def test_https_default_ports_are_handled():
    for host, origin in [
        ("localhost", "https://localhost"),
        ("localhost", "https://localhost:443"),
        ("localhost:443", "https://localhost"),
    ]:
        assert await gate_status({"host": host, "origin": origin}, scheme="https") != 403
    refused = {"host": "localhost", "origin": "http://localhost"}
    assert await gate_status(refused, scheme="https") == 403


async def test_a_configured_origin_matches_on_scheme_host_and_port():
    allowed = {"server": {"allowed_origins": ["https://App.example.com"]}}
    accepted = ["https://app.example.com", "https://app.example.com:443"]
    refused = ["https://app.example.com:8443", "http://app.example.com", "https://example.com"]
    for origin in accepted:
        assert await gate_status({"origin": origin}, **allowed) != 403, origin
    for origin in refused:
        assert await gate_status({"origin": origin}, **allowed) == 403, origin


async def test_a_malformed_host_is_refused():
    for host in ("localhost:80x", "localhost:", "[::1]x", "localhost:123456"):
        assert await gate_status({"host": host}) == 403, host


# --- /admin/* ----------------------------------------------------------------------------------


class FakeIndexer:
    def __init__(self) -> None:
        self.actions: list[str] = []

    def pause(self) -> None:
        self.actions.append("pause")

    def resume(self) -> None:
        self.actions.append("resume")


def admin_app(**overrides: Any) -> tuple[httpx.AsyncClient, FakeIndexer]:
    values = {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "server": {"admin_endpoints": True},
        "auth": {"mode": "bearer", "tokens": {"tok-ops": "ops"}},
    }
    settings = load_settings(**merged(values, overrides))
    app = create_app(settings)
    indexer = FakeIndexer()
    # The lifespan is not run: the components the admin route uses, in place.
    app.state.components = SimpleNamespace(endpoint=endpoint_of(settings), indexer=indexer)
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://localhost:8080"), indexer


OPS = {"authorization": "Bearer tok-ops"}


async def test_admin_requires_the_mcp_endpoints_authentication():
    http, indexer = admin_app()
    async with http:
        assert (await http.post("/admin/indexer/pause")).status_code == 401
        wrong = {"authorization": "Bearer tok-nobody"}
        assert (await http.post("/admin/indexer/pause", headers=wrong)).status_code == 401
        assert indexer.actions == []
        reply = await http.post("/admin/indexer/pause", headers=OPS)
        assert reply.status_code == 200 and reply.json() == {"indexer": "pause"}
    assert indexer.actions == ["pause"]


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "http://evil.example"},
        {"origin": "http://localhost:9999"},
        {"origin": "https://ops.example.com"},  # allowed for /mcp, never for /admin
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
        {"sec-fetch-site": "cross-site", "origin": "http://localhost:8080"},
        {"host": "evil.example:8080"},
    ],
)
async def test_admin_refuses_cross_site_requests_even_with_a_valid_credential(headers):
    http, indexer = admin_app(server={"allowed_origins": ["https://ops.example.com"]})
    async with http:
        reply = await http.post("/admin/indexer/pause", headers=OPS | headers)
    assert reply.status_code == 403
    assert indexer.actions == []


async def test_admin_refuses_cross_site_requests_when_any_host_is_allowed():
    http, indexer = admin_app(server={"allowed_hosts": ["*"]})
    async with http:
        evil = OPS | {"origin": "http://evil.example"}
        assert (await http.post("/admin/indexer/pause", headers=evil)).status_code == 403
        own = OPS | {"host": "bridge.example:8080", "origin": "http://bridge.example:8080"}
        assert (await http.post("/admin/indexer/pause", headers=own)).status_code == 200
    assert indexer.actions == ["pause"]


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, a script: no browser headers
        {"origin": "http://localhost:8080", "sec-fetch-site": "same-origin"},
        {"sec-fetch-site": "none"},  # typed by the operator
    ],
)
async def test_admin_accepts_same_origin_requests(headers):
    http, indexer = admin_app()
    async with http:
        reply = await http.post("/admin/indexer/resume", headers=OPS | headers)
    assert reply.status_code == 200
    assert indexer.actions == ["resume"]


async def test_admin_stays_404_when_off():
    settings = load_settings(kafka={"bootstrap_servers": "127.0.0.1:1"})
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        assert (await http.post("/admin/indexer/pause")).status_code == 404


# --- the view token's log redaction ------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["token", "%74oken", "tok%65n", "%74%6F%6B%65%6E", "%74%6f%6b%65%6e", "TOKEN", "Tok%45n"],
)
def test_a_token_parameter_is_redacted_however_its_name_is_encoded(name):
    path = f"/view/tasks/t1/events?after=3&{name}=vt1.secret.mac"
    assert redact_tokens(path) == f"/view/tasks/t1/events?after=3&{name}=[redacted]"
    assert redact_tokens(f"/x?{name}=vt1.secret.mac&a=1") == f"/x?{name}=[redacted]&a=1"


def test_a_question_mark_inside_a_token_value_is_redacted_with_it():
    assert redact_tokens("/x?token=a?b?c&d=1 x") == "/x?token=[redacted]&d=1 x"
    assert redact_tokens("/x?%74oken=a?b") == "/x?%74oken=[redacted]"
    assert redact_tokens("/x?a=b?token=c") == "/x?a=b?token=[redacted]"


def test_the_server_reads_an_encoded_name_as_the_token_parameter():
    # Why the redaction decodes: starlette's query parser (the view's) decodes names.
    for name in ("%74oken", "tok%65n"):
        assert QueryParams(f"{name}=vt1.secret.mac")["token"] == "vt1.secret.mac"


@pytest.mark.parametrize(
    "text",
    [
        "/x?mytoken=keep",
        "/x?token_=keep",
        "/x?tok%2565n=keep",  # decoded once it is "tok%65n": not the token
        "/x?a=token=keep",  # a value, not a name
        "/view/tasks/token/events",
        "token=keep",  # no query
        "",
    ],
)
def test_other_parameters_are_kept(text):
    assert redact_tokens(text) == text


def test_the_access_log_line_of_an_encoded_token_name_is_redacted(caplog):
    install_log_redaction()
    path = "/view/tasks/t1/events?%74oken=vt1.abc.def&after=3"
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 200
        )
    line = caplog.records[-1].getMessage()
    assert "vt1.abc.def" not in line
    assert "?%74oken=[redacted]&after=3" in line


def median_seconds(work: Callable[[], object]) -> float:
    """Median CPU seconds of this thread over 5 runs: as in tests/support/linear.py, other
    processes (parallel test workers, other builds) do not count, where wall time let them
    push the ratio past its bound (25 once, under pytest-xdist on a loaded machine)."""
    times = []
    for _ in range(5):
        started = time.thread_time()
        work()
        times.append(time.thread_time() - started)
    return statistics.median(times)


@pytest.mark.parametrize(
    "unit",
    ["?", "?%74oken=", '=&"', "?tok%65n=v&"],  # every piece a parameter, a name to decode
)
def test_the_redaction_is_linear_in_the_line(unit):
    # Work grows with the input, not its square: 8 times the text takes well under 20 times
    # as long (medians of 5 runs, at 64 KiB and more). Absolute budgets are not asserted here.
    n = 64 * 1024 // len(unit) + 1
    small, large = "/x" + unit * n, "/x" + unit * (8 * n)
    redact_tokens(large)  # warm
    ratio = median_seconds(lambda: redact_tokens(large)) / median_seconds(
        lambda: redact_tokens(small)
    )
    assert ratio < 20, ratio
