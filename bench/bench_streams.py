"""Benchmarks of tasks/stream (SEP-2694) against a real ``bridge serve`` subprocess and Kafka.

Run::

    .venv/bin/python bench/bench_streams.py            # full size, about 5 minutes here
    .venv/bin/python bench/bench_streams.py --small    # smoke run, about 2.5 minutes
    .venv/bin/python bench/bench_streams.py --only storm --only opens --json out.json
    .venv/bin/python bench/bench_streams.py --small --variants  # + hot and opens per loop/http

The broker comes from ``bridgedev.kafka.provide_broker`` (the configured cluster, else
Docker, else a throwaway local KRaft broker from the Maven jars). One ``bridge serve``
subprocess on fresh topics (``bench-streams-<8 hex>.*``, **one events partition**, auth mode
none, so every stream belongs to the principal ``anonymous``) serves every part of the run;
all traffic is loopback. Tasks are created by publishing their ``task.created`` event
directly (owner ``owner_digest("anonymous")``), no worker is involved.

What is measured (see docs/benchmarks-streams.md), each target with a PASS/MISS verdict in
one summary table that also names the machine and the versions:

1. ``latency`` - produce -> SSE latency of one live stream against a plain read_committed
   consumer tailing the same partition (produce -> consume). Target: p50 and p99 <= 2x Kafka.
2. ``scale``   - the same with 1,000 live streams over 100 tasks (10 per task).
   Target: p99 <= 1.5x Kafka's p99 in the same window.
3. ``bytes``   - bytes the bridge receives from the broker (``ss -tinp``) over a window of
   steady production with 1, 100 and 1,000 live streams. Target: flat (<= 1.2x N=1).
4. ``rss``     - VmRSS per idle stream with 10,000 (--small: 1,000) streams open.
   Target: <= 20 KiB per stream.
5. ``storm``   - 1,000 and 10,000 (--small: 1,000) clients resume at the same moment with a
   cursor two events behind the head of distinct tasks whose records interleave; time until
   every stream has its first event. Targets: 1,000 within 1 s, 10,000 within 10 s.
6. ``opens``   - fresh streams (no cursor) opened per second, 200 at a time, on tasks a
   producer keeps publishing to. Target: >= 1,000 streams/s.
7. ``fanout``  - events delivered per second per core of the bridge (its utime + stime from
   /proc/PID/stat) with 1,000 streams over 20 busy tasks; informational.
8. ``hot``     - one stream replaying a long task (200,000 events; 50,000 with --small)
   against a raw read_committed consumer reading the same records. Target: >= 60%.
9. ``run``     - the total wall time. Target: <= 5 minutes at full size.

``--variants`` then reruns ``hot`` and ``opens`` on a fresh bridge per
``BRIDGE_SERVER__LOOP`` x ``BRIDGE_SERVER__HTTP`` choice and prints them side by side, with the
event loop and HTTP parser the bridge process really loaded (from /proc/PID/maps).

The stages run in the order rss, latency, scale, bytes, opens, fanout, hot, storm (the RSS
baseline is taken on a server that has not served streams yet; the storm comes last, as a
bridge that missed the storm's bound is still busy with its reads for a while). The main
bridge runs with ``BRIDGE_SERVER__METRICS_REFRESH_S=3600``; a second, short-lived bridge measures what the default
gauge refresh fetches. A MISS is reported, never raised; a wait that is not a target and is
not reached fails the run with what was not reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
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
from bridge.envelope import decode_event
from bridge.kafka.clients import committed_consumer
from bridge.kafka.topics import create_layout
from bridge.log.identity import keyring_env
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.create import identity_header
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.vocabulary import CreatedPayload
from bridgedev.kafka import provide_broker

# --- targets ------------------------------------------------------------------------------------

TARGET_LATENCY_RATIO = 2.0  # bridge SSE latency / Kafka produce->consume latency (p50 and p99)
TARGET_BYTES_FLAT = 1.2  # bytes fetched with N streams / with 1 stream
TARGET_RSS_PER_STREAM_KIB = 20.0
TARGET_HOT_SHARE = 0.6  # bridge replay events/s / raw consumer events/s
TARGET_SCALE_P99_RATIO = 1.5  # p99 with 1,000 live streams / Kafka's p99, same window
#: (resuming streams, seconds until every one has its first event)
TARGET_STORM: dict[int, float] = {1_000: 1.0, 10_000: 10.0}
TARGET_OPENS_PER_S = 1_000.0
TARGET_WALL_S = 300.0  # the full run, without --variants

VERSION = "2026-07-28"
TASKS_CAPS: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
PRINCIPAL = "anonymous"  # auth mode none
TICK_TYPE = "com.example.bench.tick"
#: Streams being opened at once (each until it is live): well under uvicorn's backlog of 2048.
OPEN_CONCURRENCY = 200
#: TCP connects in flight at once in a storm (each stream then waits for its first event
#: without holding a slot): the clients come at once, the kernel's accept queue (uvicorn's
#: backlog of 2048) is what they meet.
STORM_CONNECTS = 1_000
#: Connection attempts of one storm client whose connection is reset before an answer.
STORM_ATTEMPTS = 8
#: The hot-path choices ``--variants`` compares (the bridge's BRIDGE_SERVER__LOOP / _HTTP).
VARIANTS = tuple((loop, http) for loop in ("asyncio", "uvloop") for http in ("h11", "httptools"))


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run (``FULL`` or ``SMALL``)."""

    rate: float  # events/s of the steady producers (latency, scale, bytes, opens)
    latency_s: float  # measured seconds of the latency and scale runs
    warmup_events: int  # sent (and discarded) before them, at least one per task
    fanouts: tuple[int, ...]  # stream counts of the bytes benchmark
    window_s: float  # production time of each bytes window
    idle_streams: int  # streams of the RSS benchmark
    hot_events: int  # events of the hot task, task.created and the terminal status included
    repeat: int  # raw read + replay pairs of the hot stage (the median ratio is reported)
    storms: tuple[int, ...]  # streams resuming at once, one storm each
    opens_s: float  # seconds of opening fresh streams
    scale: tuple[int, int]  # (tasks, streams per task) of the scale stage
    fanout: tuple[int, int, int]  # (tasks, streams per task, events) of the fanout stage


