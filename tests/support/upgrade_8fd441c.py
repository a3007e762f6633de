"""The upgrade fixture: a topic layout populated by 8fd441c, dumped to a file, and replayed.

Producing the fixture (once, with 8fd441c's code; see tests/fixtures/upgrade-8fd441c/README.md)::

    git worktree add /tmp/base 8fd441c
    PYTHONPATH=/tmp/base python tests/support/upgrade_8fd441c.py \\
        --bootstrap 127.0.0.1:9092 --out tests/fixtures/upgrade-8fd441c/records.json

It runs 8fd441c's own ``Indexer`` (persisting) and ``TaskService`` against fresh topics: tasks
of ``alice`` and ``bob`` created by tools/call's path, events appended as a pipeline would, a
status or two, the index flushed as 8fd441c flushes it; then one more task of ``carol`` written
by 8fd441c's ``publish_created`` after that bridge stopped (created by 8fd441c, never indexed
by it). Then every committed record of the events, index and task-updates topics is written
out: partition, offset, key and value (base64), headers, timestamp.

:func:`replay` (the test's side, current code) writes them into fresh topics, in offset order
per partition; the events topic must get the same offsets (they are written contiguously, and
the index refers to them), which it checks.

Only names 8fd441c already had are used while producing, so the script runs under either.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

__all__ = ["FIXTURE", "load_fixture", "replay"]

FIXTURE = Path(__file__).parent.parent / "fixtures" / "upgrade-8fd441c" / "records.json"
#: The topics dumped, by their role in the layout.
ROLES = ("events", "index", "updates")
PARTITIONS = 3
TOOL_NAME = "parked"


def _settings(bootstrap: str, prefix: str) -> Any:
    from bridge.config import load_settings

    return load_settings(
        kafka={"bootstrap_servers": bootstrap},
        topics={
            "prefix": prefix,
            "partitions": PARTITIONS,
            "min_insync_replicas": 1,
            "retention_ms": -1,
        },
        tasks={"checkpoint_interval": 4},
    )


def _topic(settings: Any, role: str) -> str:
    return str(getattr(settings.topics, role))


# --- producing (under 8fd441c) ---------------------------------------------------------------


async def produce(bootstrap: str) -> dict[str, Any]:
    """Populate fresh topics with 8fd441c and return the fixture (see the module doc)."""
    from bridge.config import ToolSpec
    from bridge.kafka.topics import create_layout
    from bridge.log.indexer import Indexer
    from bridge.log.reader import Reader
    from bridge.tasks.create import now_ms, publish_created
    from bridge.tasks.messages import new_task_id
    from bridge.tasks.service import TaskService

    settings = _settings(bootstrap, f"upgrade-{secrets.token_hex(4)}")
    tool = ToolSpec(name=TOOL_NAME, ttl_ms=None)  # never expires: the fixture outlives its day
    await create_layout(settings, [settings.topics.jobs(TOOL_NAME)])
    prefix = settings.tasks.event_type_prefix
    tasks: list[dict[str, Any]] = []
    async with Indexer(settings, persist=True) as indexer:
        reader = Reader(settings, indexer)
        service = TaskService(settings, indexer, reader, {TOOL_NAME: tool})
        await service.start()
        try:
            for owner, events, status in [
                ("alice", 6, "completed"),
                ("alice", 1, None),
                ("bob", 2, "input_required"),
            ]:
                view = await service.create(tool, {}, owner)
                for n in range(events):
                    await service.publisher.publish(view.task_id, "com.example.step", {"n": n})
                if status is not None:
                    payload: dict[str, Any] = {"status": status}
                    if status == "input_required":
                        payload["inputRequests"] = {"q": {"method": "elicitation/create"}}
                    await service.publisher.publish(view.task_id, f"{prefix}.task.status", payload)
                tasks.append(
                    {"taskId": view.task_id, "owner": owner, "status": status or "working"}
                )
            async with asyncio.timeout(30):
                await indexer.catch_up()
            await indexer.flush()
        finally:
            await service.stop()
            await reader.close()
    # Created by 8fd441c after its bridge stopped: in the log, not in the index it persisted.
    async with _publisher(settings) as publisher:
        task_id = new_task_id()
        await publish_created(publisher, settings.own_types, tool, "carol", task_id, now_ms())
        tasks.append({"taskId": task_id, "owner": "carol", "status": "working"})
    records = {role: await dump(settings, _topic(settings, role)) for role in ROLES}
    return {
        "producedBy": "8fd441c",
        "partitions": PARTITIONS,
        "eventTypePrefix": prefix,
        "tool": TOOL_NAME,
        "tasks": tasks,
        "records": records,
    }


def _publisher(settings: Any) -> Any:
    from bridge.log.publisher import TaskEventPublisher

    return TaskEventPublisher(settings)


async def dump(settings: Any, topic: str) -> list[dict[str, Any]]:
    """Every committed record of ``topic``, in partition and offset order."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                for record in batch.get(tp, []):
                    out.append(_record_json(record))
    finally:
        await consumer.stop()
    return out


def _record_json(record: Any) -> dict[str, Any]:
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": b64(record.key),
        "value": b64(record.value),
        "headers": [[name, b64(value)] for name, value in record.headers],
    }


# --- replaying (current code) ----------------------------------------------------------------


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return fixture


async def replay(fixture: dict[str, Any], settings: Any) -> None:
    """Write the fixture's records into ``settings``' topics (already created, empty), each
    to its partition, with its key, value, headers and timestamp; the events topic's records
    land at their original offsets."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, enable_idempotence=True
    )
    await producer.start()
    try:
        for role in ROLES:
            topic = _topic(settings, role)
            for record in fixture["records"][role]:
                sent = await producer.send_and_wait(
                    topic,
                    key=_bytes(record["key"]),
                    value=_bytes(record["value"]),
                    partition=record["partition"],
                    timestamp_ms=record["timestamp"],
                    headers=[(name, _bytes(value) or b"") for name, value in record["headers"]],
                )
                if role == "events" and sent.offset != record["offset"]:
                    raise AssertionError(
                        f"replayed at offset {sent.offset}, not {record['offset']}"
                    )
    finally:
        await producer.stop()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args(argv)
    fixture = asyncio.run(produce(args.bootstrap))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n", encoding="utf-8")
    counts = {role: len(fixture["records"][role]) for role in ROLES}
    print(f"wrote {args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
