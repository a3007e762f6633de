"""tasks/stream end to end over real HTTP streams: the whole bridge in process over the in-memory
log (tests/support/inmemory.py) for the stream's logic, and a `bridge serve` subprocess on real
Kafka for what processes and the broker add (a SIGKILL, a drain on SIGTERM, the open rate)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
from support.inmemory import NO_BROKER, MemoryBridge, memory_bridge
from support.layout import fresh_prefix, make_settings
from support.mcp import (
    StreamRead,
    call,
    cancel,
    create_task,
    long_task,
    read_stream,
    request,
    result,
)
from support.procs import Bridge, bridge_env, running_bridge
from support.sse import sse_messages
from support.waits import BOUND, wait_until

from bridge.client import EventsGone, MemoryCursorStore, TaskStreamClient
from bridge.kafka.clients import partition_for_key
from bridge.kafka.port import Log, TopicPart
from bridge.log.publisher import TaskEventPublisher
from bridge.vocabulary import EVENTS_GONE, INVALID_PARAMS

#: The sbridge's keep-alive period: an idle stream gets a comment line every KEEPALIVE_S.
KEEPALIVE_S = 0.5


@pytest.fixture(scope="module")
def sbridge():
    settings = make_settings(
        NO_BROKER,
        fresh_prefix("s"),
        streams={"keepalive_s": KEEPALIVE_S, "queue_size": 16, "max_per_principal": 64},
    )
    with memory_bridge(settings) as running:
        yield running


def log_of(bridge: Bridge | MemoryBridge) -> Log | None:
    """Where a test writes the bridge's events: its memory log, else (None) the broker."""
    return bridge.log if isinstance(bridge, MemoryBridge) else None


async def delete_before(bridge: MemoryBridge, partition: int, offset: int) -> None:
    """Retention by hand: the log start of events ``partition`` moves to ``offset``."""
    await bridge.log.delete_records_before(
        TopicPart(bridge.settings.topics.events, partition), offset
    )


async def task_with_steps(bridge: Bridge, n: int, *, finished: bool = True) -> str:
    """A long task with ``n`` ``com.example.step`` events ``{"i": i}`` after its task.created;
    cancelled when ``finished`` (its stream then ends after the cancelled status)."""
    task = await long_task(bridge.url)
    async with TaskEventPublisher(bridge.settings, log=log_of(bridge)) as pub:
        for i in range(n):
            await pub.publish(task, "com.example.step", {"i": i})
    if finished:
        await cancel(bridge.url, task)
    return task