FULL = Sizes(
    200.0, 10.0, 100, (1, 100, 1000), 5.0, 10_000, 200_000, 5, (1_000, 10_000), 5.0,
    (100, 10), (20, 50, 4_000),
)  # fmt: skip
SMALL = Sizes(
    200.0, 5.0, 50, (1, 100, 1000), 5.0, 1_000, 50_000, 1, (1_000,), 3.0,
    (100, 10), (20, 50, 1_000),
)  # fmt: skip
STAGES = ("latency", "scale", "bytes", "rss", "storm", "opens", "fanout", "hot")


# --- results ------------------------------------------------------------------------------------

_ORDER = {name: i for i, name in enumerate((*STAGES, "variants", "run"))}


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        # The command name may hold spaces: fields are counted after its closing parenthesis;
        # utime and stime are fields 14 and 15, the 12th and 13th after it.
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds (utime + stime) the bridge and this process spend between :meth:`start` and
    :meth:`stop`: on 2 shared cores, whether the bench's own clients are the limit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.bridge = self.bench = 0.0
        self.opens = 0

    def start(self) -> None:
        self.bridge, self.bench = cpu_seconds(self.pid), cpu_seconds(os.getpid())

    def stop(self, opens: int) -> None:
        """The end of the window, in which ``opens`` streams were opened."""
        self.bridge = cpu_seconds(self.pid) - self.bridge
        self.bench = cpu_seconds(os.getpid()) - self.bench
        self.opens = opens

    def per_open_row(self, res: Results, stage: str, what: str) -> None:
        """One row: CPU ms per open of the bridge and of this process (clients, producer)."""
        n = max(1, self.opens)
        res.add(
            stage,
            f"  CPU per open ({what}): bridge / this process",
            f"{self.bridge / n * 1e3:.2f} / {self.bench / n * 1e3:.2f}",
            "ms",
        )


def hot_path(pid: int) -> str:
    """The event loop and HTTP parser process ``pid`` really runs, from the shared objects it
    mapped (uvicorn's ``auto`` picks uvloop and httptools when they are installed)."""
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
        maps = fh.read()
    loop = "uvloop" if "/uvloop/" in maps else "asyncio"
    http = "httptools" if "/httptools/" in maps else "h11"
    return f"{loop}+{http}"


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
            BRIDGE_KAFKA__BOOTSTRAP_SERVERS=self.settings.kafka.bootstrap_servers or "",
            BRIDGE_TOPICS__PREFIX=t.prefix,
            BRIDGE_TOPICS__PARTITIONS=str(t.partitions),
            BRIDGE_TOPICS__REPLICATION_FACTOR=str(t.replication_factor),
            BRIDGE_TOPICS__MIN_INSYNC_REPLICAS=str(t.min_insync_replicas),
            BRIDGE_LOG_LEVEL="WARNING",  # no access log lines for ten thousand requests
            PYTHONUNBUFFERED="1",
        )
        env.update(keyring_env(self.settings))  # the bench's own task.created are signed
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
#: How the bridge writes a notification's data line (its renderer's fixed head).
_NOTIFICATION_LINE = b'\ndata: {"jsonrpc":"2.0","method":"notifications/tasks/event",'


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
        if self.on_event is None:
            # A run of whole events that are all notifications (most of a replay): counted,
            # not split one by one. The client shares two cores with the bridge and the
            # broker; its per-event loop took a quarter of a core during a replay.
            end = body.rfind(b"\n\n")
            if end < 0:
                return
            run = body[: end + 2]
            notifications = run.count(_NOTIFICATION_LINE)
            if notifications == run.count(b"\n\n"):
                self.events += notifications
                if not self.first_event.done():
                    self.first_event.set_result(None)
                del body[: end + 2]
                return
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


async def wait_until(check: Callable[[], bool], bound_s: float, what: str) -> None:
    """Return once ``check()`` holds; NotReached naming ``what`` after ``bound_s``."""
    async with within(bound_s, what):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # poll interval of a bounded wait on the receivers


