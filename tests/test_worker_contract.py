"""The published worker contract (docs/workers.md, schemas/) against what the bridge and the
Python worker SDK really write.

The unit tests check that every schema is a valid JSON Schema, that it accepts what the SDK's
message classes produce and refuses what the contract forbids. The Kafka test runs tasks
through the task service and an SDK worker on the real broker (progress, input, cancel,
failure, success), then reads every record of the job topics, the control topic and the events
topic and validates each against the schema of its kind: the Avro records against the
published ``schemas/task_event.avsc`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fastavro
import jsonschema
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from support.contract import JSON_SCHEMAS, SCHEMAS, invalid, valid
from support.layout import create_topics, make_settings
from support.services import task_service
from support.topics import TopicRecord, topic_records

from bridge.config import Settings, ToolSpec
from bridge.envelope import AVRO_CONTENT_TYPE, TaskEvent, decode_event, encode_event
from bridge.keyring import IDENTITY_HEADER
from bridge.tasks.messages import ControlMessage, JobRequest, new_task_id, owner_digest
from bridge.tasks.service import TaskView
from bridge.vocabulary import CreatedPayload, StatusPayload
from bridge.workers.packs import pack_handlers, pack_tools
from bridge.workers.sdk import JobError, Worker

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60


# --- the schemas themselves -------------------------------------------------------------------


@pytest.mark.parametrize("path", JSON_SCHEMAS, ids=lambda p: p.name)
def test_each_published_schema_is_a_json_schema_with_its_file_name_as_id(path: Path) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["$id"] == path.name
    assert "worker contract v1" in document["title"]


def test_the_published_avro_schema_is_the_one_the_bridge_encodes_with() -> None:
    published = (SCHEMAS / "task_event.avsc").read_text(encoding="utf-8")
    packaged = (ROOT / "bridge" / "schemas" / "task_event.avsc").read_text(encoding="utf-8")
    assert json.loads(published) == json.loads(packaged)


# --- the SDK's message classes, without Kafka -------------------------------------------------


def test_job_requests_as_the_bridge_writes_them_validate() -> None:
    job = JobRequest(
        task_id=new_task_id(),
        tool="greet",
        arguments={"name": "W"},
        created_ms=1,
        partition=2,
        offset=3,
    )
    valid("job-request", job.to_dict())
    answered = job.model_copy(update={"input_responses": {"who": {"action": "accept"}}})
    valid("job-request", answered.to_dict())
    expiring = job.model_copy(update={"ttl_ms": 60_000})
    assert expiring.to_dict()["ttlMs"] == 60_000
    valid("job-request", expiring.to_dict())
    invalid("job-request", {**expiring.to_dict(), "ttlMs": 0})
    invalid("job-request", {**job.to_dict(), "createdMs": "yesterday"})
    invalid("job-request", {k: v for k, v in job.to_dict().items() if k != "offset"})


def test_control_messages_as_the_bridge_and_the_sdk_write_them_validate() -> None:
    task_id = new_task_id()
    valid("control-message", ControlMessage(type="cancel", task_id=task_id).to_dict())
    valid("control-message", ControlMessage(type="finished", task_id=task_id).to_dict())
    answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    message = ControlMessage(type="input", task_id=task_id, input_responses=answer)
    valid("control-message", message.to_dict())
    invalid("control-message", {"type": "input", "taskId": task_id})  # answers missing
    invalid("control-message", {"type": "pause", "taskId": task_id})


def test_status_payloads_as_the_sdk_writes_them_validate() -> None:
    request = {"confirm": {"method": "elicitation/create", "params": {"message": "Sure?"}}}
    for status in (
        StatusPayload(status="working", status_message="input received"),
        StatusPayload(status="input_required", input_requests=request, status_message="?"),
        StatusPayload(status="completed", result={"content": [{"type": "text", "text": "ok"}]}),
        StatusPayload.failed("no handler for tool x"),
        StatusPayload(status="failed", status_message="bad", error=JobError(-32602, "bad").error()),
        StatusPayload(status="cancelled", status_message="cancelled at the client's request"),
        StatusPayload(status="cancelled", status_message="cancelled before it started"),
    ):
        valid("status", status.payload())
    invalid("status", {"status": "Completed", "result": {"content": []}})  # names are exact
    invalid("status", {"status": "input_required"})  # nothing asked
    invalid("status", {"status": "completed", "result": {"structuredContent": {}}})  # no content
    invalid("status", {"status": "failed", "error": {"message": "no code"}})


def test_created_and_progress_payloads_validate() -> None:
    created = CreatedPayload(
        tool="greet", owner=owner_digest("alice"), created_ms=5, ttl_ms=60_000, poll_interval_ms=500
    )
    valid("task-created", created.to_dict())
    unlimited = created.model_copy(update={"ttl_ms": None})
    valid("task-created", unlimited.to_dict())
    invalid("task-created", {**created.to_dict(), "owner": "alice"})  # a digest, never a name
    valid("progress", {"progress": 50, "total": 100, "message": "half"})
    invalid("progress", {"total": 100})


def test_the_json_envelope_the_codec_writes_validates_and_strays_do_not() -> None:
    event = TaskEvent("com.example.log.line", {"text": "hi"}, {"k": 1}, 1_700_000_000_000)
    value, headers = encode_event(event, fmt="json")
    assert headers == [("content-type", b"application/json")]
    valid("event-envelope", json.loads(value))
    valid("event-envelope", {"type": "com.example.x", "payload": {}})  # timestamp optional
    invalid("event-envelope", {"type": "com.example.x", "payload": {}, "seq": 3})
    invalid("event-envelope", {"type": "com.example.x", "payload": [1]})
    invalid("event-envelope", {"type": "bad type", "payload": {}})


# --- what really crosses Kafka ----------------------------------------------------------------

TOOLS = {t.name: t for t in pack_tools(["conformance"])}
RUN = [
    "test_tool_with_progress",
    "confirm_delete",
    "slow_compute",
    "failing_job",
    "greet",
    "test_tool_with_task",  # input_before: the job request carries inputResponses
]
#: A tool whose jobs share greet's topic, which the SDK worker has no handler for.
UNHANDLED = ToolSpec(name="unhandled", job_topic=None)


@contextlib.asynccontextmanager
async def sdk_worker(settings: Settings) -> AsyncIterator[Worker]:
    handlers = pack_handlers(["conformance"])
    async with Worker(settings, {name: handlers[name] for name in RUN}) as worker:
        runner = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


async def _run_every_kind_of_task(settings: Settings) -> dict[str, StatusPayload]:
    """Every path of the SDK's worker; the outcome of each task, by the tool's name."""
    unhandled = UNHANDLED.model_copy(update={"job_topic": settings.topics.jobs("greet")})
    named = {"input_before": {"action": "accept", "content": {"name": "W"}}}
    async with task_service(settings) as service:
        # Before any worker runs: a task cancelled before its job starts.
        early = await service.create(TOOLS["greet"], {"name": "early"}, "alice")
        await service.cancel(early.task_id, "alice")
        async with sdk_worker(settings):
            done = {
                "test_tool_with_progress": await service.create(
                    TOOLS["test_tool_with_progress"], {}, "alice"
                ),
                "failing_job": await service.create(TOOLS["failing_job"], {}, "alice"),
                "greet": await service.create(TOOLS["greet"], {"name": "W"}, "alice"),
                "unhandled": await service.create(unhandled, {}, "alice"),
                "test_tool_with_task": await service.create(
                    TOOLS["test_tool_with_task"],
                    {},
                    "alice",
                    input_responses={"user_name": named["input_before"]},
                ),
            }
            asked = await service.create(TOOLS["confirm_delete"], {"filename": "a.txt"}, "alice")
            slow = await service.create(
                TOOLS["slow_compute"], {"seconds": 60, "label": "x"}, "alice"
            )
            done |= {"confirm_delete": asked, "slow_compute": slow, "early": early}
            async with asyncio.timeout(BOUND):
                await service.wait_until(asked.task_id, "alice", frozenset({"input_required"}))
                answer = {"action": "accept", "content": {"confirm": True}}
                await service.update(asked.task_id, "alice", {"confirm": answer})
                await service.cancel(slow.task_id, "alice")
                return {
                    name: _outcome(await service.wait_terminal(task.task_id, "alice"))
                    for name, task in done.items()
                }


def _outcome(view: TaskView) -> StatusPayload:
    return StatusPayload(
        status=view.status, status_message=view.status_message, result=view.result, error=view.error
    )


def _check_event(settings: Settings, record: TopicRecord, seen: dict[str, int]) -> None:
    headers = list(record.headers)
    event = decode_event(record.value, headers)
    content_type = dict(headers).get("content-type", b"").decode()
    if content_type == AVRO_CONTENT_TYPE:
        _check_avro_body(record.value or b"")
    else:
        valid("event-envelope", json.loads(record.value or b""))
    types = settings.own_types
    by_type = {types.created: "task-created", types.status: "status", types.progress: "progress"}
    name = by_type.get(event.type)
    if name is None:
        assert settings.type_rule.is_prefixed(event.type), event.type
        name = "other"
    else:
        valid(name, event.payload)
    if event.type == types.created:
        assert IDENTITY_HEADER in dict(headers), "the bridge signs every task.created"
    seen[name] = seen.get(name, 0) + 1


def _check_avro_body(value: bytes) -> None:
    """The single-object encoding of the published schema: magic, its fingerprint, a body."""
    schema = json.loads((SCHEMAS / "task_event.avsc").read_text(encoding="utf-8"))
    canonical = to_parsing_canonical_form(fastavro.parse_schema(schema))
    assert value[:2] == b"\xc3\x01"
    assert value[2:10].hex() == fingerprint(canonical, "CRC-64-AVRO")
    body = fastavro.schemaless_reader(io.BytesIO(value[10:]), fastavro.parse_schema(schema), None)
    assert isinstance(body, dict) and set(body) == {"type", "payload", "_meta", "timestamp"}
    assert isinstance(json.loads(body["payload"]), dict)


@pytest.mark.kafka
async def test_every_record_the_bridge_and_the_sdk_write_validates_against_the_contract(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    settings = make_settings(kafka_bootstrap, topic_prefix)
    await create_topics(settings, RUN)
    outcomes = await _run_every_kind_of_task(settings)
    # The wordings and codes docs/workers.md states, the same in the Java reference worker.
    assert outcomes["early"].status == "cancelled"
    assert outcomes["early"].status_message == "cancelled before it started"
    assert outcomes["slow_compute"].status_message == "cancelled at the client's request"
    assert outcomes["unhandled"].status == "failed"
    assert outcomes["unhandled"].error == {
        "code": -32603,
        "message": "no handler for tool unhandled",
    }
    assert outcomes["test_tool_with_task"].status == "completed"
    assert outcomes["test_tool_with_task"].result == {
        "content": [{"type": "text", "text": "Hello, W!"}]
    }

    jobs: list[dict[str, Any]] = []
    for tool in RUN:
        for record in await topic_records(settings, settings.topics.jobs(tool)):
            job = json.loads(record.value or b"")
            valid("job-request", job)
            assert job["taskId"] == (record.key or b"").decode()
            assert job["tool"] == tool or (tool, job["tool"]) == ("greet", "unhandled")
            jobs.append(job)
    assert len(jobs) == len(outcomes)
    assert {job["ttlMs"] for job in jobs} == {3_600_000}  # every tool's default TTL
    (answered,) = [job for job in jobs if "inputResponses" in job]
    assert answered["inputResponses"] == {
        "user_name": {"action": "accept", "content": {"name": "W"}}
    }

    kinds: dict[str, int] = {}
    for record in await topic_records(settings, settings.topics.control):
        message = json.loads(record.value or b"")
        valid("control-message", message)
        assert message["taskId"] == (record.key or b"").decode()
        kinds[message["type"]] = kinds.get(message["type"], 0) + 1
    assert kinds == {"input": 1, "cancel": 2, "finished": len(outcomes)}

    seen: dict[str, int] = {}
    for record in await topic_records(settings, settings.topics.events):
        _check_event(settings, record, seen)
    assert seen["task-created"] == len(outcomes)
    assert seen["progress"] >= 3 and seen["status"] >= len(outcomes) + 2
