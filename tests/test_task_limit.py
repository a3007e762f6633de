"""The active-task limit holds under concurrency, and across replicas (real broker).

A create takes its place before its first await, so many concurrent creates cannot all pass a
check made before any of them was indexed; a creation that wrote nothing gives its place back.
With replicas (``replicas.ownership = "group"``) each replica counts the tasks of its own partitions
and its own creations: the cluster-wide bound is the limit times the replicas, here two
in-process replicas of a task service each (no HTTP, no workers).
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
from support.layout import create_topics, fresh_prefix, make_settings
from support.services import HOLD, create_many, task_service
from support.waits import wait_until

from bridge.config import Settings
from bridge.tasks.service import TooManyTasks

pytestmark = pytest.mark.kafka

LIMIT = 3
CREATES = 50


async def test_concurrent_creates_pass_the_limit_exactly(kafka_bootstrap: str) -> None:
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("lim"), tasks={"max_active_per_principal": LIMIT}
    )
    await create_topics(settings, [HOLD.name])
    async with task_service(settings) as service:
        assert len(await create_many(service, "alice", CREATES)) == LIMIT
        with pytest.raises(TooManyTasks):
            await service.create(HOLD, {}, "alice")  # still full once all were indexed
        assert len(await create_many(service, "bob", CREATES)) == LIMIT  # a budget of its own


async def test_a_creation_that_wrote_nothing_gives_its_place_back(kafka_bootstrap: str) -> None:
    settings = make_settings(
        kafka_bootstrap, fresh_prefix("lim"), tasks={"max_active_per_principal": 1}
    )
    await create_topics(settings, [HOLD.name])
    async with task_service(settings) as service:
        publish = service.publisher.publish

        async def refused(*args: object, **kwargs: object) -> object:
            raise ConnectionError("the broker refused the write")

        service.publisher.publish = refused  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await service.create(HOLD, {}, "alice")
        service.publisher.publish = publish  # type: ignore[method-assign]
        await service.create(HOLD, {}, "alice")  # the failed one holds no place
        with pytest.raises(TooManyTasks):
            await service.create(HOLD, {}, "alice")


async def test_with_two_replicas_a_principal_has_at_most_twice_the_limit(
    kafka_bootstrap: str,
) -> None:
    prefix, secret = fresh_prefix("lim"), secrets.token_urlsafe(32)

    def replica(i: int) -> Settings:
        return make_settings(
            kafka_bootstrap,
            prefix,
            topics={"prefix": prefix, "partitions": 4, "min_insync_replicas": 1},
            tasks={"max_active_per_principal": LIMIT},
            replicas={
                "ownership": "group",
                "instance_id": f"limit-{i}",
                "session_timeout_ms": 6000,
            },
            peers={
                "hosts": ["127.0.0.2", "127.0.0.3"],
                # No hop is made here; the owner URLs only need to be valid peer listeners' URLs.
                "advertised_url": f"http://127.0.0.{2 + i}:8081",
                "secret": secret,
            },
        )

    await create_topics(replica(0), [HOLD.name])
    async with task_service(replica(0)) as one, task_service(replica(1)) as two:

        def divided() -> bool:
            owned = [set(s.indexer.partitions) for s in (one, two)]
            return all(owned) and owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]

        await wait_until(divided, what="the two replicas divide the partitions")
        created = await asyncio.gather(
            create_many(one, "alice", CREATES), create_many(two, "alice", CREATES)
        )
        assert [len(c) for c in created] == [LIMIT, LIMIT]  # LIMIT x replicas in the cluster
        for service in (one, two):
            with pytest.raises(TooManyTasks):
                await service.create(HOLD, {}, "alice")
