"""The one pool of group-less ``read_committed`` consumers that random reads share.

Where it sits: inside the aiokafka adapter (:meth:`bridge.kafka.adapter.KafkaLog.fetch`), so
every read of a partition from an offset (a stream's catch-up, an event by offset, a probe)
goes through it. A consumer costs a connection and its fetch buffers: the pool keeps at most
``size`` of them, a caller waits for one when all are busy, and each remembers where it stands
so a read that goes on from there keeps the records it prefetched (no seek, no refetch).
At the end of what is committed a consumer is paused until its next read: an idle consumer
would otherwise fetch again and again. Nothing here knows tasks or seq.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from bridge.config import Settings
from bridge.kafka.clients import (
    AIOKafkaConsumer,
    ConsumerRecord,
    TopicPartition,
    committed_consumer,
)
from bridge.kafka.port import LogError

__all__ = ["ConsumerPool"]

#: How long one fetch waits for a record to arrive.
FETCH_WAIT_MS = 1000


class ConsumerPool:
    """At most ``size`` started consumers, each lent to one read at a time."""

    def __init__(self, settings: Settings, *, size: int, role: str, **options: Any) -> None:
        self.settings = settings
        self.size = size
        self.role = role
        # Reads must not long-poll at the log end: the next read would queue behind it.
        self._options = {"fetch_max_wait_ms": 5, **options}
        self._idle: list[AIOKafkaConsumer] = []
        self._all: list[AIOKafkaConsumer] = []
        self._free = asyncio.Condition()
        self._created = 0
        #: Where each idle consumer stands: (partition, next offset); reused without a seek.
        self._at: dict[int, tuple[TopicPartition, int]] = {}
        self._closed = False

    async def close(self) -> None:
        """Stop every consumer and refuse every read from now on: a read still holding one
        gets an error from it, and a read waiting for one is woken with :class:`LogError`."""
        async with self._free:
            self._closed = True
            consumers, self._all, self._idle = self._all, [], []
            self._at.clear()
            self._free.notify_all()
        for consumer in consumers:
            await _stop(consumer)

    def _check_open(self) -> None:
        if self._closed:
            raise LogError(f"the {self.role} consumer pool is closed")

    async def _acquire(self, want: tuple[TopicPartition, int] | None) -> AIOKafkaConsumer:
        """An idle consumer, preferably one already positioned at ``want``."""
        async with self._free:
            while True:
                self._check_open()
                if self._idle:
                    for i, consumer in enumerate(self._idle):
                        if want is not None and self._at.get(id(consumer)) == want:
                            return self._idle.pop(i)
                    return self._idle.pop()
                if self._created < self.size:
                    self._created += 1  # reserve the slot before awaiting the connection
                    break
                await self._free.wait()
        try:
            consumer = committed_consumer(self.settings, role=self.role, **self._options)
            await consumer.start()
        except BaseException:
            async with self._free:
                self._created -= 1
                self._free.notify()
            raise
        if self._closed:  # closed while it connected: the close did not see it
            await _stop(consumer)
            self._check_open()
        self._all.append(consumer)
        return consumer

    async def _release(self, consumer: AIOKafkaConsumer) -> None:
        async with self._free:
            if not self._closed:
                self._idle.append(consumer)
                self._free.notify()
                return
        await _stop(consumer)  # lent when the pool closed: never lent again

    @contextlib.asynccontextmanager
    async def consumer(self) -> AsyncIterator[AIOKafkaConsumer]:
        """A consumer for a request that is not a fetch (offsets, metadata)."""
        consumer = await self._acquire(None)
        try:
            yield consumer
        finally:
            await self._release(consumer)

    async def fetch(
        self, tp: TopicPartition, offset: int, max_records: int
    ) -> tuple[Sequence[ConsumerRecord[bytes, bytes]], int]:
        """Up to ``max_records`` committed records of ``tp`` from ``offset``, and the next
        position (which moves without records past markers and aborted batches). Raises
        aiokafka's ``OffsetOutOfRangeError``."""
        consumer = await self._acquire((tp, offset))
        self._at.pop(id(consumer), None)
        try:
            if consumer.assignment() != {tp}:
                consumer.assign([tp])
                consumer.seek(tp, offset)
            else:
                consumer.resume(tp)  # paused at the end of the last read (below)
                if await consumer.position(tp) != offset:
                    consumer.seek(tp, offset)
            batches = await consumer.getmany(tp, timeout_ms=FETCH_WAIT_MS, max_records=max_records)
            position = int(await consumer.position(tp))
            # Short of the end it prefetches what comes next once, for the next chunk.
            end = consumer.last_stable_offset(tp)
            if end is None or position >= end:
                consumer.pause(tp)
            self._at[id(consumer)] = (tp, position)
            return batches.get(tp, []), position
        finally:
            await self._release(consumer)


async def _stop(consumer: AIOKafkaConsumer) -> None:
    with contextlib.suppress(Exception):  # stopping is all that is left to do with it
        await consumer.stop()
