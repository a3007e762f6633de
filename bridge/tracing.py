"""OpenTelemetry tracing: one trace from a client's tools/call to the SSE write of its events.

Where it sits in the flow (every hook elsewhere is a line or two calling into this module, the
only one that imports ``opentelemetry``)::

    HTTP request (traceparent header, or params._meta.traceparent: SEP-414)
      -> rpc_span: a SERVER span per JSON-RPC method
         (bridge.server.handlers.MethodHandlers.dispatch)
      -> record_headers: traceparent/tracestate on the task.created and job records
         (bridge.tasks.service, bridge.log.publisher)
      -> job_span: the worker's CONSUMER span, parented to the job record's context; the
         task events it publishes carry its context (bridge.workers.sdk)
      -> with_trace: the tail and the reader keep a record's trace headers on its event,
         whoever wrote it (an existing pipeline's own traceparent too; bridge.log.records)
      -> deliver: one span per SSE write batch of a stream, parented to the first traced event
         of the batch and linked to the other traces in it (bridge.server.handlers)

Off by default. While off, every hook returns at a single module-global test: no provider,
no exporter, no span objects, no header parsing on the tail. Spans are never made per event
(a replay of a long history makes one span per written batch); the task id is a span
attribute, never a metric label. Trace headers carry no authority: they only ever choose a
span's parent, so a record's headers can never change who owns a task. Malformed headers (a
producer can write any bytes) are ignored: the span then has no parent from them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge.config import Settings, TracingSettings
from bridge.envelope import TaskEvent

__all__ = [
    "TRACE_HEADERS",
    "TracingUnavailable",
    "deliver",
    "enabled",
    "installed",
    "job_span",
    "record_headers",
    "rpc_span",
    "set_task_id",
    "with_trace",
]

log = logging.getLogger(__name__)

#: The W3C Trace Context keys carried in Kafka record headers, HTTP headers and ``_meta``.
TRACE_HEADERS = ("traceparent", "tracestate")
#: Links a deliver span keeps to the other traces of its batch (the rest are counted only).
_MAX_LINKS = 32
#: The span attribute naming the task (an attribute: task ids are unbounded).
TASK_ID = "mcp.task.id"

_PROPAGATOR = TraceContextTextMapPropagator()
_NO_HEADERS: tuple[tuple[str, bytes], ...] = ()
#: What every hook returns while tracing is off: one shared, reusable no-op.
_NULL: AbstractContextManager[None] = contextlib.nullcontext()


class TracingUnavailable(RuntimeError):
    """Tracing is enabled but the OpenTelemetry SDK (the ``tracing`` extra) is missing."""


class _State:
    """The process's tracer while tracing is installed; ``tracer is None`` means off."""

    tracer: Tracer | None = None


_state = _State()


def enabled() -> bool:
    """Whether spans are being made (tracing installed in this process)."""
    return _state.tracer is not None


@contextlib.contextmanager
def installed(settings: Settings, exporter: Any = None) -> Iterator[None]:
    """Trace in this process while in the block when ``settings.tracing.enabled`` (or when
    ``exporter``, a SpanExporter, is given: tests pass the SDK's in-memory one).

    Nested use keeps the first installation (an app started inside a test that installed its
    own exporter). Leaving the block flushes and shuts the exporter down.
    """
    config = settings.tracing
    if _state.tracer is not None or (exporter is None and not config.enabled):
        yield
        return
    provider = _provider(config, exporter)
    _state.tracer = provider.get_tracer("bridge")
    try:
        yield
    finally:
        _state.tracer = None
        provider.shutdown()


