"""The load harness (tests/support/load.py) on the real broker: a small load checks clean
against the log, and so does one whose only replica is SIGKILLed mid-run and started again
(every client resumes with its cursor and still gets every event exactly once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.layout import make_settings
from support.load import LoadHarness, LoadPlan
from support.waits import wait_until

from bridge.config import Settings

pytestmark = pytest.mark.kafka


def settings_for(kafka_bootstrap: str, topic_prefix: str) -> Settings:
    return make_settings(kafka_bootstrap, topic_prefix, tool_packs=["conformance", "demo"])


async def test_a_small_load_is_delivered_whole_and_the_checker_finds_nothing(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    plan = LoadPlan(replicas=1, workers=1, tool_tasks=3, pipeline_tasks=3, streams_per_task=3)
    async with LoadHarness(settings_for(kafka_bootstrap, topic_prefix), tmp_path, plan) as load:
        await load.writers_done()  # the pipelines' whole count, not cut short by stop()
        await load.stop(drain_s=60)
        report = await load.check()
    assert report.ok, report.summary()
    assert load.counters.finished_streams == 18, load.counters
    assert report.finished_streams == 18 and report.tasks == 6
    # Every stream had every event: at least agent_run's 30 and the pipeline's 60 per task.
    assert report.deliveries >= 3 * (3 * 30 + 3 * 60)
    assert report.truth_events * 3 == report.deliveries
    assert load.counters.delivered == report.deliveries
    assert load.counters.latencies_s, "pipeline events carry their send time"


async def test_streams_resume_across_a_sigkilled_and_restarted_replica_and_check_clean(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    plan = LoadPlan(
        replicas=1,
        workers=1,
        tool_tasks=2,
        pipeline_tasks=2,
        streams_per_task=3,
        tool_arguments={"prompt": "fault", "steps": 160, "delay_ms": 50},
        pipeline_events=200,
        pipeline_interval_s=0.04,
    )
    async with LoadHarness(settings_for(kafka_bootstrap, topic_prefix), tmp_path, plan) as load:
        await wait_until(lambda: load.counters.delivered >= 100, what="100 events delivered")
        assert load.open_streams == 12, "killed mid-run: every stream still open"
        replica = load.replicas[0]
        replica.kill()
        delivered_at_kill = load.counters.delivered
        replica.restart()
        await load.wait_ready(replica)
        await load.stop(drain_s=60)
        report = await load.check()
    assert report.ok, f"{report.summary()}\n{load.counters.errors}"
    assert load.counters.retries > 0, "the clients had to resume after the kill"
    assert load.counters.delivered > delivered_at_kill
    assert report.finished_streams == 12, report.summary()
