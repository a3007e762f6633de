"""Benchmarks of tasks/stream (SEP-2694) against a real ``bridge serve`` subprocess and Kafka.

Run::

    .venv/bin/python bench/bench_streams.py            # full size, ~4-5 minutes here
    .venv/bin/python bench/bench_streams.py --small    # smoke run, ~2 minutes
    .venv/bin/python bench/bench_streams.py --only latency --only hot --json out.json

The broker comes from ``bridge.devkafka.provide_broker`` (the configured cluster, else
Docker, else a throwaway local KRaft broker from the Maven jars). One ``bridge serve``
subprocess on fresh topics (``bench-streams-<8 hex>.*``, **one events partition**, auth mode
none, so every stream belongs to the principal ``anonymous``) serves every part of the run;
all traffic is loopback. Tasks are created by publishing their ``task.created`` event
directly (owner ``owner_digest("anonymous")``), no worker is involved.

What is measured (see docs/benchmarks-streams.md):

1. ``latency`` - produce -> SSE receive latency of one live stream while a producer publishes
   at a steady rate (send time in the payload), against a plain read_committed aiokafka
   consumer tailing the same partition (produce -> consume). Target: p50 and p99 <= 2x Kafka.
2. ``bytes``   - bytes the bridge process receives from the broker (``ss -tinp``
   ``bytes_received`` of its TCP sockets to the broker port) over a fixed window of steady
   production, with 1, 100 and 1000 live streams on distinct tasks. Target: flat.
3. ``rss``     - the bridge's VmRSS before and after opening N idle streams (10,000; 1,000 with
   --small) on distinct tasks (``after=0``: nothing to replay), settled when the bridge's
   ``bridge_streams_active`` gauge reads N. Target: <= 30 KB per stream.
4. ``hot``     - one stream replaying a long task (200,000 events; 50,000 with --small) to its
   result, events/s, against a raw read_committed aiokafka consumer reading the same records.
   Target: >= 50% of the raw consumer.

The stages run in the order rss, latency, bytes, hot (the RSS baseline is taken on a server
that has not served streams yet) and are printed in the order above. The main bridge runs with
``BRIDGE_METRICS_REFRESH_S=3600``; a second, short-lived bridge measures what the default
gauge refresh fetches. A MISS is reported, never raised.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from common import (
    NotReached,
    Record,
    Results,
    bench_settings,
    end_offset,
    environment,
    produce,
    report,
    say,
    verdict,
    within,
)

from bridge.config import Settings, load_settings
from bridge.devkafka import provide_broker
from bridge.envelope import decode_event
from bridge.events import CreatedPayload
from bridge.kafka.clients import committed_consumer
from bridge.kafka.topics import create_layout
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.messages import new_task_id, owner_digest

# --- targets ------------------------------------------------------------------------------------

TARGET_LATENCY_RATIO = 2.0  # bridge SSE latency / Kafka produce->consume latency (p50 and p99)
TARGET_BYTES_FLAT = 1.2  # bytes fetched with N streams / with 1 stream
TARGET_RSS_PER_STREAM_KB = 30.0
TARGET_HOT_SHARE = 0.5  # bridge replay events/s / raw consumer events/s

VERSION = "2026-07-28"
TASKS_CAPS: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
PRINCIPAL = "anonymous"  # auth mode none
TICK_TYPE = "com.example.bench.tick"
#: Streams being opened at once (each until it is live): well under uvicorn's backlog of 2048.
OPEN_CONCURRENCY = 200


@dataclass(frozen=True)
class Sizes:
    rate: float  # events/s of the steady producer (latency and bytes)
    latency_s: float  # measured seconds of the latency run
    warmup_events: int  # sent (and discarded) before the latency run
    fanouts: tuple[int, ...]  # stream counts of the bytes benchmark
    window_s: float  # production time of each bytes window
    idle_streams: int  # streams of the RSS benchmark
    hot_events: int  # events of the hot task, task.created and the terminal status included
    repeat: int  # replays of the hot task through tasks/stream (the best is reported)


FULL = Sizes(200.0, 10.0, 100, (1, 100, 1000), 10.0, 10_000, 200_000, 2)
SMALL = Sizes(200.0, 5.0, 50, (1, 100, 1000), 5.0, 1_000, 50_000, 1)


# --- results ------------------------------------------------------------------------------------

_ORDER = {"latency": 0, "bytes": 1, "rss": 2, "hot": 3}


def sized_verdict(ok: bool, args: argparse.Namespace) -> str:
    """Verdict of a target stated for the full size."""
    return verdict(ok) if not args.small else f"({verdict(ok)} - target is for full size)"


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (1..99) of ``values`` (inclusive method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# --- the bridge subprocess ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raise_nofile() -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def proc_nofile(pid: int) -> int:
    """The soft ``Max open files`` limit of process ``pid``."""
    with open(f"/proc/{pid}/limits", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return 1 << 62 if soft == "unlimited" else int(soft)
    raise RuntimeError(f"no 'Max open files' in /proc/{pid}/limits")


def rss_kib(pid: int) -> int:
    """VmRSS of process ``pid`` in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def socket_fds(pid: int) -> int:
    """Open socket file descriptors of process ``pid``."""
    count = 0
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        with contextlib.suppress(OSError):
            if os.readlink(f"{base}/{name}").startswith("socket:"):
                count += 1
    return count