def _provider(config: TracingSettings, exporter: Any) -> Any:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        raise TracingUnavailable(
            "tracing is enabled (BRIDGE_TRACING__ENABLED) but the OpenTelemetry SDK is not "
            "installed: pip install 'mcp-kafka-bridge[tracing]'"
        ) from None
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES; the configured name wins.
    resource = Resource.create({SERVICE_NAME: config.service_name})
    # Parent-based: a caller's sampling decision (the traceparent flags) is kept end to end.
    sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler)
    if exporter is not None:
        # A test's exporter: spans are visible the moment they end.
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(config)))
    log.info(
        "tracing on: OTLP/HTTP export to %s, sample ratio %s, service %s",
        config.otlp_endpoint,
        config.sample_ratio,
        config.service_name,
    )  # the headers are secret: never logged
    return provider


def _otlp_exporter(config: TracingSettings) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingUnavailable(
            "tracing is enabled but the OTLP exporter is not installed: pip install "
            "'mcp-kafka-bridge[tracing]'"
        ) from None
    # Headers: the SDK merges OTEL_EXPORTER_OTLP_*HEADERS under these (ours win per key).
    return OTLPSpanExporter(endpoint=config.otlp_endpoint, headers=config.otlp_header_map())


# --- the server side: a span per JSON-RPC method ---------------------------------------------


def _incoming(headers: Mapping[str, str], params: Mapping[str, Any]) -> Context | None:
    """The caller's context: ``params._meta`` (SEP-414) first, else the HTTP headers."""
    meta = params.get("_meta")
    if isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
        carrier = {k: meta[k] for k in TRACE_HEADERS if isinstance(meta.get(k), str)}
    else:
        carrier = {k: headers[k] for k in TRACE_HEADERS if headers.get(k) is not None}
    return _valid(_PROPAGATOR.extract(carrier)) if carrier else None


def _valid(context: Context) -> Context | None:
    # The propagator returns an empty context for a malformed traceparent: no parent then.
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def rpc_span(
    method: str, headers: Mapping[str, str], params: Mapping[str, Any]
) -> AbstractContextManager[None]:
    """A SERVER span around one JSON-RPC method, child of the caller's trace context."""
    tracer = _state.tracer
    return _NULL if tracer is None else _rpc_span(tracer, method, headers, params)


@contextlib.contextmanager
def _rpc_span(
    tracer: Tracer, method: str, headers: Mapping[str, str], params: Mapping[str, Any]
) -> Iterator[None]:
    attributes: dict[str, str] = {
        "rpc.system": "jsonrpc",
        "rpc.method": method,
        "mcp.method.name": method,
    }
    task_id = params.get("taskId")
    if isinstance(task_id, str):
        attributes[TASK_ID] = task_id
    with tracer.start_as_current_span(
        method, context=_incoming(headers, params), kind=SpanKind.SERVER, attributes=attributes
    ):
        yield


def set_task_id(task_id: str) -> None:
    """Name the task on the current span (tools/call learns its task id mid-call)."""
    if _state.tracer is not None:
        trace.get_current_span().set_attribute(TASK_ID, task_id)


# --- Kafka records: inject, extract ---------------------------------------------------------


def record_headers() -> Sequence[tuple[str, bytes]]:
    """The current span's context as Kafka record headers (none when off or outside a span)."""
    if _state.tracer is None:
        return _NO_HEADERS
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [(k, v.encode("ascii")) for k, v in carrier.items()]


def _record_context(headers: Sequence[tuple[str, bytes]] | None) -> Context | None:
    """The context a record's headers name, or None (absent or malformed: ignored)."""
    carrier: dict[str, str] = {}
    for key, value in headers or ():
        name = key.lower() if isinstance(key, str) else ""
        if name in TRACE_HEADERS and isinstance(value, bytes):
            try:
                carrier[name] = value.decode("ascii")
            except UnicodeDecodeError:
                return None
    if "traceparent" not in carrier:
        return None
    return _valid(_PROPAGATOR.extract(carrier))