async def test_replay_then_live_across_the_hand_off_is_gap_free_while_producers_write(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    written = asyncio.Event()

    async def writer(name: str, n: int) -> None:
        async with TaskEventPublisher(sbridge.settings, log=sbridge.log) as pub:
            for i in range(n):
                await pub.publish(task, "com.example.write", {"writer": name, "i": i})
                if i == n // 4:
                    written.set()

    writers = asyncio.gather(writer("a", 200), writer("b", 200))
    async with asyncio.timeout(BOUND):
        await written.wait()  # the stream opens with history behind it and writes still going on
        reader = asyncio.create_task(read_stream(url, task))
        await writers
        await cancel(url, task)
        out = await reader
    assert out.result == {"resultType": "complete"}
    assert out.seqs == list(range(len(out.events)))
    assert out.events[0]["type"] == "io.mcpbridge.task.created"
    assert out.events[-1]["type"] == "io.mcpbridge.task.status"
    assert out.events[-1]["payload"]["status"] == "cancelled"
    for name in ("a", "b"):
        assert [
            e["payload"]["i"] for e in out.events if e["payload"].get("writer") == name
        ] == list(range(200))
    for event in out.events:
        assert event["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task}


async def test_resume_from_every_cursor_gives_exactly_the_remaining_events(sbridge):
    url, task = sbridge.url, await task_with_steps(sbridge, 12)
    async with asyncio.timeout(BOUND):
        full = await read_stream(url, task)
        total = len(full.events)
        assert full.seqs == list(range(total)) and total >= 14
        for after in range(total):
            out = await read_stream(url, task, after)
            assert out.seqs == list(range(after + 1, total)), after
            assert out.result == {
                "resultType": "complete"
            }  # terminal: immediate result when nothing is left


async def test_bad_cursors_get_invalid_params(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        for bad in (-1, 1.5, "3", True, None, 2**63, 10**30, 10**400, float("1e300")):
            params = {"taskId": task, "after": bad}
            message = await call(http, url, "tasks/stream", params)
            assert message["error"]["code"] == INVALID_PARAMS, (bad, message)
        unknown = await call(http, url, "tasks/stream", {"taskId": "no-such-task"})
        assert unknown["error"]["code"] == INVALID_PARAMS
    await cancel(url, task)


async def test_clients_on_their_own_connections_stream_one_task_at_once(sbridge):
    """The one-stream rule is per connection: a late joiner and a dashboard beside the agent
    (same credentials, here anonymous) are all admitted and all get every event."""
    url, task = sbridge.url, await long_task(sbridge.url)
    seen = StreamRead()
    first = asyncio.create_task(read_stream(url, task, into=seen))
    async with asyncio.timeout(BOUND):
        await wait_until(lambda: seen.events, what="the first stream delivers its first event")
        second = asyncio.create_task(read_stream(url, task))
        resumed = asyncio.create_task(read_stream(url, task, after=0))
        async with TaskEventPublisher(sbridge.settings, log=sbridge.log) as pub:
            for i in range(5):
                await pub.publish(task, "com.example.test.tick", {"i": i})
        await cancel(url, task)
        outs = await asyncio.gather(first, second, resumed)
    head = outs[0].seqs
    assert head == list(range(len(head))) and len(head) >= 7  # created, 5 ticks, cancelled
    assert outs[1].seqs == head
    assert outs[2].seqs == head[1:]
    assert all(out.result == {"resultType": "complete"} for out in outs)


async def test_a_cursor_ahead_of_the_head_is_refused_and_the_last_seq_waits_for_more(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        ahead = await call(http, url, "tasks/stream", {"taskId": task, "after": 1_000_000})
    assert ahead["error"]["code"] == INVALID_PARAMS
    data = ahead["error"]["data"]
    assert data["reason"] == "cursor_ahead" and data["taskId"] == task and data["nextSeq"] >= 1
    last = data["nextSeq"] - 1  # the last event there is: a legitimate cursor, never refused
    async with asyncio.timeout(BOUND):
        at_head = asyncio.create_task(read_stream(url, task, after=last))
        async with TaskEventPublisher(sbridge.settings, log=sbridge.log) as pub:
            await pub.publish(task, "com.example.test.tick", {"i": 0})
        await cancel(url, task)
        out = await at_head
    assert out.seqs[0] == last + 1 and out.result == {"resultType": "complete"}


async def test_an_integral_json_number_is_an_integer_cursor(sbridge):
    url, task = sbridge.url, await task_with_steps(sbridge, 3)
    async with asyncio.timeout(BOUND):
        out = await read_stream(url, task, after=1.0)  # type: ignore[arg-type]
    assert out.seqs[0] == 2 and out.result == {"resultType": "complete"}


async def test_notifications_cancelled_ends_the_stream_without_a_result(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    headers, body = request("tasks/stream", {"taskId": task})
    cancelled = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": body["id"], "reason": "the user closed the view"},
    }
    got: list[str] = []
    sent_cancel = False
    async with (
        asyncio.timeout(BOUND),
        httpx.AsyncClient(timeout=BOUND) as http,
        httpx.AsyncClient(timeout=BOUND) as other,
        http.stream("POST", url, json=body, headers=headers) as reply,
    ):
        async for line in reply.aiter_lines():
            got.append(line)
            if line.startswith("data:") and not sent_cancel:
                sent_cancel = True
                sent = await other.post(url, json=cancelled, headers=request("ping")[0])
                assert sent.status_code == 202
    messages = sse_messages("\n".join(got))
    assert messages and all(m.get("method") == "notifications/tasks/event" for m in messages)
    async with httpx.AsyncClient(timeout=BOUND) as http:
        view = await result(http, url, "tasks/get", {"taskId": task})
    assert view["status"] == "working"  # cancelling the stream never cancels the task
    await cancel(url, task)


async def test_closing_a_stream_does_not_cancel_the_task_and_idle_streams_get_keepalives(sbridge):
    """A task waiting for input writes nothing: its open stream gets keep-alive comments (one
    every KEEPALIVE_S) and stays open; the client closing it leaves the task as it was."""
    url = sbridge.url
    async with httpx.AsyncClient(timeout=BOUND) as http:
        task = await create_task(http, url, "confirm_delete", {"filename": "idle.txt"})
    idle = StreamRead()
    reading = asyncio.create_task(read_stream(url, task, into=idle))

    def parked() -> bool:
        return any(e["payload"].get("status") == "input_required" for e in idle.events)

    def keepalives_since(count: int) -> bool:
        assert not reading.done(), f"the idle stream ended: {idle}"
        return idle.keepalives >= count + 2  # two: they keep coming, not one at the start

    try:
        await wait_until(parked, what="the task asks for input (then it writes nothing more)")
        seen = idle.keepalives
        await wait_until(
            lambda: keepalives_since(seen),
            20 * KEEPALIVE_S,
            what=f"two keep-alives on the idle stream after seq {idle.seqs[-1]}",
        )
    finally:
        reading.cancel()  # the client closes the stream
        with contextlib.suppress(asyncio.CancelledError):
            await reading
    async with httpx.AsyncClient(timeout=BOUND) as http:
        view = await result(http, url, "tasks/get", {"taskId": task})
    assert view["status"] == "input_required"  # closing the stream never cancels the task
    assert idle.result is None and idle.error is None
    await cancel(url, task)
    async with asyncio.timeout(BOUND):
        rest = await read_stream(url, task, after=idle.seqs[-1])
    assert rest.seqs[0] == idle.seqs[-1] + 1 and rest.events[-1]["payload"]["status"] == "cancelled"
    assert rest.result == {"resultType": "complete"}


async def test_events_gone_after_delete_records_carries_earliest_seq(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    offsets = []
    async with TaskEventPublisher(sbridge.settings, log=sbridge.log) as pub:
        for i in range(10):
            where = await pub.publish(task, "com.example.step", {"i": i})
            offsets.append(where)
    async with asyncio.timeout(BOUND):
        full = await read_stream(url, task, stop_after=11)
        while not any(e["payload"].get("i") == 9 for e in full.events):
            full = await read_stream(url, task, stop_after=len(full.events) + 1)
        assert full.seqs == list(range(len(full.events)))
        seq_of = {
            e["payload"]["i"]: e["seq"] for e in full.events if e["type"] == "com.example.step"
        }
        cut = offsets[5]  # the step event i=5: the first record kept
        await delete_before(sbridge, cut.partition, cut.offset)
        async with httpx.AsyncClient(timeout=BOUND) as http:
            gone = await call(http, url, "tasks/stream", {"taskId": task, "after": 3})
        assert gone["error"] == {
            "code": EVENTS_GONE,
            "message": "Task events are no longer available",
            "data": {"reason": "events_gone", "taskId": task, "earliestSeq": seq_of[5]},
        }
        earliest = seq_of[5]
        resumed = await read_stream(url, task, after=earliest - 1, stop_after=3)
        assert resumed.seqs == [earliest, earliest + 1, earliest + 2]
        replay = await read_stream(url, task, stop_after=3)
        assert replay.seqs == [
            earliest,
            earliest + 1,
            earliest + 2,
        ]  # no cursor: earliest retained
        client = TaskStreamClient(url, store=MemoryCursorStore())
        with pytest.raises(EventsGone) as info:
            async for _ in client.stream(task, after=2):
                pass
        assert info.value.earliest_seq == earliest
        # transport-level resume with a cursor past retention maps to HTTP 410
        async with httpx.AsyncClient(timeout=BOUND) as http:
            old = full.ids[2]
            reply = await http.get(
                url, headers={"Last-Event-ID": old, "Accept": "text/event-stream"}
            )
        assert reply.status_code == 410
        assert reply.json()["error"]["data"]["earliestSeq"] == earliest
    await cancel(url, task)


async def test_last_event_id_resumes_the_same_stream_over_get(sbridge):
    url, task = sbridge.url, await task_with_steps(sbridge, 5, finished=False)
    async with asyncio.timeout(BOUND):
        first = await read_stream(url, task, stop_after=3)
        assert first.seqs == [0, 1, 2]
        await cancel(url, task)
        async with httpx.AsyncClient(timeout=BOUND) as http:
            reply = await http.get(
                url, headers={"Last-Event-ID": first.ids[-1], "Accept": "text/event-stream"}
            )
        messages = sse_messages(reply.text)
        events = [
            m["params"]["seq"] for m in messages if m.get("method") == "notifications/tasks/event"
        ]
        assert reply.status_code == 200
        assert events[0] == 3 and events == list(range(3, 3 + len(events)))
        assert "result" in messages[-1]
        async with httpx.AsyncClient(timeout=BOUND) as http:
            garbage = await http.get(url, headers={"Last-Event-ID": "nonsense"})
        assert garbage.status_code == 400


async def test_a_slow_client_neither_delays_a_fast_one_nor_loses_events(sbridge):
    url = sbridge.url
    slow_task, fast_task = await long_task(url), await long_task(url)
    n, blob = 400, "x" * 4000  # ~1.6 MB: more than the socket buffers hold for the slow one
    headers, body = request("tasks/stream", {"taskId": slow_task})
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(BOUND)) as slow_http,
        slow_http.stream("POST", url, json=body, headers=headers) as slow,
    ):
        fast = asyncio.create_task(read_stream(url, fast_task, stop_after=n + 1))
        latencies = []
        async with TaskEventPublisher(sbridge.settings, log=sbridge.log) as pub:
            for i in range(n):
                sent = time.monotonic()
                await pub.publish(slow_task, "com.example.big", {"i": i, "blob": blob})
                await pub.publish(fast_task, "com.example.small", {"i": i, "sent": sent})
                latencies.append(sent)
        async with asyncio.timeout(BOUND):
            out = await fast
        assert out.seqs == list(range(n + 1))
        # now the slow client reads everything it was sent, and nothing is missing
        got = []
        async with asyncio.timeout(BOUND):
            async for line in slow.aiter_lines():
                if line.startswith("data:"):
                    message = sse_messages(line)[0]
                    if message.get("method") == "notifications/tasks/event":
                        got.append(message["params"]["seq"])
                        if len(got) == n + 1:
                            break
        assert got == list(range(n + 1))
    await cancel(url, slow_task)
    await cancel(url, fast_task)


async def test_sigkill_of_the_bridge_mid_stream_loses_and_repeats_nothing(
    kafka_bootstrap, tmp_path
):
    settings = make_settings(kafka_bootstrap, fresh_prefix("k"))
    with running_bridge(settings, tmp_path) as bridge:
        url, task = bridge.url, await long_task(bridge.url)
        n = 300
        store = MemoryCursorStore()
        client = TaskStreamClient(url, store=store, backoff_s=0.2)
        received: list[int] = []
        steps: list[int] = []
        killed = asyncio.Event()

        async def produce() -> None:
            async with TaskEventPublisher(settings) as pub:
                for i in range(n):
                    await pub.publish(task, "com.example.step", {"i": i})
                    if i == n // 3:
                        await killed.wait()

        async def consume() -> None:
            async for event in client.stream(task):
                received.append(event.seq)
                if event.type == "com.example.step":
                    steps.append(event.payload["i"])
                if len(received) == n // 4 and not killed.is_set():
                    bridge.server.kill()  # SIGKILL, mid-stream
                    bridge.start_server()  # same port; the client reconnects with after=
                    killed.set()
            # the stream ends by itself after the task's terminal status event

        async with asyncio.timeout(BOUND * 2):
            consumer = asyncio.create_task(consume())
            await produce()
            await cancel(url, task)
            await consumer
    assert client.reconnects >= 1
    assert received == list(range(len(received)))
    assert steps == list(range(n))  # every step once, in order (the worker's progress events too)
    assert store.load(task) == received[-1]


async def test_sigterm_drains_open_streams_promptly_and_the_client_resumes_after_restart(
    kafka_bootstrap, tmp_path
):
    settings = make_settings(kafka_bootstrap, fresh_prefix("d"))
    with running_bridge(settings, tmp_path) as bridge:
        url, task = bridge.url, await task_with_steps(bridge, 3, finished=False)
        seen = StreamRead()
        async with asyncio.timeout(BOUND):
            open_stream = asyncio.create_task(read_stream(url, task, into=seen))
            await wait_until(lambda: seen.events, what="the stream delivers its first event")
            drained_at = time.monotonic()
            bridge.server.popen.terminate()  # SIGTERM
            out = await open_stream
            took = time.monotonic() - drained_at
            exit_code = await asyncio.to_thread(bridge.server.popen.wait, BOUND)
        assert out.result is None and out.error is None  # ended without its result: resume
        assert took < 9  # well inside the 10 s graceful shutdown: streams end at once
        # uvicorn re-raises the signal once its graceful shutdown is done
        assert exit_code in (0, -15)
        assert "Finished server process" in bridge.server.tail(200)
        seen = out.seqs
        bridge.start_server()
        await cancel(url, task)
        rest = await read_stream(url, task, after=seen[-1])
        assert rest.seqs == list(range(seen[-1] + 1, seen[-1] + 1 + len(rest.events)))
        assert rest.result == {"resultType": "complete"}


async def test_a_finished_task_whose_events_are_all_gone_ends_at_once_without_a_cursor(sbridge):
    url, task = sbridge.url, await long_task(sbridge.url)
    await cancel(url, task)
    async with asyncio.timeout(BOUND):
        out = await read_stream(url, task)  # everything, up to the cancelled status
    assert out.result == {"resultType": "complete"} and out.events
    # delete everything of the partition the task lives in, up to its end
    partition = partition_for_key(task.encode(), sbridge.settings.topics.partitions)
    part = TopicPart(sbridge.settings.topics.events, partition)
    end = (await sbridge.log.log_ends([part]))[part]
    await delete_before(sbridge, partition, end)
    async with asyncio.timeout(BOUND):
        gone = await read_stream(url, task)
    assert gone.events == [] and gone.result == {"resultType": "complete"}


async def test_stream_opens_are_rate_limited_per_client(kafka_bootstrap, tmp_path):
    settings = make_settings(kafka_bootstrap, fresh_prefix("r"))
    with running_bridge(settings, tmp_path, BRIDGE_STREAMS__OPENS_PER_MINUTE="3") as bridge:
        url, task = bridge.url, await long_task(bridge.url)
        await cancel(url, task)
        async with asyncio.timeout(BOUND):
            for _ in range(3):
                assert (await read_stream(url, task)).result == {"resultType": "complete"}
            async with httpx.AsyncClient(timeout=BOUND) as http:
                headers, body = request("tasks/stream", {"taskId": task})
                refused = await http.post(url, json=body, headers=headers)
        assert refused.status_code == 429
        assert refused.json()["error"]["data"]["reason"] == "rate_limited"


async def test_bridge_tail_prints_the_timeline_and_resumes_from_its_cursor_file(sbridge, tmp_path):
    import json
    import sys

    url, task = sbridge.url, await task_with_steps(sbridge, 3)
    cursor_file = tmp_path / "cursors.json"

    async def tail() -> tuple[int, list[str], str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.cli", "tail", task, "--url", url, "--cursor-file", str(cursor_file),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=bridge_env(sbridge.settings),
        )  # fmt: skip
        async with asyncio.timeout(BOUND):
            out, err = await proc.communicate()
        return proc.returncode or 0, out.decode().splitlines(), err.decode()

    code, lines, err = await tail()
    assert code == 0, err
    printed = [int(line.split()[0]) for line in lines]
    assert printed == list(range(len(printed))) and len(printed) >= 5  # created, 3 steps, status
    assert any("com.example.step" in line for line in lines)
    assert "end of stream" in err
    assert json.loads(cursor_file.read_text()) == {task: printed[-1]}
    # a second run resumes after the saved cursor: nothing left to print
    code, lines, err = await tail()
    assert code == 0 and lines == [], (lines, err)
