"""Task identity keys on the real broker: rotation never orphans a task, refusals are counted,
and a server without a usable keyring refuses to start.

Each "process" here is a fresh indexer without a persisted index, so it derives every task's
owner from the log again: the hardest case for a rotation (a restored index would keep the
owners it already holds whatever the keys).
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from pydantic import SecretStr
from test_cli_errors import assert_one_clear_line, run_bridge
from test_identity_records import append_raw, forged_created
from test_trust import BOUND, TOOL, bridge_side

from bridge.config import IdentitySettings, Settings
from bridge.log.indexer import Indexer
from bridge.log.seqindex import owner_key
from bridge.metrics import Metrics
from bridge.tasks.messages import new_task_id, owner_digest
from bridge.tasks.service import TaskNotFound

pytestmark = pytest.mark.kafka

K1 = "k1 " + base64.b64encode(b"1" * 32).decode()
K2 = "k2 " + base64.b64encode(b"2" * 32).decode()


def keyed(settings: Settings, *lines: str) -> Settings:
    identity = IdentitySettings(keys=SecretStr("\n".join(lines)))
    return settings.model_copy(update={"identity": identity})


async def test_a_rotated_keyring_keeps_every_task_and_dropping_the_old_key_orphans_its_tasks(
    topics: Settings,
) -> None:
    async with bridge_side(keyed(topics, K1)) as side:
        before = await side.service.create(TOOL, {}, "alice")
    async with bridge_side(keyed(topics, K2, K1)) as side:  # k2 signs, k1 still verifies
        async with asyncio.timeout(BOUND):
            await side.indexer.catch_up()
        assert (await side.service.get(before.task_id, "alice")).status == "working"
        after = await side.service.create(TOOL, {}, "alice")
    async with Indexer(keyed(topics, K2)) as without_k1:
        async with asyncio.timeout(BOUND):
            await without_k1.catch_up()
        orphaned, kept = without_k1.lookup(before.task_id), without_k1.lookup(after.task_id)
        assert orphaned is not None and orphaned[1].owner == 0
        assert kept is not None and kept[1].owned_by(owner_key(owner_digest("alice")))
        assert without_k1.refused_identities == 1


async def test_refused_identity_records_are_counted_in_the_metrics(topics: Settings) -> None:
    async with bridge_side(topics) as side:
        metrics = Metrics()
        metrics.attach(side.indexer)  # what start_components does
        fake = new_task_id()
        record = forged_created(topics.tasks.event_type_prefix, "alice")
        offset = await append_raw(topics, fake, [record])
        async with asyncio.timeout(BOUND):
            await side.indexer.wait_indexed(side.indexer.partition_of(fake), offset)
        assert side.indexer.refused_identities == 1
        assert b"bridge_identity_records_refused_total 1.0" in generate_latest(metrics.registry)
        with pytest.raises(TaskNotFound):
            await side.service.get(fake, "alice")


def test_serve_without_a_usable_keyring_is_one_line_naming_the_setting(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    run = run_bridge(
        "serve",
        kafka_bootstrap,
        BRIDGE_TOPICS__PREFIX=topic_prefix,
        BRIDGE_IDENTITY__DEV_KEYS_FILE=str(blocker / "identity.keys"),
    )
    assert_one_clear_line(run, "serve", "BRIDGE_IDENTITY__KEYS_FILE")