def job_span(
    headers: Sequence[tuple[str, bytes]] | None, tool: str, task_id: str
) -> AbstractContextManager[None]:
    """The worker's CONSUMER span for one job, child of the job record's context; the events
    the job publishes inside it carry its context."""
    tracer = _state.tracer
    return _NULL if tracer is None else _job_span(tracer, headers, tool, task_id)


@contextlib.contextmanager
def _job_span(
    tracer: Tracer, headers: Sequence[tuple[str, bytes]] | None, tool: str, task_id: str
) -> Iterator[None]:
    with tracer.start_as_current_span(
        f"job {tool}",
        context=_record_context(headers),
        kind=SpanKind.CONSUMER,
        attributes={TASK_ID: task_id, "mcp.tool.name": tool},
    ):
        yield


def with_trace(event: TaskEvent, headers: Sequence[tuple[str, bytes]] | None) -> TaskEvent:
    """``event`` carrying its record's trace headers (unparsed), when tracing is on and the
    record has any; the event itself otherwise (the tail's cost while off: one test)."""
    if _state.tracer is None or not headers:
        return event
    kept = tuple(
        (k.lower(), v)
        for k, v in headers
        if isinstance(k, str) and k.lower() in TRACE_HEADERS and isinstance(v, bytes)
    )
    if not kept:
        return event
    # The constructor, not dataclasses.replace: several times cheaper, once per traced record.
    return TaskEvent(
        event.type,
        event.payload,
        event.meta,
        event.timestamp_ms,
        payload_json=event.payload_json,  # the wire text goes on as it came
        meta_json=event.meta_json,
        trace=kept,
    )


# --- the stream side: a span per SSE write --------------------------------------------------


def _batch_contexts(
    batch: Sequence[tuple[int, TaskEvent | str]],
) -> tuple[Context | None, list[Link], int]:
    """The first traced event's context, links to the other traces, how many traces (a str,
    an event's wire text, carries none: a reader makes them only while tracing is off)."""
    parent: Context | None = None
    links: list[Link] = []
    seen: set[tuple[tuple[str, bytes], ...]] = set()
    spans: set[tuple[int, int]] = set()
    for _, event in batch:
        raw = None if isinstance(event, str) else event.trace
        if raw is None or raw in seen:
            continue
        seen.add(raw)
        context = _record_context(raw)
        if context is None:
            continue
        span_context = trace.get_current_span(context).get_span_context()
        key = (span_context.trace_id, span_context.span_id)
        if key in spans:
            continue
        spans.add(key)
        if parent is None:
            parent = context
        elif len(links) < _MAX_LINKS:
            links.append(Link(span_context))
    return parent, links, len(spans)


def deliver(
    task_id: str, batch: Sequence[tuple[int, TaskEvent | str]]
) -> AbstractContextManager[None]:
    """A span around the SSE write of one batch of a stream, when any event of it is traced.

    Its parent is the first traced event's context; the other traces of the batch are links.
    The span is not made current (the block holds a ``yield`` of an async generator, which may
    resume in another context), so nothing inside it can attach to it by accident.
    """
    tracer = _state.tracer
    return _NULL if tracer is None else _deliver(tracer, task_id, batch)


@contextlib.contextmanager
def _deliver(
    tracer: Tracer, task_id: str, batch: Sequence[tuple[int, TaskEvent | str]]
) -> Iterator[None]:
    try:
        parent, links, traces = _batch_contexts(batch)
    except Exception:  # tracing must never cost a delivery
        log.exception("could not read the trace context of a batch; delivering it untraced")
        parent = None
    if parent is None:
        yield
        return
    span = tracer.start_span(
        "deliver",
        context=parent,
        kind=SpanKind.INTERNAL,
        links=links,
        attributes={
            TASK_ID: task_id,
            "mcp.stream.events": len(batch),
            "mcp.stream.first_seq": batch[0][0],
            "mcp.stream.last_seq": batch[-1][0],
            "mcp.stream.traces": traces,
        },
    )
    try:
        yield
    finally:
        span.end()
