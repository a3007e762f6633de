"""The demo's five steps: SEP-2694 shown on real Kafka, each step checking its own outcome.

1. a long task streaming live to client A, which drops its connection mid-sentence;
2. A resumes with ``after`` from its cursor file: no gap, no repeat;
3. a late joiner, client B, replays the retained history and stays connected;
4. a second writer that knows nothing of MCP (kcat) appends to the task, and its terminal
   status ends every open stream;
5. retention removes the start of a second task: ``events_gone`` with ``earliestSeq``, then a
   resume from ``earliestSeq - 1``;
6. the sleeping agent: an agent process starts a long task, subscribes a webhook for its
   updates, saves its cursor and exits; the task's end reaches a receiver by webhook, which
   starts the agent again, and it resumes from its cursor (:mod:`bridgedev.demo.sleeper`).

The session is replayed with :mod:`bridgedev.replay`, read with :mod:`bridge.client`. A step
returns its one-line summary or raises :class:`StepFailed`; it never prints PASS or FAIL itself
(:mod:`bridgedev.demo` runs the steps, :mod:`bridgedev.demo.narrator` prints them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from bridge.component import cancel_and_wait
from bridge.config import Settings
from bridge.log.publisher import Published, TaskEventPublisher
from bridgedev.demo.agenthome import AgentConfig
from bridgedev.demo.narrator import INDENT, Narrator
from bridgedev.demo.receiver import Delivery, ReceiverTls
from bridgedev.demo.sleeper import SleepingAgent, SleepOutcome
from bridgedev.replay import (
    ReplayResult,
    SessionEvent,
    completed_result,
    create_task,
    finish_task,
    replay_events,
)

if TYPE_CHECKING:
    from bridge.client import TaskStreamClient

__all__ = ["STEP_BOUND_S", "Step", "StepFailed", "Walkthrough"]

#: Bound of every step.
STEP_BOUND_S = 90.0

#: A step: its title, and the coroutine function that runs it and returns its summary.
Step = tuple[str, Callable[[], Awaitable[str]]]


class StepFailed(Exception):
    """A step's check did not hold."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One event as the walkthrough's reader saw it, and when."""

    seq: int
    type: str
    payload: dict[str, Any]
    at: float  # time.monotonic() of arrival


class Collector:
    """A stream client running in the background, keeping what it received."""

    def __init__(self, client: TaskStreamClient, task_id: str, after: int | None = None) -> None:
        self.client = client
        self.task_id = task_id
        self.seen: list[Seen] = []
        self.on_event: Callable[[Seen], None] | None = None
        self._changed = asyncio.Event()
        self.runner = asyncio.create_task(self._run(after), name=f"collector-{task_id[:8]}")

    async def _run(self, after: int | None) -> None:
        try:
            async for event in self.client.stream(self.task_id, after):
                seen = Seen(event.seq, event.type, event.payload, time.monotonic())
                self.seen.append(seen)
                if self.on_event is not None:
                    self.on_event(seen)
                self._changed.set()
        finally:
            self._changed.set()

    async def wait_for(self, done: Callable[[list[Seen]], bool]) -> None:
        while not done(self.seen):
            if self.runner.done():
                self.runner.result()  # raises the stream's error, if any
                raise StepFailed(f"the stream ended early, after {len(self.seen)} events")
            self._changed.clear()
            await self._changed.wait()

    async def close(self) -> None:
        await cancel_and_wait(self.runner)


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise StepFailed(what)


def _contiguous(seqs: list[int], first: int = 0) -> bool:
    return seqs == list(range(first, first + len(seqs)))


def _seq_range(seqs: list[int]) -> str:
    return f"{seqs[0]}..{seqs[-1]}" if seqs else "none"


@dataclass
class Walkthrough:
    """The steps, and what they hand to each other (A's cursor file, B's open stream)."""

    settings: Settings
    publisher: TaskEventPublisher
    url: str
    session: list[SessionEvent]
    source: str
    speed: float
    workdir: Path
    say: Narrator
    #: The demo's bearer token (every client presents it) and its principal (tasks' owner).
    token: str = field(repr=False)
    principal: str
    #: The sleeping agent's receiver: its throwaway TLS (the bridge trusts its CA).
    tls: ReceiverTls
    task_id: str = ""
    a_seen: list[Seen] = field(default_factory=list)
    b: Collector | None = None
    replay: ReplayResult | None = None
    writer: asyncio.Task[ReplayResult] | None = None
    cursor_file: Path | None = None

    def steps(self) -> list[Step]:
        """The six steps, in the order they must run (each builds on the one before)."""
        return [
            ("A long task, streaming live", self.step_live),
            ("Disconnect, then resume with `after`", self.step_resume),
            ("A late joiner replays the retained history", self.step_late_joiner),
            ("A second writer that knows nothing of MCP", self.step_second_writer),
            ("Retention: events_gone and earliestSeq", self.step_events_gone),
            ("The sleeping agent, woken by a webhook", self.step_sleeping_agent),
        ]

    async def close(self) -> None:
        """Stop what a step left running (B's stream; the writer, when a check failed)."""
        if self.b is not None:
            await self.b.close()
        await cancel_and_wait(self.writer)

    @property
    def created_type(self) -> str:
        return self.settings.own_types.created

    @property
    def status_type(self) -> str:
        return self.settings.own_types.status

    def matches_file(self, seen: list[Seen], first_index: int = 0) -> bool:
        """Whether ``seen`` are the session's events from ``first_index`` on, in order."""
        expected = self.session[first_index : first_index + len(seen)]
        return len(expected) == len(seen) and all(
            s.type == e.type and s.payload == e.payload for s, e in zip(seen, expected, strict=True)
        )

    async def tasks_get(self, task_id: str) -> dict[str, Any]:
        return await self.client().call("tasks/get", {"taskId": task_id}, task_id)

    def client(self, cursor_file: Path | None = None) -> TaskStreamClient:
        """A client of the demo's bridge with the demo's token; its cursors in ``cursor_file``
        (else in memory)."""
        from bridge.client import FileCursorStore, MemoryCursorStore, TaskStreamClient

        store = FileCursorStore(cursor_file) if cursor_file else MemoryCursorStore()
        return TaskStreamClient(self.url, token=self.token, store=store)

    # --- step 1 and 2 --------------------------------------------------------------------------

    def _disconnect_index(self) -> int:
        """The middle of the longest streamed message: the drop happens mid-sentence."""
        by_message: dict[str, list[int]] = {}
        for i, e in enumerate(self.session):
            if e.type.endswith(".message.delta"):
                by_message.setdefault(str(e.payload.get("messageId")), []).append(i)
        if not by_message:
            return len(self.session) // 2
        longest = max(by_message.values(), key=len)
        return longest[len(longest) // 2]

    async def step_live(self) -> str:
        say, n = self.say, len(self.session)
        span = (self.session[-1].offset_ms - self.session[0].offset_ms) / 1000
        say.say(
            f"The data set {self.source} is one agent session: {n} events recorded over "
            f"{span:.0f} s (streamed text, tool calls and results, two subtasks, artifacts, a "
            "pause, an input request, usage). It is replayed into Kafka as a new task at "
            f"{self.speed:g}x speed by TaskEventPublisher, while client A (bridge.client."
            "TaskStreamClient) streams the task through the bridge."
        )
        publisher = self.publisher
        self.task_id, where = await create_task(publisher, self.settings, principal=self.principal)
        say.say(f"task {self.task_id}: created (seq 0), partition {where.partition}")
        view = await self.tasks_get(self.task_id)
        _check(view.get("status") == "working", f"tasks/get says {view.get('status')!r}")
        say.note("tasks/get → status working; client A opens tasks/stream {taskId}")
        cursor_file = self.workdir / "client-a-cursors.json"
        client = self.client(cursor_file)
        drop_at = self._disconnect_index() + 1  # the seq A is about to receive when it drops
        writer: asyncio.Task[ReplayResult] | None = None
        self.replay = ReplayResult(self.task_id)

        stream = cast(AsyncGenerator[Any, None], client.stream(self.task_id))
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if event.seq == drop_at:
                    break  # A "loses its connection" before processing this event
                self.a_seen.append(Seen(event.seq, event.type, event.payload, time.monotonic()))
                say.event(event.seq, event.type, event.payload)
                if writer is None:  # A is connected: start the agent
                    writer = asyncio.create_task(
                        replay_events(
                            publisher,
                            self.task_id,
                            self.session,
                            speed=self.speed,
                            into=self.replay,
                        )
                    )
                    self.writer = writer  # cancelled at the end if a later check fails
        assert writer is not None
        still_writing = not writer.done()
        last = self.a_seen[-1].seq
        say.cut(
            f"client A drops its connection here. Last event it fully processed: seq {last} "
            f"(the agent is at seq {len(self.replay.published)} and keeps going)"
        )
        seqs = [s.seq for s in self.a_seen]
        _check(_contiguous(seqs), f"A's seqs are not 0..{last} in order: {seqs}")
        _check(self.a_seen[0].type == self.created_type, "seq 0 is not task.created")
        _check(self.matches_file(self.a_seen[1:]), "A's events differ from the data set")
        _check(still_writing, "the replay had finished before A dropped: not a live stream")
        self.cursor_file = cursor_file
        latencies = self._latencies(self.a_seen, self.replay)
        return (
            f"client A received seqs {_seq_range(seqs)} live, in order, each one the data set's "
            f"event; {latencies}"
        )

    def _latencies(self, seen: list[Seen], result: ReplayResult) -> str:
        """Kafka's acknowledgement of each write → its arrival at the client."""
        lags = [
            max(0.0, s.at - result.acked_at[s.seq - 1]) * 1000
            for s in seen
            if 1 <= s.seq <= len(result.acked_at)
        ]
        if not lags:
            return "no latency sample"
        return (
            f"write-to-screen latency median {statistics.median(lags):.0f} ms, "
            f"max {max(lags):.0f} ms"
        )

    async def step_resume(self) -> str:
        say = self.say
        cursor_file, writer = self.cursor_file, self.writer
        assert cursor_file is not None and writer is not None
        saved = json.loads(cursor_file.read_text(encoding="utf-8"))
        cursor = saved.get(self.task_id)
        say.say(f"A's cursor file {cursor_file.name}: {json.dumps(saved)}")
        _check(cursor == self.a_seen[-1].seq, f"saved cursor {cursor} != last processed seq")
        before = time.monotonic()
        assert self.replay is not None
        at_drop = len(self.replay.published)
        await asyncio.sleep(1.5)  # A is offline; the agent keeps working
        while_away = len(self.replay.published) - at_drop
        say.say(
            f"A is offline for {time.monotonic() - before:.1f} s; meanwhile the agent wrote "
            f"{while_away} more events. A restarts (a new client, same cursor file) and sends "
            f"tasks/stream {{taskId, after: {cursor}}}"
        )
        client = self.client(cursor_file)
        last_seq = len(self.session)  # seq 0 is task.created
        after: list[Seen] = []
        stream = cast(AsyncGenerator[Any, None], client.stream(self.task_id))
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                seen = Seen(event.seq, event.type, event.payload, time.monotonic())
                after.append(seen)
                say.event(event.seq, event.type, event.payload)
                if event.seq >= last_seq:
                    break  # the session's last event: A has everything the agent wrote
        await writer
        first = after[0].seq if after else None
        seqs_before, seqs_after = [s.seq for s in self.a_seen], [s.seq for s in after]
        say.say(
            f"before the drop: seqs {_seq_range(seqs_before)}; after the resume: seqs "
            f"{_seq_range(seqs_after)}"
        )
        self.a_seen.extend(after)
        all_seqs = [s.seq for s in self.a_seen]
        _check(first == cursor + 1, f"the resumed stream began at seq {first}, not {cursor + 1}")
        _check(len(set(all_seqs)) == len(all_seqs), "an event was delivered twice")
        _check(_contiguous(all_seqs), f"seqs are not contiguous 0..{last_seq}")
        _check(all_seqs[-1] == last_seq, f"A stopped at seq {all_seqs[-1]}, not {last_seq}")
        _check(self.matches_file(self.a_seen[1:]), "A's events differ from the data set")
        _check(while_away > 0, "nothing was written while A was away")
        return (
            f"resumed with after={cursor}: got {_seq_range(seqs_after)}; together "
            f"{_seq_range(all_seqs)} with no gap and no repeat ({while_away} events were "
            "written while A was offline)"
        )

    # --- step 3 --------------------------------------------------------------------------------

    async def step_late_joiner(self) -> str:
        say = self.say
        last_seq = len(self.session)
        view = await self.tasks_get(self.task_id)
        say.say(
            f"The task is still {view.get('status')} (tasks/get). Client B joins now, with no "
            "cursor: tasks/stream {taskId} starts at the earliest retained event."
        )
        _check(view.get("status") == "working", "the task is not live any more")
        started = time.monotonic()
        self.b = Collector(self.client(), self.task_id)
        await self.b.wait_for(lambda seen: bool(seen) and seen[-1].seq >= last_seq)
        took = time.monotonic() - started
        seen = self.b.seen
        for s in seen[:3]:
            say.event(s.seq, s.type, s.payload, who="B")
        say.note(f"{INDENT}… {max(0, len(seen) - 5)} more …")
        for s in seen[-2:]:
            say.event(s.seq, s.type, s.payload, who="B")
        seqs = [s.seq for s in seen]
        same = [(s.seq, s.type, s.payload) for s in seen] == [
            (s.seq, s.type, s.payload) for s in self.a_seen
        ]
        _check(_contiguous(seqs), f"B's seqs are not contiguous: {_seq_range(seqs)}")
        _check(same, "B's history differs from what A received live")
        return (
            f"B replayed seqs {_seq_range(seqs)} from Kafka in {took:.2f} s, identical to what A "
            "saw live; B stays connected for what comes next"
        )

    # --- step 4 --------------------------------------------------------------------------------

    async def step_second_writer(self) -> str:
        say, settings = self.say, self.settings
        assert self.b is not None
        head = self.b.seen[-1].seq
        say.say(
            "The nightly export job (a shell script; no MCP, no seq) appends its own events to the "
            "same task: plain JSON values, key = task id, header content-type: application/json."
        )
        self.b.on_event = lambda seen: say.event(seen.seq, seen.type, seen.payload, who="B")
        kcat = shutil.which("kcat") or shutil.which("kafkacat")
        if kcat is not None and settings.kafka.security_protocol == "PLAINTEXT":
            await self._write_with_kcat(kcat, _EXPORT_JOB)
            writer_name = "kcat"
        else:
            say.note("kcat is not installed: a plain aiokafka producer writes the same records")
            await self._write_with_producer(_EXPORT_JOB)
            writer_name = "a plain aiokafka producer"
        await self.b.wait_for(lambda seen: seen[-1].seq >= head + len(_EXPORT_JOB))
        new = [s for s in self.b.seen if s.seq > head]
        _check(
            [(s.type, s.payload) for s in new] == [(x["type"], x["payload"]) for x in _EXPORT_JOB],
            "B did not receive the export job's events as written",
        )
        say.say(
            "The agent's work is done: its terminal status event (io.mcpbridge.task.status "
            "completed, with the tool result) ends every open stream of the task."
        )
        await finish_task(
            self.publisher, settings, self.task_id, completed_result(self.session, self.source)
        )
        async with asyncio.timeout(STEP_BOUND_S):
            await self.b.runner  # the stream ends with the tasks/stream result
        self.b.on_event = None
        seqs = [s.seq for s in self.b.seen]
        final = self.b.seen[-1]
        view = await self.tasks_get(self.task_id)
        _check(_contiguous(seqs), f"B's seqs have a gap: {_seq_range(seqs)}")
        _check(
            final.type == self.status_type and final.payload.get("status") == "completed",
            "B's stream did not end with the completed status",
        )
        _check(view.get("status") == "completed", f"tasks/get says {view.get('status')!r}")
        return (
            f"{writer_name} wrote seqs {new[0].seq}..{new[-1].seq} without knowing seq; B's "
            f"stream stayed gap-free ({_seq_range(seqs)}) and ended with the task (tasks/get: "
            "completed)"
        )

    async def _write_with_kcat(self, kcat: str, lines: list[dict[str, Any]]) -> None:
        """``lines`` as plain JSON records, keyed by the task id, written by kcat."""
        servers, topic = self.settings.kafka.bootstrap_servers, self.settings.topics.events
        command = [
            kcat, "-P", "-b", servers or "", "-t", topic, "-k", self.task_id,
            "-H", "content-type=application/json", "-X", "partitioner=murmur2_random",
        ]  # fmt: skip
        self.say.note(
            f"$ kcat -P -b {servers} -t {topic} -k {self.task_id} "
            f"-H content-type=application/json -X partitioner=murmur2_random  < {len(lines)} "
            "JSON lines"
        )
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate(body)
        _check(proc.returncode == 0, f"kcat failed ({proc.returncode}): {err.decode()[-300:]}")

    async def _write_with_producer(self, lines: list[dict[str, Any]]) -> None:
        """The same records through a plain producer (no idempotence, no envelope)."""
        from bridge.kafka.clients import plain_producer

        producer = plain_producer(self.settings)
        await producer.start()
        try:
            for line in lines:
                await producer.send_and_wait(
                    self.settings.topics.events,
                    json.dumps(line).encode(),
                    key=self.task_id.encode(),
                    headers=[("content-type", b"application/json")],
                )
        finally:
            await producer.stop()

    # --- step 5 --------------------------------------------------------------------------------

    async def step_events_gone(self) -> str:
        from bridge.kafka.admin import delete_records_before
        from bridge.kafka.clients import TopicPartition

        say, settings, n = self.say, self.settings, len(self.session)
        task_id = await self._task_on_another_partition()
        say.say(
            "Kafka drops old records by retention (retention.ms / retention.bytes); here it is "
            "forced. A second task gets the same session at full speed, then DeleteRecords "
            "removes the start of its partition."
        )
        _, created = await create_task(
            self.publisher, settings, principal=self.principal, task_id=task_id
        )
        marks = {n * k // 4 for k in (1, 2, 3, 4)}

        def progress(i: int, where: Published) -> None:
            if i + 1 in marks:
                say.note(f"… wrote {i + 1}/{n} events")

        replayed = await replay_events(
            self.publisher, task_id, self.session, speed=0, on_published=progress
        )
        await finish_task(
            self.publisher, settings, task_id, completed_result(self.session, self.source)
        )
        last_seq = n + 1
        full = Collector(self.client(), task_id)
        await full.runner
        seqs = [s.seq for s in full.seen]
        _check(_contiguous(seqs) and seqs[-1] == last_seq, f"task 2 reads {_seq_range(seqs)}")
        say.say(f"task {task_id}: seqs 0..{last_seq}, partition {created.partition}")
        cut_seq = min(100, n)  # the first seq kept (seq s is the session's event s-1)
        cut = replayed.published[cut_seq - 1]
        topic = settings.topics.events
        await delete_records_before(settings, TopicPartition(topic, cut.partition), cut.offset)
        say.note(
            f"DeleteRecords({topic}[{cut.partition}], before offset {cut.offset}): seqs "
            f"0..{cut_seq - 1} of this task are gone"
        )
        old_cursor = min(42, cut_seq - 2)
        await self._resume_too_old(task_id, old_cursor, cut_seq)
        rseqs = await self._resume_from_earliest(task_id, cut_seq, last_seq)
        return (
            f"after={old_cursor} → events_gone with earliestSeq {cut_seq} (exact); "
            f"after={cut_seq - 1} → seqs {_seq_range(rseqs)} and the task's end"
        )

    async def _task_on_another_partition(self) -> str:
        """A new task id on another partition than step 1's: that task keeps its history."""
        from bridge.kafka.clients import partition_for_key
        from bridge.kafka.topics import topic_partition_ids
        from bridge.tasks.messages import new_task_id

        partitions = len(await topic_partition_ids(self.settings, self.settings.topics.events))
        taken = partition_for_key(self.task_id.encode(), partitions)
        task_id = new_task_id()
        for _ in range(1000):
            if partitions == 1 or partition_for_key(task_id.encode(), partitions) != taken:
                break
            task_id = new_task_id()
        return task_id

    async def _resume_too_old(self, task_id: str, old_cursor: int, cut_seq: int) -> None:
        """A cursor from before the cut is refused with exactly SEP-2694's events_gone."""
        from bridge.client import StreamError

        self.say.say(
            f"A client that saved cursor {old_cursor} yesterday resumes: after={old_cursor}"
        )
        try:
            await self.client().call(
                "tasks/stream", {"taskId": task_id, "after": old_cursor}, task_id
            )
            error: dict[str, Any] = {}
        except StreamError as exc:
            error = {"code": exc.code, "message": exc.message, "data": exc.data}
        self.say.note(f"← error {json.dumps(error)}")
        expected = {
            "code": -32010,
            "message": "Task events are no longer available",
            "data": {"reason": "events_gone", "taskId": task_id, "earliestSeq": cut_seq},
        }
        _check(error == expected, f"expected {expected}, got {error}")

    async def _resume_from_earliest(self, task_id: str, cut_seq: int, last_seq: int) -> list[int]:
        """``after = earliestSeq - 1`` delivers the rest; no cursor starts there too."""
        say = self.say
        say.say(f"It resumes from earliestSeq - 1: after={cut_seq - 1}")
        resumed = Collector(self.client(), task_id, after=cut_seq - 1)
        await resumed.runner
        rseqs = [s.seq for s in resumed.seen]
        for s in [*resumed.seen[:2], *resumed.seen[-1:]]:
            say.event(s.seq, s.type, s.payload)
        _check(_contiguous(rseqs, cut_seq), f"resumed seqs {_seq_range(rseqs)}")
        _check(bool(rseqs) and rseqs[-1] == last_seq, "the resumed stream did not reach the end")
        _check(self.matches_file(resumed.seen[:-1], cut_seq - 1), "resumed events differ")
        fresh = Collector(self.client(), task_id)
        await fresh.runner
        _check(bool(fresh.seen) and fresh.seen[0].seq == cut_seq, "no-cursor stream start")
        say.note(f"(without a cursor the stream starts at seq {fresh.seen[0].seq}, too)")
        return rseqs

    # --- step 6 --------------------------------------------------------------------------------

    async def step_sleeping_agent(self) -> str:
        say = self.say
        say.say(
            f"An agent runs as its own process with the demo token. It starts {AGENT_TOOL} (the "
            "demo pack's long task) with tools/call, subscribes a webhook for that task's "
            f"updates ({self.settings.tasks.event_type_prefix}.task.updated, events/subscribe), "
            "processes the first events, saves its cursor, and exits. The receiver is a small "
            "HTTPS endpoint on loopback (a certificate of a CA made for this run, which the "
            "bridge trusts); it verifies every signature with the standardwebhooks library."
        )
        began = time.monotonic()
        story = SleepingAgent(
            self.workdir / "agent", self.tls, self._agent_config, note=self._agent_note
        )
        outcome = await story.run(wake_bound_s=AGENT_WAKE_BOUND_S)
        for delivery in outcome.deliveries:
            say.note(f"{'receiver':>9} │ {_delivery_line(delivery)}")
        view = await self.tasks_get(outcome.task_id)
        summary = _judged_sleep(outcome, view.get("status"))
        return f"{summary} ({time.monotonic() - began:.1f} s)"

    def _agent_config(self, callback: str, secret: str) -> AgentConfig:
        return AgentConfig(
            url=self.url,
            token=self.token,
            callback=callback,
            secret=secret,
            event=f"{self.settings.tasks.event_type_prefix}.task.updated",
            tool=AGENT_TOOL,
            arguments=AGENT_ARGUMENTS,
            read_before_sleep=AGENT_READS_BEFORE_SLEEP,
        )

    def _agent_note(self, who: str, text: str) -> None:
        self.say.note(f"{who:>9} │ {text}")


#: Step 6's task: ``agent_run`` of the demo pack, about 6 s of agent events.
AGENT_TOOL = "agent_run"
AGENT_ARGUMENTS: dict[str, Any] = {
    "prompt": "Why did the nightly export miss orders?",
    "steps": 24,
    "delay_ms": 250,
}
#: Events the agent processes before it goes to sleep.
AGENT_READS_BEFORE_SLEEP = 5
#: Bound of the wait for the webhook and the woken agent's run.
AGENT_WAKE_BOUND_S = 60.0


def _delivery_line(delivery: Delivery) -> str:
    """One POST the receiver got, as the narration shows it."""
    verdict = "signature verified" if delivery.verified else "signature REFUSED"
    what = delivery.kind
    if delivery.kind == "event":
        data = json.loads(delivery.body).get("data", {})
        what = f"task.updated {data.get('status')} (seq {data.get('seq')})"
    woke = " → starts the agent" if delivery.wake is not None else ""
    return f"{what}: {verdict}, answered {delivery.status}{woke}"


def _judged_sleep(outcome: SleepOutcome, status: Any) -> str:
    """Step 6's checks on what happened, and its summary."""
    start, woken = (outcome.run(kind) for kind in ("start", "wake"))
    waking = outcome.waking
    _check(start is not None and start.ended is not None, "the agent's first run did not end")
    _check(waking is not None and woken is not None, "no webhook woke the agent")
    assert start is not None and start.ended is not None and waking is not None
    assert waking.wake is not None and woken is not None
    _check(waking.verified, "the waking delivery's signature did not verify")
    _check(start.ended < waking.at, "the agent was still running when the webhook came")
    first, later = (outcome.journal_of(kind) for kind in ("start", "wake"))
    seqs, resumed = first.get("seqs", []), later.get("seqs", [])
    cursor = later.get("after")
    _check(
        bool(seqs) and _contiguous(seqs) and isinstance(cursor, int) and cursor == seqs[-1],
        f"first run: seqs {seqs}, resumed after {cursor}",
    )
    assert isinstance(cursor, int)
    _check(
        _contiguous(resumed, cursor + 1) and resumed[-1] == waking.wake.seq,
        f"resumed after {cursor}: {_seq_range(resumed)}, not {cursor + 1}..{waking.wake.seq}",
    )
    _check(later.get("status") == status == "completed", f"the task is {status!r}")
    _check(outcome.forged_status == 401, f"a forged copy was answered {outcome.forged_status}")
    _check(len(outcome.wakes) == 1, f"the agent was woken {len(outcome.wakes)} times")
    asleep = waking.at - start.ended
    return (
        f"the agent (pid {start.pid}) exited after seq {cursor}; {asleep:.1f} s later the "
        f"signed webhook ({waking.wake.status}) woke it (pid {woken.pid}), which resumed after "
        f"{cursor}: seqs {_seq_range(resumed)}, each once; a forged copy got 401; result: "
        f"{later.get('result')}"
    )


#: Step 4's records: what the nightly export job of the story appends to the task.
_EXPORT_JOB: list[dict[str, Any]] = [
    {"type": "com.example.export.run.started", "payload": {"job": "orders-export", "run": "run-5532", "date": "2026-09-14", "env": "staging"}},
    {"type": "com.example.export.batch.committed", "payload": {"run": "run-5532", "batch": 1, "rows": 642100}},
    {"type": "com.example.export.batch.committed", "payload": {"run": "run-5532", "batch": 2, "rows": 642211}},
    {"type": "com.example.export.run.finished", "payload": {"run": "run-5532", "rows": 1284311, "failedSends": 0}},
]  # fmt: skip