async def wait_quiet(
    bridge: BridgeProcess, stage: str, res: Results, bound_s: float = 30.0
) -> None:
    """Wait until the bridge used under 10% of a core over half a second, before ``stage``.

    A bridge still busy with the last stage's aftermath (freeing 10,000 streams, reads for a
    storm's closed streams) stalled the next measurement. A wait over a second is noted; one
    not reached within ``bound_s`` too (NotReached's text, with the share last seen), and the
    stage then runs anyway: an idle bridge that keeps working is itself a finding.
    """
    started = time.perf_counter()
    seen = "nothing yet"
    try:
        async with within(bound_s, "the bridge is quiet (< 10% of a core over 0.5 s)"):
            while True:
                cpu0, t0 = cpu_seconds(bridge.pid), time.perf_counter()
                await asyncio.sleep(0.5)  # the sampling interval of the CPU share
                share = (cpu_seconds(bridge.pid) - cpu0) / (time.perf_counter() - t0)
                seen = f"{share * 100:.0f}% of a core"
                if share < 0.1:
                    break
    except NotReached as exc:
        res.note(f"{stage}: {exc} (last seen: {seen}); the stage ran anyway")
        return
    waited = time.perf_counter() - started
    if waited > 1.0:
        res.note(f"{stage}: the bridge was busy for {waited:.1f} s before the stage")


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
    created = CreatedPayload(
        tool="bench",
        owner=owner_digest(PRINCIPAL),
        created_ms=now,
        ttl_ms=24 * 3_600_000,
        poll_interval_ms=1000,
    )
    event_type = f"{settings.tasks.event_type_prefix}.task.created"
    value, headers = pub.encode(event_type, created.to_dict(), None, now)
    # Signed with the bridge's keyring (the same settings): else it would define no task.
    headers = [*headers, identity_header(pub.keyring, event_type, task_id, created)]
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
    cpu = CpuMeter(pid)
    cpu.start()
    streams, open_s = await open_streams(bridge.port, task_ids, after=0, what="idle streams")
    settle_s = await wait_active(bridge, n, base_sockets)
    cpu.stop(n)
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
    cpu.per_open_row(res, "rss", "at the head: no Kafka read, no event")
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
        target=f"<= {TARGET_RSS_PER_STREAM_KIB:.0f} KiB",
        status=sized_verdict(per_stream <= TARGET_RSS_PER_STREAM_KIB, args),
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


async def live_latency(
    bridge: BridgeProcess, settings: Settings, tasks: list[str], per_task: int, sizes: Sizes
) -> tuple[list[float], list[float], int]:
    """Produce -> SSE and produce -> consume latencies (ms) of the same events.

    ``per_task`` live streams on each of ``tasks`` (resumed at seq 0: live once the bridge
    counts them); a plain read_committed consumer set up like the bridge's tail follows the
    partition; the SDK producer publishes round-robin over the tasks at ``sizes.rate``, after
    a warm-up. Returns (bridge samples, one per delivery; Kafka samples, one per event;
    events measured).
    """
    sse_at: dict[int, list[int]] = {}
    kafka_at: dict[int, int] = {}

    def on_sse(stream: SseStream, data: bytes) -> None:
        now = time.monotonic_ns()
        payload = json.loads(data)["params"]["payload"]
        if "t" in payload:
            sse_at.setdefault(payload["i"], []).append(now - payload["t"])

    base_sockets = socket_fds(bridge.pid)
    ids = [t for t in tasks for _ in range(per_task)]
    streams, _ = await open_streams(bridge.port, ids, on_sse, after=0, what="live streams")
    consumer = committed_consumer(settings, role="bench-tail")  # as the bridge's tail is set up
    stop = asyncio.Event()
    keys = {t.encode() for t in tasks}

    async def tail() -> None:
        while not stop.is_set():
            batches = await consumer.getmany(tp, timeout_ms=200)
            now = time.monotonic_ns()
            for record in batches.get(tp, []):
                if record.key not in keys:
                    continue
                payload = decode_event(record.value, record.headers).payload
                if "t" in payload:
                    kafka_at[payload["i"]] = now - payload["t"]

    tp = TopicPartition(settings.topics.events, 0)
    n = int(sizes.rate * sizes.latency_s)
    first = max(sizes.warmup_events, len(tasks))  # every task (so every stream) gets some
    wanted = range(first, first + n)
    tailing: asyncio.Task[None] | None = None
    await consumer.start()
    try:
        await wait_active(bridge, len(ids), base_sockets)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        tailing = asyncio.create_task(tail())
        async with TaskEventPublisher(settings) as pub:
            say(
                f"  {len(ids):,} stream(s); {first} warm-up events, then {n:,} at {sizes.rate:.0f}/s"
            )
            await steady_producer(settings, pub, tasks, sizes.rate, first)
            await wait_until(
                lambda: all(len(sse_at.get(i, ())) >= per_task for i in range(first)),
                30,
                f"every stream got its warm-up events ({first} over {len(tasks)} task(s))",
            )
            await steady_producer(settings, pub, tasks, sizes.rate, n, start_i=first)
        await wait_until(
            lambda: all(len(sse_at.get(i, ())) >= per_task and i in kafka_at for i in wanted),
            30,
            f"{n:,} events seen by each of their {per_task} stream(s) and by the consumer",
        )
    finally:
        stop.set()
        if tailing is not None:
            with contextlib.suppress(Exception):
                await tailing
        await consumer.stop()
        await close_streams(streams, bridge, base_sockets)
    sse = [x / 1e6 for i in wanted for x in sse_at[i]]
    raw = [kafka_at[i] / 1e6 for i in wanted]
    return sse, raw, n


def latency_rows(
    stage: str,
    what: str,
    sse: list[float],
    raw: list[float],
    targets: dict[int, float],
    res: Results,
) -> None:
    """The percentiles of both sides and the ratios bridge / Kafka at the ``targets``."""
    s50, s99, k50, k99 = pct(sse, 50), pct(sse, 99), pct(raw, 50), pct(raw, 99)
    res.add(
        stage,
        f"bridge produce->SSE p50 / p99 / max ({what})",
        f"{s50:.1f} / {s99:.1f} / {max(sse):.1f}",
        "ms",
    )
    res.add(
        stage,
        "Kafka produce->consume p50 / p99 / max (read_committed aiokafka)",
        f"{k50:.1f} / {k99:.1f} / {max(raw):.1f}",
        "ms",
    )
    for q, at_most in targets.items():
        res.add_ratio(stage, f"bridge / Kafka, p{q}", pct(sse, q) / pct(raw, q), at_most)


