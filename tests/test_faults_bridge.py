"""Faults in the bridge, the workers and the clients, under load on the three-broker cluster
(issue 16 item 3): a bridge replica SIGKILLed and restarted, a worker SIGKILLed mid-job,
retention deleting records under streams that are behind, and a client that stops reading.

Each test runs a :class:`~support.load.LoadHarness` (two replicas in group ownership mode,
a worker, tool and pipeline tasks, three streams per task) on the session's ``kafka_cluster``,
applies one fault, and ends with the checker: 0 lost, 0 silently skipped, 0 wrong seq, 0
duplicated. Recovery is printed (``pytest -s`` shows it): the time until every stream open at
the fault has been handed an event newer than any its task had been handed before (see
:class:`Recovery`). The expected outcomes and the measured numbers are in docs/reliability.md,
"Faults in the bridge, workers and clients". Brokers are never touched here, so nothing needs
putting back in the cluster.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from conformance.wire import EVENT_METHOD, SseParser
from support.layout import delete_events_before, fresh_prefix, make_settings
from support.load import LoadHarness, LoadPlan, Replica
from support.mcp import request
from support.waits import wait_until

from bridge.client import EventsGone, MemoryCursorStore, TaskStreamClient
from bridge.config import Settings
from bridgedev.checker import Recording, StreamKey, ground_truth
from bridgedev.kafka import LocalCluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Events partitions of the fault tests' topics: enough for both replicas to own some.
PARTITIONS = 6
#: Bound on a recovery (a failover waits for the group's 6 s session timeout first).
RECOVERY_BOUND_S = 45.0


def cluster_settings(cluster: LocalCluster) -> Settings:
    """The cluster's settings on fresh topics: replication 3, min ISR 2, the demo tools."""
    prefix = fresh_prefix("faults")
    topics = {
        "prefix": prefix,
        "partitions": PARTITIONS,
        "replication_factor": 3,
        "min_insync_replicas": 2,
    }
    return make_settings(
        cluster.bootstrap_servers, prefix, topics=topics, tool_packs=["conformance", "demo"]
    )


class Recovery:
    """Time from now until every stream open now has been handed an event newer than any
    its task had been handed now (or has finished): the fault's effect is over for it."""

    def __init__(self, recording: Recording, task_ids: list[str] | None = None) -> None:
        self.recording = recording
        self.started = time.monotonic()
        heads: dict[str, int] = {}
        for (_client, task_id), stream in recording.streams.items():
            if stream.seqs:
                heads[task_id] = max(heads.get(task_id, -1), max(stream.seqs))
        self.waiting = {
            key: heads.get(key[1], -1)
            for key, stream in recording.streams.items()
            if not stream.finished and (task_ids is None or key[1] in task_ids)
        }

    def pending(self) -> list[StreamKey]:
        streams = self.recording.streams
        return [
            key
            for key, head in self.waiting.items()
            if not streams[key].finished
            and not (streams[key].seqs and streams[key].seqs[-1] > head)
        ]

    async def wait(self, what: str, bound: float = RECOVERY_BOUND_S) -> float:
        """Seconds until recovered (the test fails past ``bound``)."""
        assert self.waiting, "no open stream to recover"
        await wait_until(
            lambda: not self.pending(),
            bound,
            what=lambda: f"{what}: {len(self.pending())} of {len(self.waiting)} streams waiting",
        )
        return time.monotonic() - self.started


async def metric(http: httpx.AsyncClient, replica: Replica, name: str) -> float:
    """One unlabelled metric of ``replica`` (-1 when it does not answer)."""
    try:
        reply = await http.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=2)
    except httpx.HTTPError:
        return -1.0
    for line in reply.text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return -1.0


async def overflows(http: httpx.AsyncClient, load: LoadHarness) -> float:
    """Streams of every replica whose queue overflowed (they fell back to catch-up reads)."""
    name = "bridge_stream_slow_consumer_fallbacks_total"
    return sum([await metric(http, replica, name) for replica in load.replicas])


async def owned(http: httpx.AsyncClient, replica: Replica) -> int:
    return int(await metric(http, replica, "bridge_owned_partitions"))


