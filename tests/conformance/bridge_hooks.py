"""The hooks for our bridge (mcp-kafka-bridge): tasks from the conformance pack, events via Kafka.

* ``create_task``: ``tools/call slow_compute {seconds: 600}`` with the tasks extension declared
  (its worker also emits ``io.mcpbridge.progress`` about once a second);
* ``create_quiet_task``: ``tools/call confirm_delete``, returned once the task waits for input
  (it then emits nothing by itself);
* ``emit``: :class:`bridge.log.publisher.TaskEventPublisher` writes
  ``org.example.conformance.tick`` events with payload ``{"n": k}`` into the events topic;
  (every other one with a ``_meta`` whose related-task names another task: the bridge must
  still name the streamed task);
* ``emit_careless``: raw Kafka records, as kcat or a foreign pipeline could write them: the
  reserved unprefixed types ``content.partial`` and ``tool.started`` (and names that only look
  prefixed, ``tool.call.started``, ``content.partial.delta``), a list payload, and bytes that
  are no envelope;
* ``emit_raw``: the given record values, byte for byte, on the events topic (a plain producer);
* ``finish``: ``tasks/cancel`` for ``cancelled`` (or any outcome); for ``completed`` and
  ``failed`` the terminal status event a worker writes when its job ends (with a result, or an
  error), then the control messages that make the worker drop the job without a second status;
* ``delete_before``: ``DeleteRecords`` on the task's events partition, at the offset of the
  task's record with that seq (the bridge's seq of a record is the number of earlier committed
  records with the same key in the partition, so the offset is found by counting).

Records are written and read through the log port: the in-memory log of the bridge the suite
started (its ``details["log"]``), else Kafka. Against a bridge the suite did not start
(``--server-url``), the Kafka settings come from the environment (``BRIDGE_KAFKA__BOOTSTRAP_SERVERS``, ``BRIDGE_TOPICS__PREFIX``, …) as for the bridge.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from support.waits import wait_until

from bridge.config import Settings, load_settings
from bridge.kafka.adapter import KafkaLog
from bridge.kafka.clients import partition_for_key
from bridge.kafka.port import Log, TopicPart
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.messages import ControlMessage
from bridge.vocabulary import INTERNAL_ERROR, EventSuffix, StatusPayload

from .hooks import Hooks, NotSupported, ServerUnderTest
from .wire import McpClient

__all__ = ["EVENT_TYPE", "KNOWN_FAILURES", "BridgeHooks", "make_hooks"]

EVENT_TYPE = "org.example.conformance.tick"
RELATED_TASK = "io.modelcontextprotocol/related-task"
BOUND = 30.0
_JSON = [("content-type", b"application/json")]
Headers = Sequence[tuple[str, bytes]]
#: What a careless producer might write: (value, headers).
CARELESS_RECORDS: list[tuple[bytes, Headers]] = [
    (b'{"type": "content.partial", "payload": {"content": []}}', _JSON),
    (b'{"type": "tool.started", "payload": {"name": "x"}}', _JSON),
    (b'{"type": "tool.call.started", "payload": {"name": "x"}}', _JSON),
    (b'{"type": "content.partial.delta", "payload": {"text": "x"}}', _JSON),
    (b'{"type": "org.example.conformance.list", "payload": [1, 2, 3]}', _JSON),
    (b"\xff\x00 this is not a task event", []),
]
#: The status a worker writes when its job ends, per outcome ``finish`` can be asked for.
_ENDINGS = {
    "completed": StatusPayload(
        status="completed",
        result={"content": [{"type": "text", "text": "finished by the conformance hooks"}]},
    ),
    "failed": StatusPayload(
        status="failed",
        status_message="failed by the conformance hooks",
        error={"code": INTERNAL_ERROR, "message": "failed by the conformance hooks"},
    ),
}

#: Tests that fail against our bridge because of a known bridge bug (xfail; once a bug is fixed
#: the report shows XPASS for its clause: remove the entry then).
KNOWN_FAILURES: dict[str, str] = {}


class BridgeHooks(Hooks):
    def __init__(self, server: ServerUnderTest) -> None:
        super().__init__(server)
        settings = server.details.get("settings")
        self.settings: Settings = settings if isinstance(settings, Settings) else load_settings()
        self.client = McpClient(server.url, server.auth_token, bound=BOUND)
        # The suite's own in-memory bridge hands its log over; else the cluster of the settings.
        given = server.details.get("log")
        self._own_log = given is None
        self.log: Log = given if given is not None else KafkaLog(self.settings, pool_size=1)
        self.publisher = TaskEventPublisher(self.settings, log=self.log)
        self._emitted: dict[str, int] = defaultdict(int)
        self._partition: dict[str, int] = {}
        #: per task: (seq, offset) of the first record kept by the last delete_before
        self._cut: dict[str, tuple[int, int]] = {}

    async def start(self) -> None:
        async with asyncio.timeout(BOUND):
            await self.publisher.start()

    async def close(self) -> None:
        await self.publisher.stop()
        await self.client.aclose()
        if self._own_log and isinstance(self.log, KafkaLog):
            await self.log.close()

    async def _create(self, tool: str, arguments: dict[str, Any]) -> str:
        created = await self.client.result("tools/call", {"name": tool, "arguments": arguments})
        assert created.get("resultType") == "task", f"{tool} did not create a task: {created}"
        task_id = created["taskId"]
        assert isinstance(task_id, str) and task_id, created
        return task_id

    async def create_task(self) -> str:
        return await self._create("slow_compute", {"seconds": 600, "label": "conformance"})

    async def create_quiet_task(self) -> str:
        task_id = await self._create("confirm_delete", {"filename": "conformance.txt"})

        # Quiet once the worker asked for input (its status event is then in the log).
        async def parked() -> bool:
            view = await self.client.result("tasks/get", {"taskId": task_id})
            assert view.get("status") in ("working", "input_required"), view
            return view.get("status") == "input_required"

        await wait_until(parked, BOUND, what=f"task {task_id} asks for input", poll_s=0.1)
        return task_id

    async def emit(self, task_id: str, n: int) -> None:
        for _ in range(n):
            k = self._emitted[task_id]
            meta = {RELATED_TASK: {"taskId": f"not-{task_id}"}} if k % 2 else None
            async with asyncio.timeout(BOUND):
                where = await self.publisher.publish(task_id, EVENT_TYPE, {"n": k}, meta=meta)
            self._emitted[task_id] = k + 1
            self._partition[task_id] = where.partition

    def emitted_index(self, event: Mapping[str, Any]) -> int | None:
        payload = event.get("payload")
        if event.get("type") != EVENT_TYPE or not isinstance(payload, dict):
            return None
        n = payload.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    async def _produce(
        self, topic: str, task_id: str, records: Sequence[tuple[bytes, Headers]]
    ) -> None:
        """Write the records in order with a plain producer, as kcat or a pipeline would: sent
        together, so they land together (one batch), as a burst does."""
        producer = self.log.producer("conformance-raw")
        key = task_id.encode()
        async with asyncio.timeout(BOUND):
            await producer.start()
            try:
                sent = await asyncio.gather(
                    *(producer.send(topic, value, key=key, headers=h) for value, h in records)
                )
                if sent and topic == self.settings.topics.events:
                    self._partition[task_id] = sent[-1].partition
            finally:
                await producer.close()

    async def emit_careless(self, task_id: str) -> None:
        await self._produce(self.settings.topics.events, task_id, CARELESS_RECORDS)

    async def emit_raw(
        self, task_id: str, values: Sequence[bytes], headers: Headers = _JSON
    ) -> None:
        records = [(value, headers) for value in values]
        await self._produce(self.settings.topics.events, task_id, records)

    async def finish(self, task_id: str, outcome: str | None = None) -> None:
        if outcome in (None, "cancelled"):
            reply = await self.client.call("tasks/cancel", {"taskId": task_id})
            assert reply.error is None, f"tasks/cancel failed: {reply}"
            return
        ending = _ENDINGS.get(outcome or "")
        if ending is None:
            raise NotSupported(f"our hooks cannot end a task as {outcome!r}")
        status_type = f"{self.settings.tasks.event_type_prefix}.{EventSuffix.STATUS}"
        async with asyncio.timeout(BOUND):
            await self.publisher.publish(task_id, status_type, ending.payload())
        # The worker still runs the job: "finished" says its outcome is written (so it writes
        # no second one), then "cancel" stops the job.
        control = [
            (ControlMessage(type=kind, task_id=task_id).to_bytes(), _JSON)
            for kind in ("finished", "cancel")
        ]
        await self._produce(self.settings.topics.control, task_id, control)

    async def delete_before(self, task_id: str, seq: int) -> None:
        partition = self._partition.get(task_id)
        if partition is None:
            partition = partition_for_key(task_id.encode(), self.settings.topics.partitions)
        part = TopicPart(self.settings.topics.events, partition)
        async with asyncio.timeout(BOUND):
            cut = await self._offset_of(task_id, part, seq)
            await self.log.delete_records_before(part, cut[1])
        self._cut[task_id] = cut

    async def _offset_of(self, task_id: str, part: TopicPart, seq: int) -> tuple[int, int]:
        """(seq, offset) of the task's record with ``seq``, or (next seq, last offset + 1)."""
        key = task_id.encode()
        begin = (await self.log.log_starts([part]))[part]
        end = (await self.log.log_ends([part]))[part]
        count, start = self._cut.get(task_id, (0, begin))
        position = after_last = max(start, begin)
        while position < end:
            fetched = await self.log.fetch(part, position)
            for record in fetched.records:
                if record.offset >= end:
                    break
                if record.key == key:
                    if count == seq:
                        return count, record.offset
                    count += 1
                    after_last = record.offset + 1
            position = fetched.next_offset
        return count, after_last


def make_hooks(server: ServerUnderTest) -> BridgeHooks:
    return BridgeHooks(server)
