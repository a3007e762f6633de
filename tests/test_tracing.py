"""OpenTelemetry tracing (bridge/tracing.py): one trace from a client's tools/call, through the
job record, the worker and its events' record headers, to the SSE write of each event.

The end-to-end tests run the real broker, the bridge under uvicorn on a real socket, an
in-process worker (the SDK) and a client over HTTP, with the SDK's in-memory span exporter. The
propagation rules themselves (which header wins, malformed input) are unit-tested fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.layout import fresh_prefix, make_settings
from support.mcp import StreamRead, read_stream, request
from support.waits import BOUND, wait_until
from test_canary import serving

from bridge import tracing
from bridge.config import Settings, load_settings
from bridge.envelope import TaskEvent, encode_event
from bridge.kafka.topics import topic_partition_ids
from bridge.log.records import RecordDecoder
from bridge.workers.sdk import JobContext, Worker

TOOL = "traced_job"
STEP = "com.example.traced.step"
PIPELINE = "com.example.pipeline.note"
MALFORMED = "com.example.pipeline.garbled"


def new_ids() -> tuple[str, str]:
    """A fresh (trace id, span id) in W3C hex."""
    return secrets.token_hex(16), secrets.token_hex(8)


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def hex_parent(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def traced_settings(kafka_bootstrap: str, **overrides: Any) -> Settings:
    tool = {"name": TOOL, "description": "emits, then waits for the test", "task": "required"}
    return make_settings(
        kafka_bootstrap, fresh_prefix("tr"), tools=[tool], tool_packs=[], **overrides
    )


@contextlib.asynccontextmanager
async def worker_running(settings: Settings, release: asyncio.Event) -> AsyncIterator[Worker]:
    """A worker whose job emits one STEP event, then waits for ``release`` to complete."""

    async def job(ctx: JobContext) -> dict[str, Any]:
        await ctx.emit(STEP, {"n": 1})
        await release.wait()
        return {"content": [{"type": "text", "text": "done"}]}

    async with Worker(settings, {TOOL: job}) as worker:
        runner = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


async def call_tool(base: str, headers: dict[str, str]) -> str:
    """tools/call of TOOL with extra HTTP ``headers``; the task id."""
    routing, body = request("tools/call", {"name": TOOL, "arguments": {}})
    async with httpx.AsyncClient(timeout=BOUND) as http:
        reply = await http.post(f"{base}/mcp", json=body, headers={**routing, **headers})
    created = reply.json()["result"]
    assert created["resultType"] == "task", created
    return str(created["taskId"])


async def produce(settings: Settings, task_id: str, event_type: str, trace: bytes) -> None:
    """An existing pipeline's record: a plain producer, its own ``traceparent`` header."""
    value, headers = encode_event(TaskEvent(event_type, {"from": "pipeline"}), fmt="json")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.topics.events,
            value,
            key=task_id.encode(),
            headers=[*headers, ("traceparent", trace)],
        )
    finally:
        await producer.stop()


def seq_of(read: StreamRead, event_type: str) -> int | None:
    return next((e["seq"] for e in read.events if e.get("type") == event_type), None)


def delivering(spans: list[ReadableSpan], task_id: str, seq: int) -> list[ReadableSpan]:
    """The deliver spans whose batch held ``seq`` of ``task_id``."""
    return [
        s
        for s in spans
        if s.name == "deliver"
        and (s.attributes or {}).get(tracing.TASK_ID) == task_id
        and int((s.attributes or {})["mcp.stream.first_seq"])  # type: ignore[arg-type]
        <= seq
        <= int((s.attributes or {})["mcp.stream.last_seq"])  # type: ignore[arg-type]
    ]


