"""SEP-2694's open questions measured on one Kafka log: tasks/stream, the Events extension's
poll and push, and subscriptions/listen, all served by a real ``bridge serve`` subprocess.

Run::

    .venv/bin/python bench/bench_open_questions.py            # full size, ~4 minutes here
    .venv/bin/python bench/bench_open_questions.py --small    # smoke run, ~1 minute
    .venv/bin/python bench/bench_open_questions.py --only fanout --json out.json

The broker comes from ``bridgedev.kafka.provide_broker`` (the configured cluster, else Docker,
else a throwaway local KRaft broker). One ``bridge serve`` on fresh topics
(``bench-openq-<8 hex>.*``, one events partition, auth mode none: every request is the
principal ``anonymous``); tasks are created by publishing their ``task.created``, and their
events with the producer SDK, so no worker is involved. All traffic is loopback HTTP/1.1.

What is measured (docs/sep-2694-open-questions.md has the tables and what they answer):

1. ``fanout``    - N clients (1, 10, 100, 500; 1, 10, 50 with --small) stream ONE busy task with
   ``tasks/stream`` while a producer publishes at a steady rate; a tenth of them (none when
   N = 1) stop reading until the bridge has counted their slow-consumer fallback. Per N: the
   fast clients' produce -> SSE latency (p50/p99), whether every client (slow ones included)
   got every event gap-free, how long the slow ones took to recover their backlog, and what
   the bridge fetched from Kafka (``ss`` byte counters of its broker sockets, and the
   ``bridge_stream_catchup_reads_total`` / ``bridge_stream_slow_consumer_fallbacks_total``
   counters of its ``/metrics``).
2. ``cost``      - the same task through ``tasks/stream``, ``events/stream`` (push),
   ``events/poll`` and ``subscriptions/listen``: bytes on the wire per event and events/s for
   a full replay of a finished task, and live (one client of each kind on one busy task)
   bytes per event and latency. ``subscriptions/listen`` carries full task states, not events.
3. ``retention`` - a cursor behind retention (the log start moved with ``DeleteRecords``): what
   ``tasks/stream`` answers (events_gone with earliestSeq) and what ``events/poll`` and
   ``events/stream`` answer for the same task and cursor (``truncated: true``), verbatim.

The stages run in the order fanout, cost, retention (retention deletes records of the one
partition, so it comes last). No targets: the numbers answer questions, they do not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.structs import TopicPartition
from bench_streams import (
    TICK_TYPE,
    BridgeProcess,
    SseStream,
    broker_ports,
    bytes_delta,
    create_tasks,
    kafka_socket_bytes,
    mcp_body,
    mcp_headers,
    pct,
    raise_nofile,
    run_against,
    server_metric,
    steady_producer,
    stream_request,
    wait_visible,
)
from common import Record, Results, bench_settings, environment, produce, report, say

from bridge.config import Settings, load_settings
from bridge.events_extension.cursor import decode_task, encode_task
from bridge.kafka.admin import delete_records_before
from bridge.kafka.topics import create_layout
from bridge.log.publisher import Published, TaskEventPublisher
from bridgedev.kafka import provide_broker

OPEN_CONCURRENCY = 100  # streams being opened at once
QUEUE_SIZE = 32  # BRIDGE_STREAMS__QUEUE_SIZE of the bridge under test
#: Payload padding of the busy task's events: a partial-content chunk of two kilobytes.
PAD = "x" * 2048
#: SO_RCVBUF of a slow client's socket: a small window, so that its stall reaches the bridge's
#: bounded buffer within seconds instead of after megabytes of loopback socket buffers.
SLOW_RCVBUF = 4096
#: The MSS a slow client announces (IPv4's default minimum): on loopback (64 KiB MSS) Linux sizes the
#: bridge's send buffer for that connection at its maximum (4 MiB here), which would absorb
#: ten thousand events before the bridge's own buffer saw the stall.
SLOW_MSS = 536
#: The bytes of a notifications/tasks/event before its seq (the bridge's renderer writes it
#: first), so that a client of hundreds of streams reads each seq without parsing JSON.
_SEQ_HEAD = b'{"jsonrpc":"2.0","method":"notifications/tasks/event","params":{"seq":'
_ids = itertools.count(1_000_000)


@dataclass(frozen=True)
class Sizes:
    fanouts: tuple[int, ...]  # clients on the one busy task
    rate: float  # events/s of the busy task
    window_s: float  # production time of each fan-out run and of the live comparison
    slow_share: float  # share of the clients that stop reading
    replay_events: int  # events of the finished task replayed by each channel
    retained_events: int  # events of the retention task (half are deleted)


FULL = Sizes((1, 10, 100, 500), 30.0, 15.0, 0.1, 20_000, 400)
SMALL = Sizes((1, 10, 50), 30.0, 10.0, 0.1, 2_000, 100)
_ORDER = {"fanout": 0, "cost": 1, "retention": 2}


# --- clients --------------------------------------------------------------------------------------


class CountedStream(SseStream):
    """Any SSE response of the bridge, with the bytes received on its connection counted.

    ``SseStream`` hands ``notifications/tasks/event`` to ``on_event`` unparsed and treats any
    other message as the end of the stream; here the other notifications (events/*,
    subscriptions/*, notifications/tasks) are parsed and handed to ``on_message`` instead.
    """

    def __init__(
        self,
        request: bytes,
        on_event: Callable[[SseStream, bytes], None] | None = None,
        on_message: Callable[[CountedStream, dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(request, on_event)
        self.on_message = on_message
        self.wire_bytes = 0
        self.notifications = 0
        self.ended_at = 0.0

    def data_received(self, data: bytes) -> None:
        self.wire_bytes += len(data)
        super().data_received(data)

    def _finish(self, message: dict[str, Any]) -> None:
        if "method" in message and not self.done.done():
            self.notifications += 1
            if not self.first_event.done():
                self.first_event.set_result(None)
            if self.on_message is not None:
                self.on_message(self, message)
            return
        if not self.done.done():
            self.ended_at = time.perf_counter()
        super()._finish(message)


def post(port: int, method: str, params: dict[str, Any], name: str | None = None) -> bytes:
    """One HTTP/1.1 request of ``method`` (keep-alive)."""
    body = mcp_body(method, params, next(_ids))
    head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in mcp_headers(method, name).items()]
    head += [f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(head).encode() + body


async def connect(
    port: int,
    request: bytes,
    *,
    on_event: Callable[[SseStream, bytes], None] | None = None,
    on_message: Callable[[CountedStream, dict[str, Any]], None] | None = None,
    rcvbuf: int | None = None,
) -> CountedStream:
    """Send ``request`` on a new connection (a small receive buffer if ``rcvbuf``)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf is not None:  # before connect: the window and the MSS are agreed in the handshake
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SLOW_MSS)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    _, stream = await loop.create_connection(
        lambda: CountedStream(request, on_event, on_message), sock=sock
    )
    return stream


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[dict[str, Any], int]:
    """One JSON request/answer on a keep-alive connection: the answer, and its bytes on the
    wire (status line and headers included)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.decode("latin-1").lower().split("content-length:", 1)[1].split("\r\n")[0])
    body = await reader.readexactly(length)
    return json.loads(body), len(head) + length


async def call_once(port: int, request: bytes) -> tuple[dict[str, Any], int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await exchange(reader, writer, request)
    finally:
        writer.close()


def metric(bridge: BridgeProcess, name: str) -> float:
    return server_metric(bridge.port, name) or 0.0


async def counters(bridge: BridgeProcess, *names: str) -> list[float]:
    return [await asyncio.to_thread(metric, bridge, name) for name in names]


def seq_of(data: bytes) -> int:
    if data.startswith(_SEQ_HEAD):
        return int(data[len(_SEQ_HEAD) : data.index(b",", len(_SEQ_HEAD))])
    return int(json.loads(data)["params"]["seq"])


def gap_free(seqs: list[int], head: int) -> bool:
    """Exactly 0, 1, ..., head, each once and in order."""
    return seqs == list(range(head + 1))


def task_event_name(settings: Settings) -> str:
    return f"{settings.own_types.prefix}.task.event"


def status_type(settings: Settings) -> str:
    return f"{settings.own_types.prefix}.task.status"


# --- 1. N clients on one busy task ---------------------------------------------------------------


@dataclass
class Padded:
    """A publisher whose events carry :data:`PAD` (``steady_producer`` takes it for the SDK's)."""

    pub: TaskEventPublisher

    async def publish(self, task_id: str, event_type: str, payload: dict[str, Any]) -> Published:
        return await self.pub.publish(task_id, event_type, {**payload, "pad": PAD})


@dataclass(eq=False)
class Track:
    """What one tasks/stream client received: each seq and when (monotonic ns)."""

    slow: bool
    keep_raw: bool = False
    seqs: list[int] = field(default_factory=list)
    at: list[int] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    stream: CountedStream | None = None
    resumed_ns: int = 0
    backlog_to: int = -1  # the reference client's last seq when this one resumed reading

    def on_event(self, _stream: SseStream, data: bytes) -> None:
        self.at.append(time.monotonic_ns())
        self.seqs.append(seq_of(data))
        if self.keep_raw:
            self.raw.append(data)

    def sent_ns(self) -> dict[int, int]:
        """seq -> the producer's send time, from the payloads this client kept."""
        out = {}
        for data in self.raw:
            params = json.loads(data)["params"]
            if "t" in params["payload"]:
                out[params["seq"]] = params["payload"]["t"]
        return out

    def recovered_s(self) -> float:
        """Seconds from resuming until the backlog present at that moment was received."""
        for seq, at in zip(self.seqs, self.at, strict=True):
            if seq >= self.backlog_to and at >= self.resumed_ns:
                return (at - self.resumed_ns) / 1e9
        return float("nan")


async def open_tracked(port: int, task_id: str, tracks: list[Track]) -> None:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(track: Track) -> None:
        async with gate:
            rcvbuf = SLOW_RCVBUF if track.slow else None
            request = stream_request(port, task_id, next(_ids))
            track.stream = await connect(port, request, on_event=track.on_event, rcvbuf=rcvbuf)
            await track.stream.first_event  # seq 0 arrived: the stream is live on the bridge

    async with asyncio.timeout(300):
        await asyncio.gather(*(one(t) for t in tracks))


async def stall(
    bridge: BridgeProcess, slow: list[Track], reference: Track, base: float, bound_s: float
) -> float:
    """Stop the slow clients reading until the bridge has counted a fallback for each (or
    ``bound_s`` passed); returns how long they stalled."""
    for track in slow:
        assert track.stream is not None and track.stream.transport is not None
        track.stream.transport.pause_reading()
    started = time.perf_counter()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(bound_s):
            fallbacks = "bridge_stream_slow_consumer_fallbacks_total"
            while await counters(bridge, fallbacks) < [base + len(slow)]:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # poll interval of a bounded wait on the bridge
    stalled = time.perf_counter() - started
    now, head = time.monotonic_ns(), reference.seqs[-1]
    for track in slow:
        track.resumed_ns, track.backlog_to = now, head
        assert track.stream is not None and track.stream.transport is not None
        track.stream.transport.resume_reading()
    return stalled


async def fanout_run(
    bridge: BridgeProcess, settings: Settings, n: int, sizes: Sizes, res: Results
) -> None:
    (task_id,) = await create_tasks(settings, 1)
    await wait_visible(bridge.url, [task_id])
    n_slow = int(n * sizes.slow_share)
    tracks = [Track(slow=i >= n - n_slow, keep_raw=i == 0) for i in range(n)]
    reference, slow = tracks[0], [t for t in tracks if t.slow]
    say(f"fanout: {n} clients ({n_slow} slow) on one task")
    await open_tracked(bridge.port, task_id, tracks)
    names = (
        "bridge_stream_catchup_reads_total",
        "bridge_stream_slow_consumer_fallbacks_total",
        "bridge_stream_events_delivered_total",
    )
    ports = broker_ports(settings.kafka.bootstrap_servers or "")
    reads0, falls0, delivered0 = await counters(bridge, *names)
    snap0 = kafka_socket_bytes(bridge.pid, ports)
    count = int(sizes.rate * sizes.window_s)
    started = time.perf_counter()
    async with TaskEventPublisher(settings) as pub:
        padded = Padded(pub)
        producing = asyncio.create_task(
            steady_producer(settings, padded, [task_id], sizes.rate, count)  # type: ignore[arg-type]
        )
        stalled = 0.0
        if slow:
            async with asyncio.timeout(30):
                while len(reference.seqs) < 1 + count // 20:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # poll interval of a bounded wait for the stream
            stalled = await stall(bridge, slow, reference, falls0, sizes.window_s)
        await producing
        await pub.publish(task_id, status_type(settings), {"status": "completed"})
    head = count + 1  # task.created, the ticks, the terminal status
    async with asyncio.timeout(120):
        finals = await asyncio.gather(*(t.stream.done for t in tracks if t.stream is not None))
    elapsed = time.perf_counter() - started
    snap1 = kafka_socket_bytes(bridge.pid, ports)
    reads1, falls1, delivered1 = await counters(bridge, *names)
    for track in tracks:
        assert track.stream is not None
        track.stream.close()

    sent = reference.sent_ns()
    fast = [t for t in tracks if not t.slow]
    latencies = [
        (at - sent[seq]) / 1e6
        for t in fast
        for seq, at in zip(t.seqs, t.at, strict=True)
        if seq in sent
    ]
    complete = sum(f.get("result") == {"resultType": "complete"} for f in finals)
    whole = sum(gap_free(t.seqs, head) for t in tracks)
    received = bytes_delta(snap0, snap1)[0]
    label = f"N={n:>3} ({n_slow} slow)"
    p50, p99 = pct(latencies, 50), pct(latencies, 99)
    res.add(
        "fanout", f"{label}: fast clients produce->SSE p50 / p99", f"{p50:.1f} / {p99:.1f}", "ms"
    )
    res.add(
        "fanout",
        f"{label}: clients with all {head + 1} events gap-free, result received",
        f"{whole} / {complete} of {n}",
    )
    if slow:
        recovered = [t.recovered_s() for t in slow]
        got = sorted({len(t.seqs) for t in slow})
        res.add(
            "fanout",
            f"{label}: slow clients stalled until their fallback / recovered the backlog in (max)",
            f"{stalled:.1f} / {max(recovered):.2f}",
            "s",
        )
        res.add("fanout", f"{label}: events each slow client received", str(got))
    res.add(
        "fanout",
        f"{label}: bridge received from Kafka (per produced event)",
        f"{received / 1024:.0f} KiB ({received / (count + 1):.0f} B)",
    )
    res.add(
        "fanout",
        f"{label}: catch-up reads / slow-consumer fallbacks (bridge /metrics)",
        f"{reads1 - reads0:.0f} / {falls1 - falls0:.0f}",
    )
    res.add(
        "fanout",
        f"{label}: deliveries (events x clients) per second",
        (delivered1 - delivered0) / elapsed,
        "events/s",
    )


async def bench_fanout(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results
) -> None:
    for n in sizes.fanouts:
        await fanout_run(bridge, settings, n, sizes, res)


# --- 2. one task through each channel -------------------------------------------------------------


@dataclass
class Channel:
    """One way of reading a task's events: what it received and what that cost on the wire."""

    name: str
    events: int = 0
    wire_bytes: int = 0
    sent_bytes: int = 0
    requests: int = 1
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    other: int = 0  # messages that carry no event (active, heartbeat, acknowledged, states)

    def saw(self, payload: dict[str, Any]) -> None:
        self.events += 1
        if "t" in payload:
            self.latencies_ms.append((time.monotonic_ns() - payload["t"]) / 1e6)


async def produce_finished_task(settings: Settings, n: int) -> str:
    """A task with ``n`` events (created, ticks, completed) written by a raw producer."""
    pub = TaskEventPublisher(settings)
    (task,) = await create_tasks(settings, 1)  # its seq 0
    key = task.encode()
    tick = pub.encode(TICK_TYPE, {"i": 0, "pad": "x" * 32})
    done = pub.encode(status_type(settings), {"status": "completed"})

    def records() -> Iterable[Record]:
        for _ in range(n - 2):
            yield key, tick[0], tick[1]
        yield key, done[0], done[1]

    await produce(settings, records(), n - 1)
    return task


async def replay_tasks_stream(port: int, task_id: str) -> Channel:
    ch = Channel("tasks/stream")
    request = stream_request(port, task_id, next(_ids))
    started = time.perf_counter()
    stream = await connect(port, request, on_event=lambda _s, _d: None)
    async with asyncio.timeout(600):
        await stream.done
    ch.seconds = stream.ended_at - started
    ch.events, ch.wire_bytes, ch.sent_bytes = stream.events, stream.wire_bytes, len(request)
    stream.close()
    return ch


def events_params(settings: Settings, task_id: str, cursor: str | None) -> dict[str, Any]:
    return {"name": task_event_name(settings), "arguments": {"taskId": task_id}, "cursor": cursor}


async def replay_events_stream(port: int, settings: Settings, task_id: str) -> Channel:
    ch = Channel("events/stream (push)")

    def on_message(_s: CountedStream, message: dict[str, Any]) -> None:
        if message["method"] == "notifications/events/event":
            ch.events += 1
        else:
            ch.other += 1

    request = post(port, "events/stream", events_params(settings, task_id, encode_task(-1)))
    started = time.perf_counter()
    stream = await connect(port, request, on_message=on_message)
    async with asyncio.timeout(600):
        await stream.done
    ch.seconds = stream.ended_at - started
    ch.wire_bytes, ch.sent_bytes = stream.wire_bytes, len(request)
    stream.close()
    return ch


async def replay_events_poll(port: int, settings: Settings, task_id: str) -> Channel:
    """events/poll from before the first event, 1000 at a time, until hasMore is false."""
    ch = Channel("events/poll (maxEvents 1000)", requests=0)
    cursor = encode_task(-1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    try:
        while True:
            params = {**events_params(settings, task_id, cursor), "maxEvents": 1000}
            request = post(port, "events/poll", params)
            answer, size = await exchange(reader, writer, request)
            result = answer["result"]
            ch.requests += 1
            ch.sent_bytes += len(request)
            ch.wire_bytes += size
            ch.events += len(result["events"])
            cursor = result["cursor"]
            if not result["hasMore"]:
                break
    finally:
        writer.close()
    ch.seconds = time.perf_counter() - started
    return ch


async def listen_state(port: int, task_id: str) -> Channel:
    """subscriptions/listen on the task: the acknowledgement and its current state."""
    ch = Channel("subscriptions/listen")
    got = asyncio.get_running_loop().create_future()

    def on_message(_s: CountedStream, message: dict[str, Any]) -> None:
        ch.other += 1
        if message["method"] == "notifications/tasks" and not got.done():
            got.set_result(message)

    request = post(port, "subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
    started = time.perf_counter()
    stream = await connect(port, request, on_message=on_message)
    async with asyncio.timeout(60):
        await got
    ch.seconds = time.perf_counter() - started
    ch.wire_bytes, ch.sent_bytes = stream.wire_bytes, len(request)
    stream.close()
    return ch


def add_channel(res: Results, what: str, ch: Channel, expected: int) -> None:
    per_event = ch.wire_bytes / ch.events if ch.events else float("nan")
    rate = ch.events / ch.seconds if ch.seconds else float("nan")
    name = f"{what} {ch.name}"
    res.add(
        "cost",
        f"{name}: events / requests / other messages",
        f"{ch.events} of {expected} / {ch.requests} / {ch.other}",
    )
    res.add(
        "cost",
        f"{name}: bytes received (sent), per event",
        f"{ch.wire_bytes:,} ({ch.sent_bytes:,}), {per_event:.0f} B",
    )
    if ch.latencies_ms:
        lat = ch.latencies_ms
        res.add(
            "cost",
            f"{name}: produce->client p50 / p99",
            f"{pct(lat, 50):.1f} / {pct(lat, 99):.1f}",
            "ms",
        )
    else:
        res.add("cost", f"{name}: events/s ({ch.seconds:.2f} s)", rate, "events/s")


async def live_channels(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes
) -> tuple[list[Channel], int]:
    """One client of each kind on one busy task while it runs; returns them and the events."""
    port = bridge.port
    (task_id,) = await create_tasks(settings, 1)
    await wait_visible(bridge.url, [task_id])
    ts, push, poll, listen = (
        Channel("tasks/stream"),
        Channel("events/stream (push)"),
        Channel("events/poll (every nextPollMs)", requests=0),
        Channel("subscriptions/listen"),
    )

    def on_task_event(_s: SseStream, data: bytes) -> None:
        ts.saw(json.loads(data)["params"]["payload"])

    def on_push(_s: CountedStream, message: dict[str, Any]) -> None:
        if message["method"] == "notifications/events/event":
            push.saw(message["params"]["data"]["payload"])
        else:
            push.other += 1

    def on_listen(_s: CountedStream, message: dict[str, Any]) -> None:
        listen.other += 1

    requests = [
        stream_request(port, task_id, next(_ids)),
        post(port, "events/stream", events_params(settings, task_id, None)),
        post(port, "subscriptions/listen", {"notifications": {"taskIds": [task_id]}}),
    ]
    streams = [
        await connect(port, requests[0], on_event=on_task_event),
        await connect(port, requests[1], on_message=on_push),
        await connect(port, requests[2], on_message=on_listen),
    ]
    async with asyncio.timeout(30):
        await asyncio.gather(*(s.first_event for s in streams))  # all three are live
    first, _ = await call_once(
        port, post(port, "events/poll", events_params(settings, task_id, None))
    )
    polling = asyncio.create_task(poll_until_done(port, settings, task_id, first["result"], poll))
    count = int(sizes.rate * sizes.window_s)
    async with TaskEventPublisher(settings) as pub:
        await steady_producer(settings, pub, [task_id], sizes.rate, count)
        await pub.publish(task_id, status_type(settings), {"status": "completed"})
    async with asyncio.timeout(120):
        await asyncio.gather(streams[0].done, streams[1].done, polling)
        while listen.other < 3:  # noqa: ASYNC110 - acknowledged, working, completed
            await asyncio.sleep(0.05)  # poll interval of a bounded wait for the last state
    for ch, stream, request in zip((ts, push, listen), streams, requests, strict=True):
        ch.wire_bytes, ch.sent_bytes = stream.wire_bytes, len(request)
        stream.close()
    return [ts, push, poll, listen], count + 1  # the ticks and the terminal status


async def poll_until_done(
    port: int, settings: Settings, task_id: str, first: dict[str, Any], ch: Channel
) -> None:
    """Poll as the server asks (every nextPollMs) until the task's terminal status arrived."""
    cursor, wait_ms = first["cursor"], first["nextPollMs"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            await asyncio.sleep(wait_ms / 1000)  # the poll cadence the server asked for
            request = post(
                port, "events/poll", {**events_params(settings, task_id, cursor), "maxEvents": 1000}
            )
            answer, size = await exchange(reader, writer, request)
            result = answer["result"]
            ch.requests += 1
            ch.sent_bytes += len(request)
            ch.wire_bytes += size
            for event in result["events"]:
                ch.saw(event["data"]["payload"])
            cursor, wait_ms = result["cursor"], 0 if result["hasMore"] else result["nextPollMs"]
            if any(e["data"]["type"] == status_type(settings) for e in result["events"]):
                return
    finally:
        writer.close()


async def bench_cost(bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results) -> None:
    n = sizes.replay_events
    say(f"cost: a finished task of {n:,} events, replayed by each channel")
    task_id = await produce_finished_task(settings, n)
    async with asyncio.timeout(120):
        while True:
            answer, _ = await call_once(
                bridge.port, post(bridge.port, "tasks/get", {"taskId": task_id}, task_id)
            )
            if answer.get("result", {}).get("status") == "completed":
                break
            await asyncio.sleep(0.2)  # poll interval of a bounded wait on the indexer
    port = bridge.port
    for ch in (
        await replay_tasks_stream(port, task_id),
        await replay_events_stream(port, settings, task_id),
        await replay_events_poll(port, settings, task_id),
    ):
        add_channel(res, "replay", ch, n)
    listen = await listen_state(port, task_id)
    res.add(
        "cost",
        "replay subscriptions/listen: messages / bytes received (no events: the task's state)",
        f"{listen.other} / {listen.wire_bytes:,} B",
    )
    say(f"cost: one client of each kind on a busy task, {sizes.rate:.0f} events/s")
    channels, expected = await live_channels(bridge, settings, sizes)
    # tasks/stream starts at the task's seq 0 (no cursor); events/stream and events/poll at
    # "now" (cursor null), so they owe only what happened after they opened.
    for ch, owed in zip(channels[:3], (expected + 1, expected, expected), strict=True):
        add_channel(res, "live", ch, owed)
    listen = channels[3]
    res.add(
        "cost",
        f"live subscriptions/listen: messages / bytes received while {expected} events happened",
        f"{listen.other} / {listen.wire_bytes:,} B",
    )


# --- 3. a cursor behind retention -------------------------------------------------------------------


async def sse_messages_until(
    port: int, request: bytes, enough: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The first messages of a push stream, until ``enough`` of them (bounded)."""
    got: list[dict[str, Any]] = []
    ready = asyncio.get_running_loop().create_future()

    def on_message(_s: CountedStream, message: dict[str, Any]) -> None:
        got.append(message)
        if enough(got) and not ready.done():
            ready.set_result(None)

    stream = await connect(port, request, on_message=on_message)
    try:
        async with asyncio.timeout(60):
            await asyncio.wait([ready, stream.done], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.close()
    return got


def brief(message: dict[str, Any]) -> dict[str, Any]:
    """A notification without its payload bulk: what the doc shows."""
    params = dict(message.get("params", {}))
    params.pop("_meta", None)
    if "data" in params:
        params["data"] = {
            "seq": params["data"]["seq"],
            "type": params["data"]["type"],
            "...": "...",
        }
    if "cursor" in params:
        params["cursor"] = f"{params['cursor']} (= seq {decode_task(params['cursor'])})"
    return {"method": message["method"], "params": params}


async def bench_retention(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, res: Results
) -> None:
    n = sizes.retained_events
    port = bridge.port
    (task_id,) = await create_tasks(settings, 1)
    await wait_visible(bridge.url, [task_id])
    async with TaskEventPublisher(settings) as pub:
        published: list[Published] = [
            await pub.publish(task_id, TICK_TYPE, {"i": i}) for i in range(n)
        ]
    cut = n // 2  # ticks 0..cut-1 (seqs 1..cut) go
    cursor = 10  # a client that processed seq 10, then went away
    say(f"retention: {n} events; DeleteRecords before seq {cut + 1}; a client at seq {cursor}")
    tp = TopicPartition(settings.topics.events, published[cut].partition)
    await delete_records_before(settings, tp, published[cut].offset)
    earliest = cut + 1

    started = time.perf_counter()
    gone, _ = await call_once(port, stream_request(port, task_id, next(_ids), cursor))
    gone_ms = (time.perf_counter() - started) * 1000
    gone.pop("id", None)
    res.add("retention", f"tasks/stream after={cursor}: answer in", gone_ms, "ms")
    res.note(f"retention: tasks/stream after={cursor} -> {json.dumps(gone)}")

    params = {**events_params(settings, task_id, encode_task(cursor)), "maxEvents": 5}
    polled, _ = await call_once(port, post(port, "events/poll", params))
    result = polled["result"]
    shown = {**result, "events": [e["eventId"] for e in result["events"]]}
    shown["cursor"] = f"{result['cursor']} (= seq {decode_task(result['cursor'])})"
    res.add(
        "retention",
        f"events/poll cursor=seq {cursor}: truncated, first eventId",
        f"{result['truncated']}, {result['events'][0]['eventId'] if result['events'] else '-'}",
    )
    res.note(f"retention: events/poll cursor=seq {cursor}, maxEvents 5 -> {json.dumps(shown)}")

    def two_events(got: list[dict[str, Any]]) -> bool:
        return sum(bool(m["method"] == "notifications/events/event") for m in got) >= 2

    request = post(port, "events/stream", events_params(settings, task_id, encode_task(cursor)))
    pushed = await sse_messages_until(port, request, two_events)
    res.note(
        f"retention: events/stream cursor=seq {cursor} -> "
        + " ; ".join(json.dumps(brief(m)) for m in pushed)
    )
    truncated = [m["params"].get("truncated") for m in pushed if m["method"].endswith("/active")]
    res.add(
        "retention", f"events/stream cursor=seq {cursor}: active truncated flags", str(truncated)
    )

    # The recovery SEP-2694 suggests: resume from earliestSeq - 1.
    async with TaskEventPublisher(settings) as pub:
        await pub.publish(task_id, status_type(settings), {"status": "completed"})
    track = Track(slow=False)
    resumed = await connect(
        port, stream_request(port, task_id, next(_ids), earliest - 1), on_event=track.on_event
    )
    async with asyncio.timeout(60):
        final = await resumed.done
    resumed.close()
    expect = list(range(earliest, n + 2))
    res.add(
        "retention",
        f"tasks/stream after=earliestSeq-1={earliest - 1}: events, gap-free to the result",
        f"{len(track.seqs)}, {track.seqs == expect and 'result' in final}",
    )
    gone_opens = await asyncio.to_thread(metric, bridge, 'bridge_stream_opens_total{mode="gone"}')
    res.add("retention", 'bridge_stream_opens_total{mode="gone"}', gone_opens)


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="smoke run (N up to 50, 2k events)")
    parser.add_argument(
        "--only",
        choices=tuple(_ORDER),
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        action="append",
        help="client counts of the fanout part (repeatable; default 1, 10, 100, 500)",
    )
    parser.add_argument(
        "--queue-size",
        type=int,
        default=QUEUE_SIZE,
        help=f"BRIDGE_STREAMS__QUEUE_SIZE of the bridge (default {QUEUE_SIZE}; the bridge's is 1024)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the bridge's log directory")
    return parser.parse_args(argv)


async def run(
    bridge: BridgeProcess, settings: Settings, sizes: Sizes, only: set[str], res: Results
) -> None:
    if "fanout" in only:
        await bench_fanout(bridge, settings, sizes, res)
    if "cost" in only:
        await bench_cost(bridge, settings, sizes, res)
    if "retention" in only:  # last: it deletes records of the one events partition
        await bench_retention(bridge, settings, sizes, res)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMALL if args.small else FULL
    if args.clients:
        sizes = dataclasses.replace(sizes, fanouts=tuple(args.clients))
    only = set(args.only or _ORDER)
    res = Results(order=_ORDER)
    wall = time.perf_counter()
    raise_nofile()
    settings = load_settings()
    logs = Path(tempfile.mkdtemp(prefix="bench-openq-"))
    with provide_broker(settings, progress=say) as broker:
        res.environment = environment(broker, settings)
        res.environment["size"] = "small" if args.small else "full"
        bs = bench_settings(broker.info.bootstrap_servers, "openq")
        asyncio.run(create_layout(bs))
        bridge_env = {
            "BRIDGE_STREAMS__MAX_PER_PRINCIPAL": str(max(sizes.fanouts) + 100),
            "BRIDGE_STREAMS__OPENS_PER_MINUTE": "1000000",  # every client is one principal
            "BRIDGE_STREAMS__KEEPALIVE_S": "3600",  # no keep-alive bytes in the counts
            "BRIDGE_SERVER__METRICS_REFRESH_S": "3600",  # no gauge reads in the Kafka byte counts
            # A 32nd of the default 1024: a stalled client overflows it (after ~260 KB of
            # socket buffers) within ~5 s at 30 events/s instead of ~38 s, inside every window.
            "BRIDGE_STREAMS__QUEUE_SIZE": str(args.queue_size),
        }
        bridge = BridgeProcess(bs, bridge_env, logs / "bridge.log")
        say(f"starting `bridge serve` (log: {bridge.log_path})")
        bridge.start()
        res.environment.update(
            bridge_pid=bridge.pid, topics_prefix=bs.topics.prefix, bridge_env=bridge_env
        )
        run_against(bridge, run(bridge, bs, sizes, only, res), res)
    env = res.environment
    env["wall_seconds"] = round(time.perf_counter() - wall, 1)
    if not args.keep_logs:
        shutil.rmtree(logs, ignore_errors=True)
    report(
        res,
        f"bench_open_questions.py  size={env['size']}",
        f"bridge:  {env['bridge_env']}  busy task {sizes.rate:.0f} events/s for "
        f"{sizes.window_s:.0f} s, {sizes.slow_share:.0%} slow clients  wall time "
        f"{env['wall_seconds']} s",
        json_path=args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