async def bench_latency(
    bridge: BridgeProcess, settings: Settings, task_id: str, sizes: Sizes, res: Results
) -> None:
    say("latency: one live stream")
    sse, raw, n = await live_latency(bridge, settings, [task_id], 1, sizes)
    what = f"{n:,} events, {sizes.rate:.0f}/s"
    latency_rows(
        "latency", what, sse, raw, {50: TARGET_LATENCY_RATIO, 99: TARGET_LATENCY_RATIO}, res
    )


async def bench_scale(
    bridge: BridgeProcess, settings: Settings, tasks: list[str], sizes: Sizes, res: Results
) -> None:
    per_task = sizes.scale[1]
    say(f"scale: {len(tasks) * per_task:,} live streams over {len(tasks)} tasks")
    sse, raw, n = await live_latency(bridge, settings, tasks, per_task, sizes)
    what = f"{len(tasks) * per_task:,} streams over {len(tasks)} tasks, {n:,} events, {len(sse):,} deliveries"
    latency_rows("scale", what, sse, raw, {99: TARGET_SCALE_P99_RATIO}, res)


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
    ports = broker_ports(settings.kafka.bootstrap_servers or "")
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
            # Resumed at seq 0, the head: live at once (fresh opens are the `opens` stage).
            streams, _ = await open_streams(bridge.port, tasks, after=0, what=f"streams (of {n})")
            await wait_active(bridge, n, base_sockets)
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
    ``server.metrics_refresh_s``; the main bridge runs with the refresh off so that the refresher's
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
    refresh = settings.server.metrics_refresh_s
    refreshes = max(1, round(window / refresh))  # about; the refresh at start is before it
    res.add("bytes", f"idle, default gauge refresh every {refresh:g} s, {window:.1f} s", rx, "B")
    res.add(
        "bytes",
        f"  per gauge refresh (~{refreshes} in the window, 1 partition)",
        rx / refreshes,
        "B",
    )


# --- 5. reconnect storm: resumes at the same moment ------------------------------------------------

#: Events of each storm task after its task.created; a storm resumes two events behind the head.
STORM_ROUNDS = 3


async def tasks_with_history(
    bridge: BridgeProcess, settings: Settings, n: int, rounds: int
) -> list[str]:
    """``n`` tasks with ``rounds`` events each after task.created, their records interleaved
    (every task.created, then each task's first event, ...), so that one task's records are
    spread over the partition; returns once the bridge indexed the last record."""
    pub = TaskEventPublisher(settings)
    ids = [new_task_id() for _ in range(n)]
    value, headers = pub.encode(TICK_TYPE, {"pad": "x" * 32})

    def records() -> Iterable[Record]:
        for task_id in ids:
            yield created_record(settings, pub, task_id)
        for _ in range(rounds):
            for task_id in ids:
                yield task_id.encode(), value, headers

    total = n * (rounds + 1)
    await produce(settings, records(), total)
    # The last record in log order is the last task's last event; the bridge indexes in log
    # order and a fresh stream gets it (from its history read or live) once it is indexed.
    probe = await open_stream(bridge.port, ids[-1])
    try:
        what = f"the bridge indexed the last of {total:,} interleaved records"
        await wait_until(lambda: probe.events >= rounds + 1, 120, what)
    finally:
        probe.close()
    return ids


async def storm(
    bridge: BridgeProcess, tasks: list[str], after: int, bound_s: float, cpu: CpuMeter
) -> tuple[list[float], int, str]:
    """Resume one stream per task at once with cursor ``after``; returns the seconds from the
    start to each stream's first event (all of them, or those within ``bound_s``), the
    connections the server reset before answering, and why not all (empty when all), once
    the bridge let go of every stream again. ``cpu`` measures from the start until every
    stream has its first event (or the bound).

    Requests are built beforehand; only the TCP connects are gated (``STORM_CONNECTS``), a
    stream then waits for its first event without holding a slot. A connection reset before
    any answer (the kernel's accept queue overflowed: with SYN cookies the client's connect
    succeeds, its request then meets a reset) is retried as a client would, after a short
    back-off; any other end without a first event fails that stream.
    """
    loop = asyncio.get_running_loop()
    port = bridge.port
    requests = [stream_request(port, t, next(_request_ids), after) for t in tasks]
    gate = asyncio.Semaphore(STORM_CONNECTS)
    streams: list[SseStream] = []
    firsts: list[float] = []
    failed: list[str] = []
    resets = 0
    base_sockets = socket_fds(bridge.pid)
    cpu.start()
    started = time.perf_counter()

    async def one(request: bytes) -> None:
        nonlocal resets
        for attempt in range(STORM_ATTEMPTS):
            if attempt:
                resets += 1
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))  # the client's back-off
            try:
                async with gate:
                    _, stream = await loop.create_connection(
                        lambda: SseStream(request), "127.0.0.1", port
                    )
            except OSError:
                continue  # refused or reset while connecting: retried
            streams.append(stream)
            try:
                await stream.first_event
            except RuntimeError as exc:
                if stream.status is None:
                    continue  # reset before any answer: retried
                failed.append(str(exc))
                return
            firsts.append(time.perf_counter() - started)
            return
        failed.append(f"no answer in {STORM_ATTEMPTS} attempts")

    why = ""
    try:
        async with within(bound_s, f"{len(tasks):,} resumed streams have their first event"):
            await asyncio.gather(*(one(r) for r in requests))
    except NotReached as exc:
        why = f"{exc} ({len(firsts):,} had it)"
    finally:
        cpu.stop(len(tasks))
        await close_streams(streams, bridge, base_sockets)
    if failed:
        why = f"{len(failed):,} of {len(tasks):,} streams failed, e.g. {failed[0]}. {why}".strip()
    return firsts, resets, why