@pytest.mark.kafka
async def test_one_trace_links_a_tools_call_to_the_delivery_of_its_workers_events(
    kafka_bootstrap: str,
) -> None:
    settings = traced_settings(kafka_bootstrap)
    exporter = InMemorySpanExporter()
    client_trace, client_span = new_ids()
    pipeline_trace, pipeline_span = new_ids()
    release = asyncio.Event()
    with tracing.installed(settings, exporter=exporter):
        async with serving(settings) as served, worker_running(settings, release):
            url = f"{served.base}/mcp"
            task_id = await call_tool(
                served.base, {"traceparent": traceparent(client_trace, client_span)}
            )
            read = StreamRead()
            streaming = asyncio.create_task(read_stream(url, task_id, into=read))
            await wait_until(lambda: seq_of(read, STEP) is not None, what="the worker's event")
            # An existing pipeline writes to the same task under its own trace, then a record
            # whose traceparent is bytes no parser accepts.
            await produce(
                settings, task_id, PIPELINE, traceparent(pipeline_trace, pipeline_span).encode()
            )
            await wait_until(
                lambda: seq_of(read, PIPELINE) is not None, what="the pipeline's event"
            )
            await produce(settings, task_id, MALFORMED, b"\xff00-not-a-trace\x00")
            await wait_until(lambda: seq_of(read, MALFORMED) is not None, what="the garbled one")
            release.set()
            async with asyncio.timeout(BOUND):
                await streaming
    assert read.result is not None and read.error is None, read
    spans = list(exporter.get_finished_spans())

    # The client's tools/call: a server span in the client's trace, child of its span.
    (call,) = [s for s in spans if s.name == "tools/call"]
    assert hex_trace(call) == client_trace
    assert hex_parent(call) == client_span
    assert call.attributes is not None
    assert call.attributes["rpc.system"] == "jsonrpc"
    assert call.attributes["rpc.method"] == "tools/call"
    assert call.attributes[tracing.TASK_ID] == task_id
    # The worker's job span: the job record carried the tools/call span's context.
    (job,) = [s for s in spans if s.name == f"job {TOOL}"]
    assert hex_trace(job) == client_trace
    assert hex_parent(job) == hex_span(call)
    # The SSE writes of the worker's events (the step and the terminal status) are in it too.
    step = seq_of(read, STEP)
    assert step is not None
    delivered = delivering(spans, task_id, step)
    assert delivered, "no deliver span for the worker's event"
    assert {hex_trace(s) for s in delivered} == {client_trace}
    last = read.events[-1]["seq"]
    assert {hex_trace(s) for s in delivering(spans, task_id, last)} == {client_trace}

    # The pipeline's own traceparent: the write of its record is a span in the pipeline's trace.
    seq = seq_of(read, PIPELINE)
    assert seq is not None
    (piped,) = delivering(spans, task_id, seq)
    assert hex_trace(piped) == pipeline_trace
    assert hex_parent(piped) == pipeline_span
    # The garbled header is ignored: the event is delivered, and no span claims a parent from it.
    garbled = seq_of(read, MALFORMED)
    assert garbled is not None
    assert delivering(spans, task_id, garbled) == []
    assert all(hex_trace(s) in (client_trace, pipeline_trace) for s in spans if s.name == "deliver")