def rss_total(load: LoadHarness) -> int:
    """Resident memory of every replica's process (the stalled stream may be forwarded, so
    both the replica it reads from and the task's owner hold a part of it)."""
    total = 0
    for replica in load.replicas:
        assert replica.proc.popen is not None
        status = Path(f"/proc/{replica.proc.popen.pid}/status").read_text()
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        total += int(kb) * 1024
    return total


def streamed(recording: Recording, task_id: str) -> int:
    """The fewest events any stream of ``task_id`` has been handed."""
    counts = [len(s.seqs) for (_c, t), s in recording.streams.items() if t == task_id]
    return min(counts, default=0)


def heads(load: LoadHarness, task_ids: list[str]) -> list[int]:
    """The newest seq any stream of each task has been handed."""
    newest = dict.fromkeys(task_ids, -1)
    for (_c, task_id), stream in load.recording.streams.items():
        if task_id in newest and stream.seqs:
            newest[task_id] = max(newest[task_id], stream.seqs[-1])
    return list(newest.values())


async def follow(
    load: LoadHarness, client_id: str, task_id: str, after: int | None, replica: Replica
) -> list[int]:
    """Stream ``task_id`` after ``after`` to its end into the recording, resuming at the
    earliest retained seq on events_gone; returns the ``earliestSeq`` of each events_gone."""
    store = MemoryCursorStore()
    if after is not None:
        store.save(task_id, after)
        if (client_id, task_id) not in load.recording.streams:  # else: a stream resumed
            load.recording.begin(client_id, task_id, after)
    gone = []
    client = TaskStreamClient(replica.url, store=store, backoff_s=0.1)
    while True:
        try:
            async for event in client.stream(task_id):
                load.recording.record(client_id, task_id, event.seq, event.type, event.payload)
        except EventsGone as exc:
            cursor = store.load(task_id)
            load.recording.gone(
                client_id, task_id, -1 if cursor is None else cursor, exc.earliest_seq
            )
            gone.append(exc.earliest_seq)
            store.save(task_id, exc.earliest_seq - 1)
            continue
        load.recording.finished(client_id, task_id)
        return gone


class StalledReader:
    """A ``tasks/stream`` client over a bare socket that reads only when told to: a client
    that stops calling recv. Its socket's receive buffer and its read-ahead are small, so
    the bridge's socket buffers, not this client, hold what it does not read."""

    RCVBUF = 4096
    READ_LIMIT = 4096

    def __init__(self, replica: Replica, task_id: str) -> None:
        self.replica = replica
        self.task_id = task_id
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.response: dict[str, Any] | None = None
        self._http = h11.Connection(h11.CLIENT)
        self._sse = SseParser()
        self._text = ""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.replica.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock, limit=self.READ_LIMIT)
        headers, body = request("tasks/stream", {"taskId": self.task_id})
        data = json.dumps(body).encode()
        head = [
            ("Host", f"127.0.0.1:{self.replica.port}"),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Content-Length", str(len(data))),
            *headers.items(),
        ]
        for part in (
            h11.Request(method="POST", target="/mcp", headers=head),
            h11.Data(data=data),
            h11.EndOfMessage(),
        ):
            self._writer.write(self._http.send(part) or b"")
        await self._writer.drain()

    async def read_until(self, done: Any, bound: float, what: str) -> None:
        """Read (and parse) until ``done()`` holds or the reply ends; fails past ``bound``."""
        assert self._reader is not None
        async with asyncio.timeout(bound):
            while not done() and self.response is None:
                chunk = await self._reader.read(self.READ_LIMIT)
                assert chunk, f"{what}: the connection closed before the reply's end"
                self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        self._http.receive_data(chunk)
        while True:
            part = self._http.next_event()
            if part is h11.NEED_DATA or isinstance(part, h11.EndOfMessage):
                return
            if isinstance(part, h11.Response):
                assert part.status_code == 200, part
            elif isinstance(part, h11.Data):
                self._text += bytes(part.data).decode()
                *lines, self._text = self._text.split("\n")
                for line in lines:
                    event = self._sse.feed(line.rstrip("\r"))
                    if event is not None:
                        self._message(json.loads(event.data))

    def _message(self, message: dict[str, Any]) -> None:
        if message.get("method") == EVENT_METHOD:
            p = message["params"]
            self.events.append((p["seq"], p["type"], p.get("payload", {})))
        elif "id" in message:
            self.response = message

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def record(self, recording: Recording, client_id: str) -> None:
        """What it was handed, and how its reply ended (a result, or events_gone)."""
        for seq, type_, payload in self.events:
            recording.record(client_id, self.task_id, seq, type_, payload, self.replica.name)
        assert self.response is not None
        error = self.response.get("error")
        if error is None:
            recording.finished(client_id, self.task_id)
        else:
            last = self.events[-1][0] if self.events else -1
            recording.gone(client_id, self.task_id, last, error["data"]["earliestSeq"])


