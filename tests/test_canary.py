"""The end-to-end canary (bridge/canary.py) against the real broker, in a bridge served by
uvicorn on a real socket: probes counted, latency observed, nothing lost; a stalled stream path
(the indexer paused over the admin route) shows as lost probes, and the canary recovers; canary
tasks are replaced before their TTL, ended with a terminal status, and readable by no client.

Every wait is on a metric or a state, bounded (support.waits); the probes' own cadence is the
only timer.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.layout import fresh_prefix, make_settings, merged
from support.mcp import call
from support.served import Served, serving
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.metrics import Metrics
from bridge.tasks.messages import new_task_id

#: Fast probes for the tests (production: 10 s when on).
INTERVAL_S = 0.2
TIMEOUT_S = 2.0
PARTITIONS = 3  # make_settings' events partitions


def canary_settings(kafka_bootstrap: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "canary": {"interval_s": INTERVAL_S, "timeout_s": TIMEOUT_S},
        "server": {"admin_endpoints": True},
    }
    return make_settings(kafka_bootstrap, fresh_prefix("c"), **merged(values, overrides))


@dataclass
class Sample:
    probes: float
    lost: float
    latencies: float  # observations of bridge_canary_latency_seconds
    stream_opens: float  # the clients' bridge_stream_opens_total, all modes


async def sample(served: Served) -> Sample:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{served.base}/metrics")).text
    totals = {"probes": 0.0, "lost": 0.0, "latencies": 0.0, "stream_opens": 0.0}
    names = {
        "bridge_canary_probes_total": "probes",
        "bridge_canary_lost_total": "lost",
        "bridge_canary_latency_seconds_count": "latencies",
        "bridge_stream_opens_total": "stream_opens",
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                totals[names[s.name]] += s.value
    return Sample(**totals)


async def partition_labels(served: Served) -> set[str]:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{served.base}/metrics")).text
    return {
        s.labels["partition"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "bridge_canary_lost_total"
    }


# --- without Kafka -------------------------------------------------------------------------


def test_the_canary_is_off_by_default(kafka_bootstrap: str) -> None:
    settings = make_settings(kafka_bootstrap, fresh_prefix("c"))
    assert settings.canary.interval_s == 0


def test_a_probe_outcome_counts_a_probe_and_either_a_latency_or_a_loss() -> None:
    m = Metrics()
    m.canary_probed(2, 0.05)
    m.canary_probed(2, None)
    m.canary_probed(0, 0.5)
    value = m.registry.get_sample_value
    assert value("bridge_canary_probes_total", {"partition": "2"}) == 2
    assert value("bridge_canary_lost_total", {"partition": "2"}) == 1
    assert value("bridge_canary_lost_total", {"partition": "0"}) == 0  # a series from the start
    assert value("bridge_canary_latency_seconds_count") == 2
    m.canary_forget(2)  # the partition moved away: its series go with it
    assert value("bridge_canary_probes_total", {"partition": "2"}) is None
    assert value("bridge_canary_probes_total", {"partition": "0"}) == 1


# --- with Kafka ----------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
async def test_probes_are_delivered_then_lost_while_the_indexer_is_paused_and_recover(
    kafka_bootstrap: str,
) -> None:
    async with serving(canary_settings(kafka_bootstrap)) as served:
        # Every partition is probed, each probe delivered through the stream path.
        first = await wait_until(
            lambda: _at_least(served, probes=3 * PARTITIONS),
            what="three rounds of probes",
            poll_s=INTERVAL_S,
        )
        assert first.lost == 0, first
        assert first.latencies == first.probes
        assert await partition_labels(served) == {str(p) for p in range(PARTITIONS)}
        # The canary's streams are not the clients': the user-facing stream metrics hold none.
        assert first.stream_opens == 0

        async with httpx.AsyncClient(timeout=10) as http:
            paused = await http.post(f"{served.base}/admin/indexer/pause")
            assert paused.json() == {"indexer": "pause"}
            try:
                stalled = await wait_until(
                    lambda: _at_least(served, lost=PARTITIONS),
                    what="probes lost while the indexer is paused",
                    poll_s=INTERVAL_S,
                )
            finally:
                resumed = await http.post(f"{served.base}/admin/indexer/resume")
            assert resumed.json() == {"indexer": "resume"}
        assert stalled.latencies >= first.latencies  # lost probes add no latency sample

        recovered = await _recovered(served, rounds=3)
        assert recovered.latencies > stalled.latencies
        assert recovered.probes == recovered.latencies + recovered.lost


@pytest.mark.kafka
@pytest.mark.slow
async def test_canary_tasks_are_replaced_before_their_ttl_ended_and_unreadable_by_clients(
    kafka_bootstrap: str,
) -> None:
    # TTL 2 s: a new canary task per partition every second.
    async with serving(canary_settings(kafka_bootstrap, canary={"task_ttl_s": 2})) as served:
        canary = served.components.canary
        assert canary is not None
        indexer = served.components.indexer
        await wait_until(
            lambda: len(canary.task_ids) == PARTITIONS, what="a canary task in every partition"
        )
        old = dict(canary.task_ids)
        for partition, task_id in old.items():
            assert indexer.partition_of(task_id) == partition

        def replaced_and_ended() -> bool:
            now = canary.task_ids
            return len(now) == PARTITIONS and all(
                now[p] != old[p] and _terminal(served, old[p]) for p in old
            )

        await wait_until(replaced_and_ended, what="every canary task replaced and ended")
        # No client can read a canary task: it answers like an unknown task.
        async with httpx.AsyncClient(timeout=BOUND) as http:
            url = f"{served.base}/mcp"
            unknown = await call(http, url, "tasks/get", {"taskId": new_task_id()})
            for task_id in canary.task_ids.values():
                got = await call(http, url, "tasks/get", {"taskId": task_id})
                assert "error" in got and got["error"] == unknown["error"], got
        after = await _recovered(served, rounds=2)
        assert after.lost == 0, after


@pytest.mark.kafka
@pytest.mark.slow
async def test_replicas_each_probe_only_the_partitions_they_own_and_together_all(
    kafka_bootstrap: str,
) -> None:
    prefix, secret = fresh_prefix("c"), secrets.token_urlsafe(32)
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]

    def replica(i: int) -> Settings:
        return canary_settings(
            kafka_bootstrap,
            topics={"prefix": prefix, "partitions": 4, "min_insync_replicas": 1},
            replicas={
                "ownership": "group",
                "instance_id": f"canary-{i}",
                "session_timeout_ms": 6000,
            },
            peers={
                "port": socks[i].getsockname()[1],
                # No hop here: the peer listener is not served (create_app without one).
                "advertised_url": f"http://127.0.0.1:{socks[i].getsockname()[1]}",
                "secret": secret,
            },
        )

    async with serving(replica(0), socks[0]) as one, serving(replica(1), socks[1]) as two:

        async def divided() -> bool:
            owned = [set(r.components.indexer.partitions) for r in (one, two)]
            probed = [{int(p) for p in await partition_labels(r)} for r in (one, two)]
            return (
                all(owned)
                and owned == probed
                and owned[0] | owned[1] == {0, 1, 2, 3}
                and not owned[0] & owned[1]
            )

        # The second replica's join moves partitions away from the first: the first stops
        # probing them (their series go), the second probes them, and no probe counts as lost.
        await wait_until(divided, what="each replica probes exactly the partitions it owns")
        for r in (one, two):
            assert (await _recovered(r, rounds=2, partitions=2)).lost == 0


# --- helpers -------------------------------------------------------------------------------


async def _at_least(served: Served, *, probes: float = 0, lost: float = 0) -> Sample | None:
    now = await sample(served)
    return now if now.probes >= probes and now.lost >= lost else None


async def _recovered(served: Served, *, rounds: int, partitions: int = PARTITIONS) -> Sample:
    """Until ``rounds`` rounds of probes in a row were all delivered (none lost meanwhile)."""
    base = await sample(served)

    async def clean_rounds() -> Sample | None:
        nonlocal base
        now = await sample(served)
        if now.lost != base.lost:
            base = now  # still losing: count the clean rounds from here
            return None
        return now if now.probes - base.probes >= rounds * partitions else None

    return await wait_until(clean_rounds, what=f"{rounds} clean rounds", poll_s=INTERVAL_S)


def _terminal(served: Served, task_id: str) -> bool:
    found = served.components.indexer.lookup(task_id)
    return found is not None and found[1].terminal