@pytest.mark.kafka
async def test_with_tracing_off_no_span_is_made_and_no_record_carries_a_trace(
    kafka_bootstrap: str,
) -> None:
    settings = traced_settings(kafka_bootstrap)
    assert not settings.tracing.enabled  # the default
    release = asyncio.Event()
    release.set()
    async with serving(settings) as served, worker_running(settings, release):
        assert not tracing.enabled()
        task_id = await call_tool(served.base, {"traceparent": traceparent(*new_ids())})
        read = await read_stream(f"{served.base}/mcp", task_id)
    assert read.result is not None and seq_of(read, STEP) is not None
    assert not tracing.enabled()
    # Neither the job record nor any task event carries a trace header.
    topics = [settings.topics.events, settings.topics.jobs(TOOL)]
    tps = [TopicPartition(t, p) for t in topics for p in await topic_partition_ids(settings, t)]
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        headers: list[tuple[str, bytes]] = []
        seen = 0
        remaining = set(tps)
        while remaining:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    if record.key == task_id.encode():
                        seen += 1
                        headers.extend(record.headers)
            remaining = {tp for tp in remaining if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    assert seen >= 4  # task.created, the job, the step, the terminal status
    assert [k for k, _ in headers if k in tracing.TRACE_HEADERS] == []


# --- propagation rules, without a broker -------------------------------------------------------


@pytest.fixture
def exporter() -> Any:
    exporter = InMemorySpanExporter()
    with tracing.installed(load_settings(), exporter=exporter):
        yield exporter


def test_meta_traceparent_wins_over_the_http_header(exporter: InMemorySpanExporter) -> None:
    meta_ids, header_ids = new_ids(), new_ids()
    params = {"taskId": "t-1", "_meta": {"traceparent": traceparent(*meta_ids)}}
    with tracing.rpc_span("tasks/get", {"traceparent": traceparent(*header_ids)}, params):
        pass
    with tracing.rpc_span("tasks/get", {"traceparent": traceparent(*header_ids)}, {}):
        pass
    first, second = exporter.get_finished_spans()
    assert (hex_trace(first), hex_parent(first)) == meta_ids
    assert (first.attributes or {})[tracing.TASK_ID] == "t-1"
    assert (hex_trace(second), hex_parent(second)) == header_ids


@pytest.mark.parametrize(
    "value",
    [
        b"\xff\xfe",
        b"garbage",
        b"00-" + b"0" * 32 + b"-" + b"1" * 16 + b"-01",  # the all-zero trace id is invalid
        b"00-" + b"a" * 32 + b"-" + b"0" * 16 + b"-01",  # so is the all-zero span id
        b"",
    ],
)
def test_a_malformed_record_traceparent_is_ignored(
    exporter: InMemorySpanExporter, value: bytes
) -> None:
    with tracing.job_span([("traceparent", value)], "t", "task-1"):
        pass
    event = tracing.with_trace(TaskEvent("com.example.x", {}), [("traceparent", value)])
    with tracing.deliver("task-1", [(0, event)]):
        pass
    (job,) = exporter.get_finished_spans()  # a job span without a parent, and no deliver span
    assert job.parent is None


def test_a_deliver_span_is_one_per_batch_with_links_to_the_other_traces(
    exporter: InMemorySpanExporter,
) -> None:
    ids = [new_ids() for _ in range(3)]
    events = [
        (seq, tracing.with_trace(TaskEvent("com.example.x", {}), [("traceparent", tp)]))
        for seq, tp in enumerate(traceparent(*i).encode() for i in [*ids, ids[0]])
    ]
    with tracing.deliver("task-1", events):
        pass
    (span,) = exporter.get_finished_spans()
    assert (hex_trace(span), hex_parent(span)) == ids[0]
    assert [
        (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links
    ] == ids[1:]
    assert (span.attributes or {})["mcp.stream.events"] == 4


def test_with_tracing_off_the_hooks_do_nothing() -> None:
    assert not tracing.enabled()
    assert tracing.record_headers() == ()
    event = TaskEvent("com.example.x", {})
    assert tracing.with_trace(event, [("traceparent", b"00-x")]) is event


def test_the_otlp_headers_are_a_secret() -> None:
    settings = load_settings(tracing={"enabled": True, "otlp_headers": "api-key=s3cr3t-value"})
    assert "s3cr3t" not in repr(settings)
    assert settings.tracing.otlp_header_map() == {"api-key": "s3cr3t-value"}
    with pytest.raises(ValueError) as raised:
        load_settings(tracing={"otlp_headers": "s3cr3t-without-equals"})
    assert "s3cr3t" not in str(raised.value)


def test_a_traced_event_keeps_the_wire_text_the_decoder_validated(
    exporter: InMemorySpanExporter,
) -> None:
    """The trace headers are added to the event, not in place of the payload's JSON text that
    the stream writes as it came (a traced replay must not fall back to re-serialising)."""
    value, headers = encode_event(TaskEvent("com.example.x", {"b": 1, "a": [1, 2]}, {"k": "v"}))
    trace = ("traceparent", traceparent(*new_ids()).encode())
    record = ConsumerRecord(
        topic="t",
        partition=0,
        offset=7,
        timestamp=0,
        timestamp_type=0,
        key=b"task-1",
        value=value,
        checksum=None,
        serialized_key_size=6,
        serialized_value_size=len(value),
        headers=(*headers, trace),
    )
    decoded = RecordDecoder("io.mcpbridge", 1 << 20).event(record)
    assert decoded.trace is not None
    assert (decoded.payload_json, decoded.meta_json) == ('{"b":1,"a":[1,2]}', '{"k":"v"}')