async def bench_storm(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results
) -> None:
    total = sum(sizes.storms)
    say(f"storm: {total:,} tasks with {STORM_ROUNDS} interleaved events each")
    ids = await tasks_with_history(bridge, settings, total, STORM_ROUNDS)
    offset = 0
    for n in sizes.storms:
        target = TARGET_STORM[n]
        bound = 2 * target + 5
        # Quiet first, as before every stage: indexing and persisting the 44,000 records just
        # written (or closing the last storm's streams) is not what a resume costs.
        await wait_quiet(bridge, f"storm {n:,}", res)
        say(f"storm: {n:,} streams resume at once")
        cpu = CpuMeter(bridge.pid)
        firsts, resets, why = await storm(
            bridge, ids[offset : offset + n], STORM_ROUNDS - 2, bound, cpu
        )
        offset += n
        if why:
            res.note(f"storm: {n:,}: {why}")
        res.add(
            "storm",
            f"{n:,} resumes at once (2 events behind the head): every first event in",
            f"{max(firsts):.2f} s" if not why else f"only {len(firsts):,} of {n:,} in {bound:g} s",
            "",
            target=f"<= {target:g} s",
            status=verdict(not why and max(firsts) <= target),
        )
        res.add("storm", f"  {n:,} resumes: connections reset before an answer, retried", resets)
        cpu.per_open_row(res, "storm", f"{n:,} resumes")
        if firsts:
            res.add(
                "storm",
                f"  {n:,} resumes: first event p50 / p99 after the start"
                + (f" (of the {len(firsts):,} within the bound)" if why else ""),
                f"{pct(firsts, 50):.2f} / {pct(firsts, 99):.2f}",
                "s",
            )


# --- 6. fresh opens on a busy partition ------------------------------------------------------------

#: Tasks of the opens stage, each receiving events from the producer while streams open on them.
OPENS_TASKS = 100