def assert_clean(load: LoadHarness, report: Any) -> None:
    assert report.ok, f"{report.summary()}\n{list(load.counters.errors)}"
    for category in ("lost", "silently_skipped", "wrong_seq", "duplicated"):
        assert report.counts[category] == 0


# --- 1. a bridge replica SIGKILLed, then restarted ---------------------------------------------


async def test_a_sigkilled_replica_s_streams_resume_on_the_other_and_again_after_its_restart(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    plan = LoadPlan(
        replicas=2,
        workers=1,
        tool_tasks=2,
        pipeline_tasks=2,
        streams_per_task=3,
        tool_arguments={"prompt": "replica fault", "steps": 150, "delay_ms": 50},
        pipeline_events=5000,
        pipeline_interval_s=0.03,
    )
    settings = cluster_settings(kafka_cluster)
    async with LoadHarness(settings, tmp_path, plan) as load, httpx.AsyncClient() as http:
        victim, survivor = load.replicas
        await wait_until(lambda: load.counters.delivered >= 150, what="150 events delivered")

        async def both_own() -> bool:
            return await owned(http, victim) > 0 and await owned(http, survivor) > 0

        await wait_until(both_own, what="each replica owns partitions")
        assert load.open_streams == 12, "killed mid-run: every stream still open"
        failover = Recovery(load.recording)
        victim.kill()
        failover_s = await failover.wait("every stream resumed after the kill")
        assert await owned(http, survivor) == PARTITIONS

        restarted = time.monotonic()
        victim.restart()
        await load.wait_ready(victim)

        async def moved_back() -> bool:
            return await owned(http, victim) > 0

        await wait_until(moved_back, what="partitions moved back to the restarted replica")
        move_s = time.monotonic() - restarted
        back = Recovery(load.recording)
        back_s = await back.wait("every stream resumed after the partitions moved back")
        await load.stop(drain_s=60)
        report = await load.check()
    print(
        f"\nreplica SIGKILL: every stream resumed {failover_s:.1f} s after the kill; restart: "
        f"partitions back {move_s:.1f} s after the start, every stream resumed {back_s:.1f} s "
        f"later; {load.counters.retries} resumes, {report.deliveries} deliveries"
    )
    assert_clean(load, report)
    assert report.finished_streams == 12, report.summary()
    assert load.counters.retries > 0, "the killed replica's clients had to resume elsewhere"


# --- 2. a worker SIGKILLed mid-job -------------------------------------------------------------


async def test_a_job_whose_worker_is_sigkilled_runs_again_and_its_task_completes(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    steps = 60
    plan = LoadPlan(
        replicas=2,
        workers=1,
        tool_tasks=2,
        pipeline_tasks=2,
        streams_per_task=3,
        tool_arguments={"prompt": "worker fault", "steps": steps, "delay_ms": 50},
        pipeline_events=5000,
        pipeline_interval_s=0.03,
    )
    settings = cluster_settings(kafka_cluster)
    async with LoadHarness(settings, tmp_path, plan) as load:
        tools = load.tool_task_ids
        await wait_until(
            lambda: all(streamed(load.recording, t) >= 10 for t in tools),
            what="every tool task's streams have 10 of its events (the jobs are mid-way)",
        )
        worker = load.workers[0]
        rerun = Recovery(load.recording, tools)
        killed = time.monotonic()
        heads_at_kill = heads(load, tools)
        worker.kill()
        worker.start()  # the same worker, started again: it joins the group afresh
        rerun_s = await rerun.wait("every tool task's streams got the re-run's events")
        await wait_until(
            lambda: all(s.finished for (_c, t), s in load.recording.streams.items() if t in tools),
            90,
            what=lambda: f"every tool task's streams finished (heads {heads(load, tools)})",
        )
        completed_s = time.monotonic() - killed
        await load.stop(drain_s=60)
        report = await load.check()
        truth = await ground_truth(settings, tools)
    print(
        f"\nworker SIGKILL: the jobs ran again {rerun_s:.1f} s after the kill, their tasks "
        f"completed {completed_s:.1f} s after it; {report.deliveries} deliveries; tool task "
        f"heads {heads_at_kill} at the kill, {heads(load, tools)} at the end"
    )
    assert_clean(load, report)
    assert report.finished_streams == 12, report.summary()
    for task_id in tools:
        # task.created, the killed attempt's events, the whole re-run, the completed status:
        # every event of the killed attempt kept its place (and its seq) in the log.
        events = len(truth.tasks[task_id].digests)
        assert events > 1 + steps + 1, f"task {task_id}: no re-run in the log ({events})"
        last = max(s.seqs[-1] for (_c, t), s in load.recording.streams.items() if t == task_id)
        assert last == events - 1


# --- 3. retention under streams that are behind ------------------------------------------------


async def test_retention_past_a_stalled_stream_and_an_old_cursor_answers_events_gone_only_there(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    # 24 MB: far more than the bridge can hold for the stalled stream (its socket's send
    # buffer, 4 MiB at most here; its catch-up read's buffer, 4 MiB and a fetch; the batch
    # being written), so it must read from Kafka again, where the cut is. (At 8 MB, all of
    # it once fitted: the read's buffer was bounded by count alone, 4,000 records.)
    burst, pad = 12_000, 2000
    plan = LoadPlan(
        replicas=2,
        workers=1,
        tool_tasks=1,
        pipeline_tasks=2,
        streams_per_task=3,
        tool_arguments={"prompt": "retention", "steps": 100, "delay_ms": 50},
        pipeline_events=5000,
        pipeline_interval_s=0.03,
        replica_env={"BRIDGE_STREAMS__QUEUE_SIZE": "32"},
    )
    settings = cluster_settings(kafka_cluster)
    async with LoadHarness(settings, tmp_path, plan) as load, httpx.AsyncClient() as http:
        task_id = await load.add_unfed_task()
        replica = load.replicas[0]
        stalled = StalledReader(replica, task_id)
        await stalled.open()
        await stalled.read_until(lambda: len(stalled.events) >= 1, 30, "the stream's first event")
        before = await overflows(http, load)
        await load.burst(task_id, burst, pad)

        async def overflowed() -> bool:
            return await overflows(http, load) > before

        await wait_until(overflowed, what="the stalled stream's queue overflowed")
        # Every live stream past what the cut removes (it removes other tasks' records too).
        await Recovery(load.recording).wait("every live stream caught up after the burst")
        cut_seq = burst - 100
        truth = await ground_truth(settings, [task_id])
        partition = truth.tasks[task_id].partition
        await delete_events_before(settings, partition, truth.tasks[task_id].offsets[cut_seq])

        old_cursor = asyncio.create_task(follow(load, "old-cursor", task_id, 2, load.replicas[1]))
        await stalled.read_until(lambda: False, 60, "the stalled stream read again")
        stalled.close()
        stalled.record(load.recording, "stalled")
        assert stalled.response is not None and "error" in stalled.response, stalled.response
        earliest = stalled.response["error"]["data"]["earliestSeq"]
        resumed = await follow(load, "stalled", task_id, earliest - 1, replica)
        old_gone = await old_cursor
        await load.stop(drain_s=60)
        report = await load.check()
    print(
        f"\nretention: the stalled stream read {len(stalled.events)} events, then events_gone "
        f"with earliestSeq {earliest} (the log start moved to seq {cut_seq}); the old cursor "
        f"was answered earliestSeq {old_gone}"
    )
    assert earliest == cut_seq and old_gone == [cut_seq], (earliest, old_gone)
    assert resumed == [], "resumed at the earliest retained seq: nothing more gone"
    assert load.counters.gone == 0, "the live streams never fell behind the cut"
    assert_clean(load, report)
    assert report.finished_streams == 9 + 2, report.summary()


# --- 4. a client that stops reading ------------------------------------------------------------


async def test_a_client_that_stops_reading_costs_bounded_memory_and_others_keep_their_latency(
    kafka_cluster: LocalCluster, tmp_path: Path
) -> None:
    queue_size = 64
    # 36 MB, far beyond what the socket buffers hold (about 2.6 MB here) and what a burst costs
    # in passing, bounded by design whatever the burst's size: the tail's fetches, the stalled
    # read's buffer in its shared scan (4 MiB and a fetch), the recent fetches kept for storms
    # (4 MiB, the same records), one batch in flight as records, texts and SSE bytes, the
    # allocator's high water: 4-8 MB on a quiet machine, 15 MB once under the full suite (when
    # recent fetches were bounded by count only). A stream that held what it could not send
    # would grow by more than half of the burst.
    burst, pad = 18000, 2000
    plan = LoadPlan(
        replicas=2,
        workers=1,
        tool_tasks=1,
        pipeline_tasks=2,
        streams_per_task=3,
        tool_arguments={"prompt": "stalled client", "steps": 200, "delay_ms": 50},
        pipeline_events=5000,
        pipeline_interval_s=0.03,
        replica_env={"BRIDGE_STREAMS__QUEUE_SIZE": str(queue_size)},
    )
    settings = cluster_settings(kafka_cluster)
    async with LoadHarness(settings, tmp_path, plan) as load, httpx.AsyncClient() as http:
        await wait_until(lambda: load.counters.delivered >= 100, what="100 events delivered")
        overflows_before = await overflows(http, load)
        before_latency = list(load.counters.latencies_s)
        replica = load.replicas[0]
        task_id = await load.add_unfed_task()
        stalled = StalledReader(replica, task_id)
        await stalled.open()
        await stalled.read_until(lambda: len(stalled.events) >= 1, 30, "the stream's first event")
        stalled_at = len(stalled.events)
        samples_at = len(load.counters.latencies_s)
        rss_before = rss_total(load)
        await load.burst(task_id, burst, pad)  # all in the log while the client reads nothing
        await wait_until(
            lambda: len(load.counters.latencies_s) > samples_at + 100,
            what="100 more pipeline events delivered to the other streams",
        )
        rss_peak = rss_total(load)
        overflowed = await overflows(http, load) > overflows_before
        during = list(load.counters.latencies_s)[samples_at:]
        await stalled.read_until(lambda: False, 60, "the stalled stream read again")
        stalled.close()
        stalled.record(load.recording, "stalled")
        await load.stop(drain_s=60)
        report = await load.check()
    written_mb = burst * pad / 1e6
    grew_mb = (rss_peak - rss_before) / 1e6
    p99 = statistics.quantiles(during, n=100)[98] if len(during) >= 2 else float("nan")
    print(
        f"\nstalled client: {written_mb:.0f} MB written to its task while it read nothing after "
        f"{stalled_at} events; the replica's RSS grew {grew_mb:.1f} MB; other streams' latency "
        f"p50 {statistics.median(during) * 1000:.0f} ms p99 {p99 * 1000:.0f} ms "
        f"({len(during)} samples; before: p50 {statistics.median(before_latency) * 1000:.0f} ms)"
    )
    assert stalled.response is not None and "result" in stalled.response, stalled.response
    assert [seq for seq, _t, _p in stalled.events] == list(range(burst + 2))
    assert overflowed, "the stalled stream's queue never overflowed: the bound was not reached"
    assert grew_mb < written_mb / 2, "the stalled stream's events were held in memory"
    # The burst itself loads the machine (p99 rises with it); a stream blocked behind the
    # stalled one would wait for the whole stall, which moves the median, not just the tail.
    p50_before = statistics.median(before_latency)
    assert during and statistics.median(during) < 2 * p50_before + 0.5, "others waited"
    assert_clean(load, report)
