"""Task events in a partition their task id does not map to are counted and logged at a bounded
rate (bridge/log/misrouted.py); kcat with librdkafka's default partitioner is the usual cause."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import zlib

import pytest

from bridge.config import Settings
from bridge.kafka.clients import partition_for_key
from bridge.log.indexer import Indexer
from bridge.log.misrouted import MAX_CHECKED_KEY_CHARS, MisroutedEvents

BOUND = 60


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_events_of_a_task_id_in_its_own_partition_are_not_counted() -> None:
    counted: list[None] = []
    misrouted = MisroutedEvents(lambda task_id: 1, lambda: counted.append(None))
    for seq in range(3):
        misrouted.check("task-a", 1, seq)
    assert misrouted.count == 0 and not counted


def test_a_key_longer_than_a_task_id_is_never_hashed() -> None:
    """Hashing is linear in the key: a 1 MB key any producer may write must cost nothing."""
    hashed: list[int] = []

    def partition_of(task_id: str) -> int:
        hashed.append(len(task_id))
        return 0

    misrouted = MisroutedEvents(partition_of)
    misrouted.check("k" * 1_000_000, 1, 0)
    misrouted.check("k" * (MAX_CHECKED_KEY_CHARS + 1), 1, 0)
    assert hashed == [] and misrouted.count == 0
    misrouted.check("k" * MAX_CHECKED_KEY_CHARS, 1, 0)  # as long as an id may be: checked
    assert hashed[0] == MAX_CHECKED_KEY_CHARS and misrouted.count == 1


def test_every_event_of_a_task_id_in_another_partition_is_counted() -> None:
    counted: list[None] = []
    misrouted = MisroutedEvents(lambda task_id: 1, lambda: counted.append(None))
    for seq in range(3):
        misrouted.check("task-a", 2, seq)
    misrouted.check("task-b", 1, 0)
    assert misrouted.count == 3 and len(counted) == 3


def test_the_warning_is_logged_at_most_once_a_window_with_the_count_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    misrouted = MisroutedEvents(lambda task_id: 0, log_every_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="bridge.log.misrouted"):
        misrouted.check("task-a", 1, 0)
        for seq in range(1, 5):
            misrouted.check("task-a", 1, seq)
        assert len(caplog.records) == 1
        clock.now += 61
        misrouted.check("task-b", 2, 0)
    first, second = (r.getMessage() for r in caplog.records)
    assert (
        first.startswith("1 task event(s)") and "task 'task-a' in partition 1 instead of 0" in first
    )
    assert second.startswith("5 task event(s)") and "Misrouted task events" in second


def test_the_warning_quotes_a_bounded_task_id_so_a_key_cannot_forge_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    misrouted = MisroutedEvents(lambda task_id: 0)
    with caplog.at_level(logging.WARNING, logger="bridge.log.misrouted"):
        # As long as a checked key may be (a longer one is never checked, so never logged).
        misrouted.check("x\nFORGED: all good" + "y" * (MAX_CHECKED_KEY_CHARS - 18), 1, 0)
    (line,) = (r.getMessage() for r in caplog.records)
    assert "\n" not in line and "'x\\nFORGED" in line and len(line) < 400


def kcat(settings: Settings, records: dict[str, dict[str, object]], *options: str) -> None:
    """One JSON event per task id through kcat, with its default partitioner unless told."""
    lines = "".join(f"{task_id}\t{json.dumps(event)}\n" for task_id, event in records.items())
    done = subprocess.run(
        ["kcat", "-P", "-b", settings.kafka.bootstrap_servers or "", "-t", settings.topics.events,
         "-K", "\t", "-H", "content-type=application/json", *options],
        input=lines.encode(), capture_output=True, timeout=BOUND, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.kafka
async def test_kcat_without_murmur2_puts_events_elsewhere_and_they_are_counted(
    topics: Settings,
) -> None:
    settings = topics
    event = {"type": "com.example.line", "payload": {"text": "hi"}}
    default = {f"crc-task-{i}": event for i in range(12)}
    murmur = {f"murmur-task-{i}": event for i in range(12)}
    partitions = settings.topics.partitions
    # librdkafka's default, consistent_random, is CRC32 of the key; Java's is murmur2.
    expected = sum(
        zlib.crc32(k.encode()) % partitions != partition_for_key(k.encode(), partitions)
        for k in default
    )
    assert expected > 0
    counted: list[None] = []
    async with Indexer(settings, on_misrouted=lambda: counted.append(None)) as indexer:
        for _ in range(2):  # the second event of a misrouted id counts too
            kcat(settings, default)
            kcat(settings, murmur, "-X", "partitioner=murmur2_random")
        async with asyncio.timeout(BOUND):
            await indexer.catch_up()
    assert len(counted) == 2 * expected == indexer.misrouted.count