async def open_for(
    port: int, tasks: list[str], seconds: float
) -> tuple[list[SseStream], list[float]]:
    """Open fresh streams on ``tasks`` round-robin, ``OPEN_CONCURRENCY`` at a time, for
    ``seconds``; returns every stream opened and the open times (connect to first event) of
    those opened within the window."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    ids = itertools.cycle(tasks)
    streams: list[SseStream] = []
    times: list[float] = []

    async def worker() -> None:
        while loop.time() < deadline:
            begun = loop.time()
            streams.append(await open_stream(port, next(ids)))
            if loop.time() <= deadline:
                times.append(loop.time() - begun)

    try:
        async with within(seconds + 60, f"the fresh streams begun within {seconds:g} s open"):
            await asyncio.gather(*(worker() for _ in range(OPEN_CONCURRENCY)))
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams, times


async def measure_opens(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, cpu: CpuMeter | None = None
) -> tuple[float, list[float]]:
    """Fresh streams opened per second on ``OPENS_TASKS`` new tasks that a producer publishes
    to meanwhile (round-robin at ``sizes.rate``); returns (rate, open times). ``cpu``, if
    given, measures the window of the opens."""
    tasks = await create_tasks(settings, OPENS_TASKS)
    await wait_visible(bridge.url, tasks)
    base_sockets = socket_fds(bridge.pid)
    count = int(sizes.rate * (sizes.opens_s + 1))
    async with TaskEventPublisher(settings) as pub:
        producing = asyncio.create_task(
            steady_producer(settings, pub, tasks, sizes.rate, count, start_i=20_000_000)
        )
        try:
            if cpu is not None:
                cpu.start()
            streams, times = await open_for(bridge.port, tasks, sizes.opens_s)
            if cpu is not None:
                cpu.stop(len(streams))
        finally:
            async with within(60, f"the opens stage's {count:,} events acknowledged"):
                await producing
    await close_streams(streams, bridge, base_sockets)
    return len(times) / sizes.opens_s, times


def opens_row(stage: str, metric: str, rate: float, res: Results) -> None:
    ok = verdict(rate >= TARGET_OPENS_PER_S)
    res.add(stage, metric, rate, "streams/s", target=f">= {TARGET_OPENS_PER_S:,.0f}/s", status=ok)


async def bench_opens(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results
) -> None:
    say(f"opens: fresh streams for {sizes.opens_s:g} s on {OPENS_TASKS} busy tasks")
    cpu = CpuMeter(bridge.pid)
    rate, times = await measure_opens(bridge, settings, sizes, cpu)
    opens_row(
        "opens",
        f"fresh streams opened ({OPEN_CONCURRENCY} at a time, {sizes.opens_s:g} s, "
        f"{OPENS_TASKS} tasks receiving {sizes.rate:.0f} events/s)",
        rate,
        res,
    )
    res.add(
        "opens",
        "  connect -> first event p50 / p99",
        f"{pct(times, 50) * 1e3:.0f} / {pct(times, 99) * 1e3:.0f}",
        "ms",
    )
    cpu.per_open_row(res, "opens", "every stream begun in the window; the producer too")


# --- 7. fan-out throughput per core ----------------------------------------------------------------


async def bench_fanout(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results
) -> None:
    """Events delivered per CPU second of the bridge: ``per_task`` live streams on each of
    ``n_tasks`` tasks, then a burst of ``n_events`` round-robin over the tasks (raw producer,
    under the per-stream queue so that no stream falls back to catch-up reads)."""
    n_tasks, per_task, n_events = sizes.fanout
    want = n_events * per_task
    tasks = await create_tasks(settings, n_tasks)
    await wait_visible(bridge.url, tasks)
    delivered, last_at = 0, 0.0

    def on_event(stream: SseStream, data: bytes) -> None:
        nonlocal delivered, last_at
        delivered += 1
        last_at = time.perf_counter()

    say(f"fanout: {n_tasks * per_task:,} streams over {n_tasks} tasks, {n_events:,} events")
    base_sockets = socket_fds(bridge.pid)
    ids = [t for t in tasks for _ in range(per_task)]
    streams, _ = await open_streams(bridge.port, ids, on_event, after=0, what="fan-out streams")
    pub = TaskEventPublisher(settings)
    value, headers = pub.encode(TICK_TYPE, {"pad": "x" * 32})

    def burst(count: int) -> Iterable[Record]:
        return ((tasks[i % n_tasks].encode(), value, headers) for i in range(count))

    try:
        await wait_active(bridge, len(ids), base_sockets)
        await produce(settings, burst(n_tasks), n_tasks)  # one event to each stream first
        await wait_until(
            lambda: delivered >= len(ids), 60, f"each of {len(ids):,} streams got a first event"
        )
        base = delivered
        cpu0, started = cpu_seconds(bridge.pid), time.perf_counter()
        clients0 = cpu_seconds(os.getpid())
        await produce(settings, burst(n_events), n_events)
        try:
            what = f"{want:,} events delivered to {len(ids):,} streams"
            await wait_until(lambda: delivered - base >= want, 120, what)
        except NotReached as exc:
            raise NotReached(f"{exc} ({delivered - base:,} delivered)") from None
        cpu = cpu_seconds(bridge.pid) - cpu0  # a few ms late at most: the bridge is idle now
        window = last_at - started
        clients = cpu_seconds(os.getpid()) - clients0
    finally:
        await close_streams(streams, bridge, base_sockets)
    res.add(
        "fanout",
        f"{len(ids):,} streams over {n_tasks} tasks: {want:,} events delivered in {window:.1f} s",
        want / window,
        "events/s",
    )
    res.add("fanout", "  per core (delivered / bridge utime+stime)", want / cpu, "events/CPU-s")
    res.add("fanout", "  bridge CPU over the window, of one core", cpu / window * 100, "%")
    res.add(
        "fanout",
        f"  this process (producer and {len(ids):,} clients) CPU over the window, of one core",
        clients / window * 100,
        "%",
    )


# --- 8. one hot stream vs a raw consumer -------------------------------------------------------------


async def raw_read(
    settings: Settings, start: int, end: int, key: bytes, decode: bool
) -> tuple[float, int, int]:
    """A raw read_committed consumer reads offsets [start, end).

    Default aiokafka settings (1 MiB per partition per fetch). Returns (seconds, records of
    the task, bytes this process received from the broker meanwhile).
    """
    ports = broker_ports(settings.kafka.bootstrap_servers or "")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
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


@dataclass(frozen=True)
class HotTask:
    """The long task of the hot stage: its id, event count and offsets [start, end)."""

    task_id: str
    events: int
    start: int
    end: int


async def make_hot_task(settings: Settings, n: int, res: Results) -> HotTask:
    """Write a task of ``n`` events (task.created, ticks, a terminal ``completed``)."""
    task_id = new_task_id()
    key = task_id.encode()
    pub = TaskEventPublisher(settings)
    values = [pub.encode(TICK_TYPE, {"i": i, "pad": "x" * 32}) for i in range(64)]
    status = pub.encode(f"{settings.tasks.event_type_prefix}.task.status", {"status": "completed"})

    def records() -> Iterable[Record]:
        yield created_record(settings, pub, task_id)
        for i in range(n - 2):
            value, headers = values[i % len(values)]
            yield key, value, headers
        yield key, status[0], status[1]

    start = await end_offset(settings)
    say(f"hot: producing {n:,} events of one task")
    produce_s = await produce(settings, records(), n)
    res.add("hot", f"produce {n:,} events (raw aiokafka, acks=1)", n / produce_s, "events/s")
    return HotTask(task_id, n, start, await end_offset(settings))


async def wait_completed(bridge: BridgeProcess, task_id: str) -> None:
    """Return once the bridge serves ``task_id`` as completed (it indexed the whole task)."""
    async with (
        httpx.AsyncClient(timeout=30) as http,
        within(120, "the bridge indexed the hot task (tasks/get says completed)"),
    ):
        while True:
            view = (await tasks_get(http, bridge.url, task_id)).get("result", {})
            if view.get("status") == "completed":
                return
            await asyncio.sleep(0.2)  # poll interval of a bounded wait on the bridge's indexer


async def replays(
    bridge: BridgeProcess, settings: Settings, hot: HotTask, repeat: int, res: Results
) -> tuple[list[float], list[int]]:
    """Replay the hot task ``repeat`` times through one fresh stream each, connect to result;
    returns (events/s, bytes the bridge fetched from Kafka) of each replay."""
    ports = broker_ports(settings.kafka.bootstrap_servers or "")
    rates: list[float] = []
    fetched: list[int] = []
    loop = asyncio.get_running_loop()
    for rep in range(repeat):
        snap0 = kafka_socket_bytes(bridge.pid, ports)
        request = stream_request(bridge.port, hot.task_id, next(_request_ids))
        started = time.perf_counter()
        _, stream = await loop.create_connection(
            lambda: SseStream(request),  # noqa: B023 - awaited within this iteration
            "127.0.0.1",
            bridge.port,
        )
        try:
            async with within(600, f"the replay of {hot.events:,} events reached its result"):
                final = await stream.done
        finally:
            stream.close()
        seconds = time.perf_counter() - started
        fetched.append(bytes_delta(snap0, kafka_socket_bytes(bridge.pid, ports))[0])
        if final.get("result") != {"resultType": "complete"} or stream.events != hot.events:
            res.note(f"hot: stream ended with {final} after {stream.events} of {hot.events} events")
        rates.append(stream.events / seconds)
        say(f"  tasks/stream rep {rep + 1}: {rates[-1]:,.0f} events/s ({seconds:.1f} s)")
    return rates, fetched


def hot_share_row(
    stage: str, metric: str, share: float, args: argparse.Namespace, res: Results
) -> None:
    res.add(
        stage,
        metric,
        f"{share * 100:.1f}",
        "%",
        target=f">= {TARGET_HOT_SHARE * 100:.0f}%",
        status=sized_verdict(share >= TARGET_HOT_SHARE, args),
    )


async def bench_hot(
    bridge: BridgeProcess,
    settings: Settings,
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
) -> tuple[HotTask, float]:
    """The hot stage; returns the task and the raw consumer's rate (for ``--variants``)."""
    n = sizes.hot_events
    hot = await make_hot_task(settings, n, res)
    await wait_completed(bridge, hot.task_id)
    key = hot.task_id.encode()
    # Pairs, back to back: a raw read of the task's range, then one replay. The host's speed
    # drifts within minutes (the report's calibration), and so does the broker's; each
    # pair's ratio sees the same moment, and the median of the ratios is the verdict.
    raws: list[float] = []
    rates: list[float] = []
    ratios: list[float] = []
    raw_rx: list[int] = []
    bridge_rx: list[int] = []
    for rep in range(sizes.repeat):
        seconds, count, received = await raw_read(settings, hot.start, hot.end, key, decode=False)
        raw_rx.append(received)
        if count != n:
            res.note(f"hot: raw consumer read {count} records of the task, expected {n}")
        raws.append(n / seconds)
        say(f"  pair {rep + 1}: raw consumer {n / seconds:,.0f} events/s")
        rate, fetched = await replays(bridge, settings, hot, 1, res)
        rates += rate
        bridge_rx += fetched
        ratios.append(rate[0] / raws[-1])
    decoded_s, _, _ = await raw_read(settings, hot.start, hot.end, key, decode=True)

    raw_best = statistics.median(raws)
    pairs = f"median of {len(ratios)} pairs" if len(ratios) > 1 else "one pair"
    res.add("hot", f"raw read_committed consumer, {n:,} records ({pairs})", raw_best, "events/s")
    res.add("hot", "  same, plus decode_event() of each record", n / decoded_s, "events/s")
    res.add(
        "hot",
        f"tasks/stream full replay to the result ({pairs}; range "
        f"{min(rates):,.0f}-{max(rates):,.0f})",
        statistics.median(rates),
        "events/s",
    )
    hot_share_row(
        "hot",
        f"tasks/stream / raw consumer (median of the pairs' ratios; range "
        f"{min(ratios) * 100:.0f}-{max(ratios) * 100:.0f}%)",
        statistics.median(ratios),
        args,
        res,
    )
    res.add(
        "hot",
        "  bytes fetched from Kafka for one replay: tasks/stream / raw consumer",
        f"{min(bridge_rx) / 2**20:.1f} / {min(raw_rx) / 2**20:.1f}",
        "MiB",
    )
    return hot, raw_best