@dataclass
class BridgeProcess:
    """``python -m bridge.cli serve`` on a free port, its output in ``log_path``."""

    settings: Settings
    extra_env: dict[str, str]
    log_path: Path
    port: int = 0
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
        t = self.settings.topics
        env.update(
            BRIDGE_KAFKA_BOOTSTRAP_SERVERS=self.settings.kafka_bootstrap_servers or "",
            BRIDGE_TOPICS__PREFIX=t.prefix,
            BRIDGE_TOPICS__PARTITIONS=str(t.partitions),
            BRIDGE_TOPICS__REPLICATION_FACTOR=str(t.replication_factor),
            BRIDGE_TOPICS__MIN_INSYNC_REPLICAS=str(t.min_insync_replicas),
            BRIDGE_LOG_LEVEL="WARNING",  # no access log lines for ten thousand requests
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def start(self, bound_s: float = 90.0) -> None:
        self.port = free_port()
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "bridge.cli", "serve", "--port", str(self.port)],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"bridge exited:\n{self.tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.1)  # poll interval of a bounded wait for a subprocess to listen
        raise RuntimeError(f"bridge not ready within {bound_s}s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=20)


# --- bytes from the broker (ss -tinp) -----------------------------------------------------------

_SS_PID = re.compile(r"pid=(\d+),")
_SS_RECEIVED = re.compile(r"\bbytes_received:(\d+)")
_SS_ACKED = re.compile(r"\bbytes_acked:(\d+)")


def run_against(bridge: BridgeProcess, work: Coroutine[Any, Any, None], res: Results) -> None:
    """Run a bench's ``work`` against a started ``bridge``, then stop it: its log tail is shown
    when the work fails, and its exit during the run is noted in the results."""
    try:
        asyncio.run(work)
    except BaseException:
        say(f"bridge log tail:\n{bridge.tail()}")
        raise
    finally:
        if not bridge.alive():
            res.note(f"the bridge exited during the run:\n{bridge.tail()}")
        bridge.stop()


def broker_ports(bootstrap: str) -> set[int]:
    return {int(part.rsplit(":", 1)[1]) for part in bootstrap.split(",") if ":" in part}


def kafka_socket_bytes(pid: int, ports: set[int]) -> dict[str, tuple[int, int]]:
    """Per TCP socket of ``pid`` to a broker port: (bytes_received, bytes_acked).

    ``ss -tinp`` reports the kernel's ``tcp_info`` counters of each socket: ``bytes_received``
    is every payload byte the socket received (TCP headers and retransmissions excluded),
    ``bytes_acked`` every payload byte it sent that the peer acknowledged.
    """
    expr = " or ".join(f"dport = :{p}" for p in sorted(ports))
    out = subprocess.run(
        ["ss", "-H", "-t", "-i", "-n", "-p", "state", "established", f"( {expr} )"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    sockets: dict[str, tuple[int, int]] = {}
    current: str | None = None
    owner = False
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # "Recv-Q Send-Q local peer users:(...)"
            fields = line.split()
            current = f"{fields[2]}->{fields[3]}"
            owner = any(int(p) == pid for p in _SS_PID.findall(line))
            continue
        if current is not None and owner:
            received = _SS_RECEIVED.search(line)
            acked = _SS_ACKED.search(line)
            sockets[current] = (
                int(received.group(1)) if received else 0,
                int(acked.group(1)) if acked else 0,
            )
            current = None
    return sockets


def bytes_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> tuple[int, int, int, int]:
    """(received, sent, sockets opened, sockets closed) between two snapshots."""
    received = sent = 0
    for key, (rx, tx) in after.items():
        rx0, tx0 = before.get(key, (0, 0))
        received += rx - rx0
        sent += tx - tx0
    return received, sent, len(after.keys() - before.keys()), len(before.keys() - after.keys())


# --- a lean SSE client on raw asyncio sockets ---------------------------------------------------

_NOTIFICATION = b'"method":"notifications/tasks/event"'


def mcp_body(method: str, params: dict[str, Any], request_id: int) -> bytes:
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": TASKS_CAPS,
    }
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(body, separators=(",", ":")).encode()


def mcp_headers(method: str, name: str | None) -> dict[str, str]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def stream_request(port: int, task_id: str, request_id: int, after: int | None = None) -> bytes:
    params: dict[str, Any] = {"taskId": task_id}
    if after is not None:
        params["after"] = after
    body = mcp_body("tasks/stream", params, request_id)
    head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in mcp_headers("tasks/stream", task_id).items()]
    head += [f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(head).encode() + body


EventHandler = Callable[["SseStream", bytes], None]


class SseStream(asyncio.Protocol):
    """One ``tasks/stream`` over one HTTP/1.1 connection: de-chunks the body, splits SSE events.

    ``on_event(stream, data)`` gets the ``data:`` payload (bytes) of every notification; the
    final JSON-RPC result or error completes ``done``. Nothing is parsed that the caller does
    not ask for, so one process can hold ten thousand of these cheaply.
    """

    def __init__(self, request: bytes, on_event: EventHandler | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.on_event = on_event
        self.transport: asyncio.Transport | None = None
        self.status: int | None = None
        self.events = 0
        self.keepalives = 0
        self.opened: asyncio.Future[None] = loop.create_future()  # 200 + text/event-stream
        self.first_event: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._raw = bytearray()
        self._body = bytearray()
        self._headers_done = False
        self._sse = False
        self._chunked = True
        self._chunk_left = 0
        self._need_crlf = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish({"closed": True, "error": repr(exc) if exc else None})

    def data_received(self, data: bytes) -> None:
        self._raw += data
        if not self._headers_done:
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._raw[:end]).decode("latin-1")
            del self._raw[: end + 4]
            status_line, *lines = head.split("\r\n")
            self.status = int(status_line.split()[1])
            fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
            self._chunked = fields.get("transfer-encoding", "").lower() == "chunked"
            self._headers_done = True
            self._sse = self.status == 200 and fields.get("content-type", "").startswith(
                "text/event-stream"
            )
            if self._sse and not self.opened.done():
                self.opened.set_result(None)
        if not self._sse:  # a JSON answer (an error, whatever its status): read it whole
            self._body += self._raw
            self._raw.clear()
            with contextlib.suppress(ValueError):
                self._finish(json.loads(bytes(self._body)))
            return
        if self._chunked:
            self._dechunk()
        else:
            self._body += self._raw
            self._raw.clear()
        self._split_events()

    # internals
    def _dechunk(self) -> None:
        raw, pos, size = self._raw, 0, len(self._raw)
        while pos < size:
            if self._chunk_left:
                take = min(self._chunk_left, size - pos)
                self._body += raw[pos : pos + take]
                pos += take
                self._chunk_left -= take
                if not self._chunk_left:
                    self._need_crlf = True
                continue
            if self._need_crlf:
                if size - pos < 2:
                    break
                pos += 2
                self._need_crlf = False
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            length = int(bytes(raw[pos:eol]).split(b";")[0], 16)
            pos = eol + 2
            if length == 0:
                pos = size  # last chunk (no trailers from uvicorn)
                break
            self._chunk_left = length
        del raw[:pos]

    def _split_events(self) -> None:
        body, pos = self._body, 0
        while True:
            end = body.find(b"\n\n", pos)
            if end < 0:
                break
            event = bytes(body[pos:end])
            pos = end + 2
            if event.startswith(b":"):
                self.keepalives += 1
                continue
            data_at = event.find(b"data: ")
            if data_at < 0:
                continue
            data = event[data_at + 6 :]
            if _NOTIFICATION in data[:64]:
                self.events += 1
                if not self.first_event.done():
                    self.first_event.set_result(None)
                if self.on_event is not None:
                    self.on_event(self, data)
            else:
                self._finish(json.loads(data))
        if pos:
            del body[:pos]

    def _finish(self, message: dict[str, Any]) -> None:
        if not self.done.done():
            self.done.set_result(message)
        for future in (self.opened, self.first_event):
            if not future.done():
                future.set_exception(RuntimeError(f"stream ended: {message}"))
                future.exception()  # retrieved: no "never retrieved" warning

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


_request_ids = iter(range(1, 1 << 62))


async def open_stream(
    port: int, task_id: str, on_event: EventHandler | None = None, *, after: int | None = None
) -> SseStream:
    """Open a stream; return once it is live on the server.

    A fresh stream (``after`` None) is live once its first event (seq 0, task.created) has
    arrived: the bridge registered the stream's queue with the hub, then read the history. A
    resumed stream with nothing to replay is live once its 200 response headers arrive (the
    bridge registers it right after writing them, before it next yields to its event loop);
    callers confirm that with the server's ``bridge_streams_active`` gauge.
    """
    loop = asyncio.get_running_loop()
    request = stream_request(port, task_id, next(_request_ids), after)
    _, stream = await loop.create_connection(
        lambda: SseStream(request, on_event), "127.0.0.1", port
    )
    try:
        await (stream.first_event if after is None else stream.opened)
    except BaseException:
        stream.close()
        raise
    return stream


async def open_streams(
    port: int,
    task_ids: list[str],
    on_event: EventHandler | None = None,
    *,
    after: int | None = None,
    what: str = "streams",
    bound_s: float = 600.0,
) -> tuple[list[SseStream], float]:
    """Open one stream per task, ``OPEN_CONCURRENCY`` at a time; returns them and seconds taken."""
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    opened: list[SseStream] = []
    step = max(1, len(task_ids) // 5)
    started = time.perf_counter()

    async def one(task_id: str) -> None:
        async with gate:
            opened.append(await open_stream(port, task_id, on_event, after=after))
            if len(opened) % step == 0 and len(task_ids) >= 500:
                say(f"  {len(opened):,}/{len(task_ids):,} {what} open")

    try:
        async with within(bound_s, f"{len(task_ids):,} {what} opened"):
            await asyncio.gather(*(one(t) for t in task_ids))
    except BaseException:
        for stream in opened:
            stream.close()
        raise
    return opened, time.perf_counter() - started


def server_metric(port: int, name: str) -> float | None:
    """A sample of the bridge's ``/metrics`` (None when the process has no such metric)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def wait_active(bridge: BridgeProcess, streams: int, base_sockets: int) -> float:
    """Wait until the server has exactly ``streams`` active streams; returns seconds waited.

    The condition is the bridge's own ``bridge_streams_active`` gauge (admitted and not yet
    finished streams) and, as a cross-check, its count of open sockets: at least one per
    stream. (It was ``base + streams``, with the base counted before the opens: sockets that
    were open then and closed since, an earlier stage's or a client's keep-alive, made it
    unreachable now and then, and the 1,000-stream stage timed out with every stream open.)
    """
    started = time.perf_counter()
    seen = "nothing yet"
    try:
        async with within(120, f"the bridge counts {streams:,} active streams"):
            while True:
                active = await asyncio.to_thread(
                    server_metric, bridge.port, "bridge_streams_active"
                )
                sockets = socket_fds(bridge.pid)
                seen = f"gauge {active}, {sockets} sockets (base {base_sockets})"
                if (active is None or int(active) == streams) and (
                    sockets >= streams if streams else sockets <= base_sockets + 5
                ):
                    return time.perf_counter() - started
                await asyncio.sleep(0.2)  # poll interval of a bounded wait on the server
    except NotReached as exc:
        raise NotReached(f"{exc} (last seen: {seen})") from None


async def close_streams(
    streams: Iterable[SseStream], bridge: BridgeProcess, base_sockets: int
) -> float:
    """Close the streams; return the seconds until the server has let go of all of them."""
    started = time.perf_counter()
    for stream in streams:
        stream.close()
    await wait_active(bridge, 0, base_sockets)
    return time.perf_counter() - started


async def rpc_many(port: int, requests: list[bytes], connections: int = 16) -> list[dict[str, Any]]:
    """Send HTTP requests over a few keep-alive connections; returns the JSON answers in order.

    Raw asyncio streams instead of httpx: httpx's pool costs more CPU per request than the
    bridge does, and both share the same two cores.
    """
    answers: list[dict[str, Any]] = [{} for _ in requests]
    todo = iter(range(len(requests)))

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in todo:
                writer.write(requests[i])
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
                answers[i] = json.loads(await reader.readexactly(length))
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return answers


def http_post(port: int, method: str, params: dict[str, Any], name: str | None) -> bytes:
    body = mcp_body(method, params, next(_request_ids))
    head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in mcp_headers(method, name).items()]
    head += [f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(head).encode() + body


# --- Kafka helpers -------------------------------------------------------------------------------


def created_record(settings: Settings, pub: TaskEventPublisher, task_id: str) -> Record:
    now = time.time_ns() // 1_000_000
    payload = CreatedPayload(
        tool="bench",
        owner=owner_digest(PRINCIPAL),
        created_ms=now,
        ttl_ms=24 * 3_600_000,
        poll_interval_ms=1000,
    ).to_dict()
    value, headers = pub.encode(f"{settings.event_type_prefix}.task.created", payload, None, now)
    return task_id.encode(), value, headers


async def create_tasks(settings: Settings, n: int) -> list[str]:
    """Create ``n`` tasks of the principal ``anonymous`` by publishing their task.created."""
    pub = TaskEventPublisher(settings)
    ids = [new_task_id() for _ in range(n)]
    await produce(settings, (created_record(settings, pub, t) for t in ids), n)
    return ids


async def tasks_get(http: httpx.AsyncClient, url: str, task_id: str) -> dict[str, Any]:
    body = mcp_body("tasks/get", {"taskId": task_id}, next(_request_ids))
    reply = await http.post(url, content=body, headers=mcp_headers("tasks/get", task_id))
    message: dict[str, Any] = reply.json()
    return message


async def wait_visible(url: str, task_ids: list[str], bound_s: float = 60.0) -> None:
    """Return once the bridge serves the last of ``task_ids`` (it indexes in log order)."""
    what = f"the bridge serves the last of {len(task_ids):,} tasks"
    async with httpx.AsyncClient(timeout=30) as http, within(bound_s, what):
        while "result" not in await tasks_get(http, url, task_ids[-1]):  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # poll interval of a bounded wait on the indexer


async def prewarm(port: int, task_ids: list[str]) -> float:
    """tasks/get every task once; returns seconds.

    Whatever the bridge caches per task on first access (earlier versions: the task.created
    event, an LRU of 100k) is then in the baseline, not in the RSS delta of the streams.
    """
    started = time.perf_counter()
    requests = [http_post(port, "tasks/get", {"taskId": t}, t) for t in task_ids]
    async with within(600, f"{len(requests):,} tasks/get answered"):
        answers = await rpc_many(port, requests)
    bad = [a for a in answers if "result" not in a]
    if bad:
        raise RuntimeError(f"{len(bad)} tasks/get failed, e.g. {bad[0]}")
    return time.perf_counter() - started


# --- 3. RSS per idle stream ----------------------------------------------------------------------


async def settled_rss(pid: int) -> int:
    """VmRSS (KiB) once it stopped moving: the last of three samples 0.5 s apart."""
    samples = []
    for _ in range(3):
        samples.append(rss_kib(pid))
        await asyncio.sleep(0.5)
    return samples[-1]


async def bench_rss(
    bridge: BridgeProcess, task_ids: list[str], args: argparse.Namespace, res: Results
) -> None:
    n = len(task_ids)
    pid = bridge.pid
    await asyncio.sleep(1.0)
    cold = await settled_rss(pid)
    say(f"rss: server VmRSS {cold / 1024:.1f} MiB; tasks/get of {n:,} tasks first")
    warm_s = await prewarm(bridge.port, task_ids)
    await asyncio.sleep(2.0)  # let the server's request garbage settle
    base_sockets = socket_fds(pid)
    before = await settled_rss(pid)
    res.add(
        "rss",
        f"prewarm: tasks/get x {n:,} (per-task caches into the baseline)",
        n / warm_s,
        "requests/s",
    )
    res.add(
        "rss",
        "  VmRSS before / after the prewarm (cache, buffers, first-use allocations)",
        f"{cold / 1024:.1f} / {before / 1024:.1f}",
        "MiB",
    )
    say(f"rss: server VmRSS {before / 1024:.1f} MiB, {base_sockets} sockets; opening {n:,} streams")
    streams, open_s = await open_streams(bridge.port, task_ids, after=0, what="idle streams")
    settle_s = await wait_active(bridge, n, base_sockets)
    await asyncio.sleep(2.0)
    after = await settled_rss(pid)
    if not all(s.status == 200 for s in streams):
        res.note(f"rss: {sum(s.status != 200 for s in streams)} streams did not answer 200")
    ended = sum(s.done.done() for s in streams)
    if ended:
        res.note(f"rss: {ended} streams ended before the measurement")
    res.add(
        "rss",
        f"open {n:,} idle streams (after=0, {OPEN_CONCURRENCY} at a time)",
        n / open_s,
        "streams/s",
    )
    res.add("rss", f"  server bridge_streams_active = {n:,} after a further", settle_s, "s")
    res.add(
        "rss",
        "server VmRSS before / after opening",
        f"{before / 1024:.1f} / {after / 1024:.1f}",
        "MiB",
    )
    per_stream = (after - before) / n
    res.add(
        "rss",
        f"VmRSS per idle stream, {n:,} streams",
        per_stream,
        "KiB",
        target=f"<= {TARGET_RSS_PER_STREAM_KB:.0f} KB",
        status=sized_verdict(per_stream <= TARGET_RSS_PER_STREAM_KB, args),
    )
    say(f"rss: closing {n:,} streams")
    closed_s = await close_streams(streams, bridge, base_sockets)
    res.add("rss", "  all closed on the server (gauge 0, sockets gone) after", closed_s, "s")
    res.add(
        "rss",
        "  server VmRSS after closing (kept by the allocator)",
        (await settled_rss(pid)) / 1024,
        "MiB",
    )


# --- 1. live latency ------------------------------------------------------------------------------


async def steady_producer(
    settings: Settings,
    pub: TaskEventPublisher,
    task_ids: list[str],
    rate: float,
    count: int,
    start_i: int = 0,
) -> int:
    """Publish ``count`` events round-robin over ``task_ids`` at ``rate``/s; returns count.

    Each event is sent through the SDK (``TaskEventPublisher.publish``: idempotent, acks=all)
    without waiting for the previous one, on a fixed schedule; its payload carries the send
    time (``time.monotonic_ns()``, the same clock as the receivers in this process).
    """
    interval = 1.0 / rate
    begin = time.monotonic()
    inflight: set[asyncio.Task[Any]] = set()
    for k in range(count):
        delay = begin + k * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        i = start_i + k
        payload = {"i": i, "t": time.monotonic_ns(), "pad": "x" * 32}
        task = asyncio.create_task(pub.publish(task_ids[i % len(task_ids)], TICK_TYPE, payload))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.gather(*inflight)
    return count


async def bench_latency(
    bridge: BridgeProcess, settings: Settings, task_id: str, sizes: Sizes, res: Results
) -> None:
    sse_at: dict[int, int] = {}
    kafka_at: dict[int, int] = {}

    def on_sse(stream: SseStream, data: bytes) -> None:
        now = time.monotonic_ns()
        payload = json.loads(data)["params"]["payload"]
        if "t" in payload:
            sse_at[payload["i"]] = now - payload["t"]

    stream = await open_stream(bridge.port, task_id, on_sse)
    consumer = committed_consumer(settings, role="bench-tail")  # as the bridge's tail is set up
    await consumer.start()
    tp = TopicPartition(settings.topics.events, 0)
    consumer.assign([tp])
    await consumer.seek_to_end(tp)
    await consumer.position(tp)
    stop = asyncio.Event()
    key = task_id.encode()

    async def tail() -> None:
        while not stop.is_set():
            batches = await consumer.getmany(tp, timeout_ms=200)
            now = time.monotonic_ns()
            for record in batches.get(tp, []):
                if record.key != key:
                    continue
                payload = decode_event(record.value, record.headers).payload
                if "t" in payload:
                    kafka_at[payload["i"]] = now - payload["t"]

    tailing = asyncio.create_task(tail())
    n = int(sizes.rate * sizes.latency_s)
    try:
        async with TaskEventPublisher(settings) as pub:
            say(f"latency: {sizes.warmup_events} warm-up events, then {n:,} at {sizes.rate:.0f}/s")
            await steady_producer(settings, pub, [task_id], sizes.rate, sizes.warmup_events)
            await asyncio.sleep(1.0)
            first = sizes.warmup_events
            await steady_producer(settings, pub, [task_id], sizes.rate, n, start_i=first)
        wanted = set(range(first, first + n))
        async with within(30, f"{n:,} events seen by the stream and by the consumer"):
            while not (wanted <= sse_at.keys() and wanted <= kafka_at.keys()):  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # poll interval of a bounded wait for the receivers
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await tailing
        await consumer.stop()
        stream.close()
    sse = [sse_at[i] / 1e6 for i in sorted(wanted)]
    raw = [kafka_at[i] / 1e6 for i in sorted(wanted)]
    s50, s99, k50, k99 = pct(sse, 50), pct(sse, 99), pct(raw, 50), pct(raw, 99)
    res.add(
        "latency",
        f"bridge produce->SSE p50 / p99 / max ({n:,} events, {sizes.rate:.0f}/s)",
        f"{s50:.1f} / {s99:.1f} / {max(sse):.1f}",
        "ms",
    )
    res.add(
        "latency",
        "Kafka produce->consume p50 / p99 / max (read_committed aiokafka)",
        f"{k50:.1f} / {k99:.1f} / {max(raw):.1f}",
        "ms",
    )
    for q, s, k in (("p50", s50, k50), ("p99", s99, k99)):
        ratio = s / k
        res.add_ratio("latency", f"bridge / Kafka, {q}", ratio, TARGET_LATENCY_RATIO)


# --- 2. bytes fetched from Kafka vs number of streams -----------------------------------------------


async def bytes_window(
    bridge: BridgeProcess,
    settings: Settings,
    pub: TaskEventPublisher | None,
    tasks: list[str],
    seconds: float,
    rate: float,
    start_i: int,
) -> tuple[int, int, int, int, float]:
    """Bytes the bridge exchanged with the broker over one window of steady production.

    The window is the production time + 2 s (for the last events to reach the streams);
    no production when ``pub`` is None. Returns (received, sent, sockets opened, sockets
    closed, window seconds).
    """
    ports = broker_ports(settings.kafka_bootstrap_servers or "")
    snap0 = kafka_socket_bytes(bridge.pid, ports)
    started = time.monotonic()
    if pub is not None:
        await steady_producer(settings, pub, tasks, rate, int(rate * seconds), start_i=start_i)
    await asyncio.sleep(max(0.0, started + seconds + 2.0 - time.monotonic()))
    snap1 = kafka_socket_bytes(bridge.pid, ports)
    window = time.monotonic() - started
    return (*bytes_delta(snap0, snap1), window)


async def bench_bytes(
    bridge: BridgeProcess,
    settings: Settings,
    pool: list[str],
    sizes: Sizes,
    res: Results,
) -> None:
    pid = bridge.pid
    received_by_n: dict[int, int] = {}
    offset = 0
    counter = 10_000_000  # event numbers of this benchmark (distinct from the latency run)
    count = int(sizes.rate * sizes.window_s)
    first = sizes.fanouts[0]
    rx, _, _, _, window = await bytes_window(
        bridge, settings, None, [], sizes.window_s, sizes.rate, 0
    )
    res.add("bytes", f"idle: no stream, no production, {window:.1f} s", rx, "B")
    async with TaskEventPublisher(settings) as pub:
        rx, _, _, _, window = await bytes_window(
            bridge, settings, pub, pool[:1], sizes.window_s, sizes.rate, counter
        )
        offset, counter = 1, counter + count
        res.add(
            "bytes", f"no stream, {count:,} events at {sizes.rate:.0f}/s, {window:.1f} s", rx, "B"
        )
        for n in sizes.fanouts:
            tasks = pool[offset : offset + n]
            offset += n
            base_sockets = socket_fds(pid)
            streams, open_s = await open_streams(bridge.port, tasks, what=f"streams (of {n})")
            await wait_active(bridge, n, base_sockets)
            if n >= 100:
                res.add(
                    "bytes", f"  open {n:,} fresh streams (to seq 0 each)", n / open_s, "streams/s"
                )
            say(f"bytes: {n:,} live streams; window of {sizes.window_s:.0f} s + 2 s")
            await asyncio.sleep(1.0)
            events_before = sum(s.events for s in streams)
            received, sent, opened, closed, window = await bytes_window(
                bridge, settings, pub, tasks, sizes.window_s, sizes.rate, counter
            )
            counter += count
            delivered = sum(s.events for s in streams) - events_before
            received_by_n[n] = received
            if opened or closed:
                res.note(
                    f"bytes: N={n}: {opened} broker sockets opened, {closed} closed in the window"
                )
            if delivered != count:
                res.note(f"bytes: N={n}: streams received {delivered} of {count} events")
            ratio = received / received_by_n[first]
            res.add(
                "bytes",
                f"{n:,} stream(s): received from broker in {window:.1f} s "
                f"({count:,} events, {delivered:,} delivered)",
                received,
                "B",
                target="" if n == first else f"<= {TARGET_BYTES_FLAT}x N={first}",
                status="" if n == first else verdict(ratio <= TARGET_BYTES_FLAT),
            )
            res.add(
                "bytes",
                f"  {n:,} stream(s): received per event / sent to broker",
                f"{received / count:.0f} / {sent:,}",
                "B",
            )
            await close_streams(streams, bridge, base_sockets)
    last = sizes.fanouts[-1]
    ratio = received_by_n[last] / received_by_n[first]
    res.add_ratio("bytes", f"ratio N={last:,} / N={first}", ratio, TARGET_BYTES_FLAT)


async def bench_gauges(settings: Settings, logs: Path, sizes: Sizes, res: Results) -> None:
    """Bytes an idle bridge with the default gauge refresh receives (informational).

    A second, short-lived ``bridge serve`` on the same topics, with the default
    ``metrics_refresh_s``; the main bridge runs with the refresh off so that the refresher's
    reads do not land at random in the windows of ``bench_bytes``. The second one fences the
    main bridge's index writers; the main bridge keeps serving from memory, which is all the
    later stages use.
    """
    second = BridgeProcess(settings, {}, logs / "bridge-gauges.log")
    second.start()
    try:
        await asyncio.sleep(2.0)
        seconds = 2 * sizes.window_s
        rx, _, _, _, window = await bytes_window(second, settings, None, [], seconds, 1.0, 0)
    finally:
        second.stop()
    refresh = settings.metrics_refresh_s
    refreshes = max(1, round(window / refresh))  # about; the refresh at start is before it
    res.add("bytes", f"idle, default gauge refresh every {refresh:g} s, {window:.1f} s", rx, "B")
    res.add(
        "bytes",
        f"  per gauge refresh (~{refreshes} in the window, 1 partition)",
        rx / refreshes,
        "B",
    )


# --- 4. one hot stream vs a raw consumer -------------------------------------------------------------


async def raw_read(
    settings: Settings, start: int, end: int, key: bytes, decode: bool
) -> tuple[float, int, int]:
    """A raw read_committed consumer reads offsets [start, end).

    Default aiokafka settings (1 MiB per partition per fetch). Returns (seconds, records of
    the task, bytes this process received from the broker meanwhile).
    """
    ports = broker_ports(settings.kafka_bootstrap_servers or "")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id="bench-raw",
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    tp = TopicPartition(settings.topics.events, 0)
    try:
        consumer.assign([tp])
        await consumer.position(tp)  # metadata and connection before the clock starts
        snap0 = kafka_socket_bytes(os.getpid(), ports)
        started = time.perf_counter()
        consumer.seek(tp, start)
        count = 0
        while True:
            batches = await consumer.getmany(tp, timeout_ms=1000)
            for record in batches.get(tp, []):
                if record.offset >= end:
                    break
                if record.key == key:
                    count += 1
                    if decode:
                        decode_event(record.value, record.headers)
            if await consumer.position(tp) >= end:
                break
        seconds = time.perf_counter() - started
        received = bytes_delta(snap0, kafka_socket_bytes(os.getpid(), ports))[0]
        return seconds, count, received
    finally:
        await consumer.stop()


async def bench_hot(
    bridge: BridgeProcess,
    settings: Settings,
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
) -> None:
    n = sizes.hot_events
    task_id = new_task_id()
    key = task_id.encode()
    pub = TaskEventPublisher(settings)
    values = [pub.encode(TICK_TYPE, {"i": i, "pad": "x" * 32}) for i in range(64)]
    status = pub.encode(f"{settings.event_type_prefix}.task.status", {"status": "completed"})

    def records() -> Iterable[Record]:
        yield created_record(settings, pub, task_id)
        for i in range(n - 2):
            value, headers = values[i % len(values)]
            yield key, value, headers
        yield key, status[0], status[1]

    start = await end_offset(settings)
    say(f"hot: producing {n:,} events of one task")
    produce_s = await produce(settings, records(), n)
    end = await end_offset(settings)
    res.add("hot", f"produce {n:,} events (raw aiokafka, acks=1)", n / produce_s, "events/s")
    async with (
        httpx.AsyncClient(timeout=30) as http,
        within(120, "the bridge indexed the hot task"),
    ):
        while True:
            view = (await tasks_get(http, bridge.url, task_id)).get("result", {})
            if view.get("status") == "completed":
                break
            await asyncio.sleep(0.2)  # poll interval of a bounded wait on the bridge's indexer
    ports = broker_ports(settings.kafka_bootstrap_servers or "")

    raws: list[float] = []
    raw_rx: list[int] = []
    for rep in range(3):
        seconds, count, received = await raw_read(settings, start, end, key, decode=False)
        raw_rx.append(received)
        if count != n:
            res.note(f"hot: raw consumer read {count} records of the task, expected {n}")
        raws.append(n / seconds)
        say(f"  raw consumer rep {rep + 1}: {n / seconds:,.0f} events/s")
    decoded_s, _, _ = await raw_read(settings, start, end, key, decode=True)

    bridge_rates: list[float] = []
    bridge_rx: list[int] = []
    for rep in range(sizes.repeat):
        snap0 = kafka_socket_bytes(bridge.pid, ports)
        loop = asyncio.get_running_loop()
        request = stream_request(bridge.port, task_id, next(_request_ids))
        started = time.perf_counter()
        _, stream = await loop.create_connection(
            lambda: SseStream(request),  # noqa: B023 - awaited within this iteration
            "127.0.0.1",
            bridge.port,
        )
        try:
            async with within(600, "the replay reached its result"):
                final = await stream.done
        finally:
            stream.close()
        seconds = time.perf_counter() - started
        snap1 = kafka_socket_bytes(bridge.pid, ports)
        bridge_rx.append(bytes_delta(snap0, snap1)[0])
        if final.get("result") != {"resultType": "complete"} or stream.events != n:
            res.note(f"hot: stream ended with {final} after {stream.events} of {n} events")
        bridge_rates.append(stream.events / seconds)
        say(
            f"  tasks/stream rep {rep + 1}: {stream.events / seconds:,.0f} events/s ({seconds:.1f} s)"
        )

    raw_best, bridge_best = statistics.median(raws), max(bridge_rates)
    res.add(
        "hot",
        f"raw read_committed consumer, {n:,} records (median of {len(raws)})",
        raw_best,
        "events/s",
    )
    res.add("hot", "  same, plus decode_event() of each record", n / decoded_s, "events/s")
    res.add(
        "hot",
        f"tasks/stream full replay to the result (best of {len(bridge_rates)})"
        if len(bridge_rates) > 1
        else "tasks/stream full replay to the result",
        bridge_best,
        "events/s",
    )
    share = bridge_best / raw_best
    res.add(
        "hot",
        "tasks/stream / raw consumer",
        f"{share * 100:.1f}",
        "%",
        target=f">= {TARGET_HOT_SHARE * 100:.0f}%",
        status=sized_verdict(share >= TARGET_HOT_SHARE, args),
    )
    res.add(
        "hot",
        "  bytes fetched from Kafka for one replay: tasks/stream / raw consumer",
        f"{min(bridge_rx) / 2**20:.1f} / {min(raw_rx) / 2**20:.1f}",
        "MiB",
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--small", action="store_true", help="smoke run (1k idle streams, 50k events)"
    )
    parser.add_argument(
        "--only",
        choices=("latency", "bytes", "rss", "hot"),
        action="append",
        help="run only these benchmarks (repeatable)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the bridge's log directory")
    return parser.parse_args(argv)


async def run(
    bridge: BridgeProcess,
    settings: Settings,
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
) -> None:
    only = set(args.only or ("latency", "bytes", "rss", "hot"))
    n_pool = (1 if "latency" in only else 0) + (sum(sizes.fanouts) + 1 if "bytes" in only else 0)
    n_idle = sizes.idle_streams if "rss" in only else 0
    if n_pool + n_idle:
        say(f"creating {n_pool + n_idle:,} tasks (task.created of principal {PRINCIPAL!r})")
        ids = await create_tasks(settings, n_pool + n_idle)
        await wait_visible(bridge.url, ids)
    else:
        ids = []
    idle, pool = ids[:n_idle], ids[n_idle:]
    if "rss" in only:
        await bench_rss(bridge, idle, args, res)
    if "latency" in only:
        await bench_latency(bridge, settings, pool[0], sizes, res)
        pool = pool[1:]
    if "bytes" in only:
        await bench_bytes(bridge, settings, pool, sizes, res)
        await bench_gauges(settings, bridge.log_path.parent, sizes, res)
    if "hot" in only:
        await bench_hot(bridge, settings, sizes, args, res)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMALL if args.small else FULL
    res = Results(order=_ORDER)
    wall = time.perf_counter()
    soft, hard = raise_nofile()
    needed = sizes.idle_streams + 1024
    if soft < needed:
        sizes = Sizes(**{**asdict(sizes), "idle_streams": max(100, soft - 1024)})
        res.note(
            f"RLIMIT_NOFILE is {soft} (hard {hard}): idle streams reduced to {sizes.idle_streams}"
        )
    settings = load_settings()
    logs = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    with provide_broker(settings, progress=say) as broker:
        res.environment = environment(broker, settings)
        res.environment["size"] = "small" if args.small else "full"
        say(f"broker: {broker.info.provider} at {broker.info.bootstrap_servers}")
        bs = bench_settings(broker.info.bootstrap_servers, "streams")
        asyncio.run(create_layout(bs))  # no tools: tasks are made by writing task.created
        env = {
            "BRIDGE_MAX_STREAMS_PER_PRINCIPAL": str(max(20_000, sizes.idle_streams + 100)),
            "BRIDGE_MAX_STREAM_OPENS_PER_MINUTE": "1000000",  # all streams are one principal's
            "BRIDGE_STREAM_KEEPALIVE_S": "3600",  # keep-alives must not dominate idle streams
            # The Kafka gauges' refresher reads up to 1 MiB per partition per refresh; off here
            # (one refresh at start), measured separately by bench_gauges.
            "BRIDGE_METRICS_REFRESH_S": "3600",
        }
        bridge = BridgeProcess(bs, env, logs / "bridge.log")
        say(f"starting `bridge serve` (log: {bridge.log_path})")
        bridge.start()
        server_nofile = proc_nofile(bridge.pid)
        res.environment.update(
            bridge_pid=bridge.pid,
            client_nofile=soft,
            server_nofile=server_nofile,
            topics_prefix=bs.topics.prefix,
            bridge_env=env,
        )
        if server_nofile < sizes.idle_streams + 256:
            res.note(
                f"the bridge's RLIMIT_NOFILE is {server_nofile}: too low for {sizes.idle_streams} streams"
            )
        say(f"bridge pid {bridge.pid} on port {bridge.port}, RLIMIT_NOFILE {server_nofile}")
        run_against(bridge, run(bridge, bs, sizes, args, res), res)
    env = res.environment
    env["wall_seconds"] = round(time.perf_counter() - wall, 1)
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    report(
        res,
        f"bench_streams.py  size={env['size']}",
        f"bridge:  pid {env['bridge_pid']}, RLIMIT_NOFILE {env['server_nofile']}, "
        f"{env['bridge_env']}  wall time {env['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