# --- --variants: hot and opens per event loop / HTTP parser --------------------------------------


async def bench_variant(
    bridge: BridgeProcess,
    settings: Settings,
    hot: HotTask,
    raw_best: float,
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
) -> None:
    """``hot`` and ``opens`` again on a bridge started with one loop/HTTP choice."""
    loop, http = bridge.extra_env["BRIDGE_SERVER__LOOP"], bridge.extra_env["BRIDGE_SERVER__HTTP"]
    label = f"{loop}+{http} (runs {hot_path(bridge.pid)})"
    say(f"variants: {label}")
    await wait_completed(bridge, hot.task_id)  # a new bridge: it indexes the run's records first
    rates, _ = await replays(bridge, settings, hot, sizes.repeat, res)
    share = statistics.median(rates) / raw_best
    hot_share_row("variants", f"{label}: replay / raw consumer (medians)", share, args, res)
    rate, _ = await measure_opens(bridge, settings, sizes)
    opens_row("variants", f"{label}: fresh opens", rate, res)


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--small",
        action="store_true",
        help="smoke run (1k idle streams, one 1k storm, 50k-event replay), about 2.5 minutes",
    )
    parser.add_argument(
        "--only", choices=STAGES, action="append", help="run only these stages (repeatable)"
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="then rerun hot and opens per BRIDGE_SERVER__LOOP x BRIDGE_SERVER__HTTP choice",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the bridge's log directory")
    return parser.parse_args(argv)


def stages(args: argparse.Namespace) -> set[str]:
    only = set(args.only or STAGES)
    return only | {"hot"} if args.variants else only  # the variants replay the hot task


async def run(
    bridge: BridgeProcess,
    settings: Settings,
    sizes: Sizes,
    args: argparse.Namespace,
    res: Results,
    hot: list[tuple[HotTask, float]],
) -> None:
    """The stages against the main bridge; the hot task and raw rate are appended to ``hot``."""
    only = stages(args)
    wanted = {
        "latency": 1,
        "scale": sizes.scale[0],
        "bytes": sum(sizes.fanouts) + 1,
        "rss": sizes.idle_streams,
    }
    counts = [wanted[s] if s in only else 0 for s in wanted]
    if sum(counts):
        say(f"creating {sum(counts):,} tasks (task.created of principal {PRINCIPAL!r})")
        ids = await create_tasks(settings, sum(counts))
        await wait_visible(bridge.url, ids)
    else:
        ids = []
    ends = list(itertools.accumulate(counts))
    latency, scale, pool, idle = (ids[a:b] for a, b in zip([0, *ends], ends, strict=False))
    steps: list[tuple[str, Callable[[], Coroutine[Any, Any, Any]]]] = [
        ("rss", lambda: bench_rss(bridge, idle, args, res)),
        ("latency", lambda: bench_latency(bridge, settings, latency[0], sizes, res)),
        ("scale", lambda: bench_scale(bridge, settings, scale, sizes, res)),
        ("bytes", lambda: bench_bytes(bridge, settings, pool, sizes, res)),
        ("bytes", lambda: bench_gauges(settings, bridge.log_path.parent, sizes, res)),
        ("opens", lambda: bench_opens(bridge, settings, sizes, res)),
        ("fanout", lambda: bench_fanout(bridge, settings, sizes, res)),
        ("hot", lambda: bench_hot(bridge, settings, sizes, args, res)),
        # last: a bridge still reading for a missed storm's streams must not skew the others
        ("storm", lambda: bench_storm(bridge, settings, sizes, res)),
    ]
    for stage, step in steps:
        if stage in only:
            await wait_quiet(bridge, stage, res)
            result = await step()
            if stage == "hot":
                hot.append(result)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMALL if args.small else FULL
    res = Results(order=_ORDER)
    wall = time.perf_counter()
    soft, hard = raise_nofile()
    most = max(sizes.idle_streams, *sizes.storms)  # streams open at once, at most
    if soft < most + 1024:
        sizes = Sizes(**{**asdict(sizes), "idle_streams": max(100, soft - 1024)})
        res.note(
            f"RLIMIT_NOFILE is {soft} (hard {hard}): idle streams reduced to {sizes.idle_streams}"
        )
        sizes = Sizes(**{**asdict(sizes), "storms": tuple(n for n in sizes.storms if n < soft)})
    settings = load_settings()
    logs = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    with provide_broker(settings, progress=say) as broker:
        res.environment = environment(broker, settings)
        res.environment["size"] = "small" if args.small else "full"
        say(f"broker: {broker.info.provider} at {broker.info.bootstrap_servers}")
        bs = bench_settings(broker.info.bootstrap_servers, "streams")
        asyncio.run(create_layout(bs))  # no tools: tasks are made by writing task.created
        # At least 50,000: the opens stage keeps every stream it opens until its end, and a
        # fast bridge opened over 5,000 in the 3 s of --small (a CI run hit the 5 * 1,000 it
        # was). The server's descriptors (RLIMIT_NOFILE, in the report) bound it anyway.
        limit = str(max(5 * most, 50_000))
        env = {
            # Every stream is the one principal's (auth mode none), and a storm resumes
            # 10,000 at once: the per-principal, process and per-minute limits allow that.
            "BRIDGE_STREAMS__MAX_PER_PRINCIPAL": limit,
            "BRIDGE_STREAMS__MAX_TOTAL": limit,
            "BRIDGE_STREAMS__OPENS_PER_MINUTE": "10000000",
            "BRIDGE_STREAMS__KEEPALIVE_S": "3600",  # keep-alives must not dominate idle streams
            # The Kafka gauges' refresher reads up to 1 MiB per partition per refresh; off here
            # (one refresh at start), measured separately by bench_gauges.
            "BRIDGE_SERVER__METRICS_REFRESH_S": "3600",
        }
        bridge = BridgeProcess(bs, env, logs / "bridge.log")
        say(f"starting `bridge serve` (log: {bridge.log_path})")
        bridge.start()
        server_nofile = proc_nofile(bridge.pid)
        res.environment.update(
            bridge_pid=bridge.pid,
            bridge_hot_path=hot_path(bridge.pid),
            client_nofile=soft,
            server_nofile=server_nofile,
            topics_prefix=bs.topics.prefix,
            bridge_env=env,
        )
        if server_nofile < most + 256:
            res.note(f"the bridge's RLIMIT_NOFILE is {server_nofile}: too low for {most} streams")
        say(f"bridge pid {bridge.pid} on port {bridge.port}, RLIMIT_NOFILE {server_nofile}")
        hot: list[tuple[HotTask, float]] = []
        run_against(bridge, run(bridge, bs, sizes, args, res, hot), res)
        stages_s = time.perf_counter() - wall
        if args.variants:
            for loop, http in VARIANTS:
                variant_env = {**env, "BRIDGE_SERVER__LOOP": loop, "BRIDGE_SERVER__HTTP": http}
                other = BridgeProcess(bs, variant_env, logs / f"bridge-{loop}-{http}.log")
                other.start()
                run_against(other, bench_variant(other, bs, *hot[0], sizes, args, res), res)
    info = res.environment
    info["wall_seconds"] = round(time.perf_counter() - wall, 1)
    full_run = not args.only  # the wall-time target is the whole default run's
    res.add(
        "run",
        "wall time of the stages, broker and bridge start included"
        + (" (--variants after it excluded)" if args.variants else ""),
        stages_s,
        "s",
        target=f"<= {TARGET_WALL_S:g} s" if full_run else "",
        status=sized_verdict(stages_s <= TARGET_WALL_S, args) if full_run else "",
    )
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    report(
        res,
        f"bench_streams.py  size={info['size']}",
        f"bridge:  pid {info['bridge_pid']} runs {info['bridge_hot_path']}, RLIMIT_NOFILE "
        f"{info['server_nofile']}, {info['bridge_env']}  wall time {info['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
