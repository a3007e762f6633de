"""The vendor-prefix rule for event types: configured prefixes, or reverse-DNS under a real TLD."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaProducer
from support.layout import make_settings

from bridge.config import Settings
from bridge.log.indexer import Indexer
from bridge.log.publisher import TaskEventPublisher, UnprefixedEventType
from bridge.log.reader import Reader
from bridge.vocabulary import EventSuffix, EventTypeRule, is_prefixed_type, is_top_level_domain

ACCEPTED = ["acme.internal"]
BOUND = 60  # seconds any single wait may take before the test fails


@pytest.mark.parametrize(
    "event_type",
    [
        "com.example.x",
        "io.mcpbridge.task.status",
        "com.example.review.comment",
        "dev.acme.build.step",
        "uk.co.example.x",  # a country code
        "io.github.someone.x",  # io is ICANN, whatever the private section says of github.io
        "xn--p1ai.example.x",  # an internationalised TLD (.рф) in its DNS form
        "COM.Example.X",  # DNS names are case-insensitive
        "com.example.a-b.c1",
    ],
)
def test_reverse_dns_types_under_a_real_top_level_domain_are_prefixed(event_type):
    assert is_prefixed_type(event_type)
    assert EventTypeRule(ACCEPTED).is_prefixed(event_type)


def test_types_under_a_configured_prefix_are_prefixed_only_with_that_configuration():
    assert EventTypeRule(ACCEPTED).is_prefixed("acme.internal.x")
    assert EventTypeRule(ACCEPTED).is_prefixed("acme.internal.job.step.done")
    assert is_prefixed_type("acme.internal.x", ACCEPTED)
    assert not is_prefixed_type("acme.internal.x")
    assert not EventTypeRule(ACCEPTED).is_prefixed("acme.internal")  # no name after it
    assert not EventTypeRule(ACCEPTED).is_prefixed("acme.internalx.y")  # not at a dot
    assert not EventTypeRule(ACCEPTED).is_prefixed("acme.internal.bad_label")


@pytest.mark.parametrize(
    "event_type",
    [
        "tool.call.started",  # three labels, but "tool" is not a top-level domain
        "content.partial.delta",
        "content.partial",
        "task.status",
        "tool.started",
        "progress",
        "",
        "a..b.c",
        "com.example",  # two labels: a prefix with no name
        "com.example.",
        ".com.example.x",
        "com.example.tool_call",  # underscores are not DNS label characters
        "com.exa mple.x",
        "com.example.x/y",
        "com.-example.x",
        "com.example-.x",
        "com.example." + "x" * 64,  # a label longer than 63 characters
        "com.example." + ".".join(["abcdefgh"] * 30),  # longer than 256 characters
        "internal.acme.x",  # not a real TLD, and not configured here
        "local.example.x",
        "localhost.example.x",
        "com\u00e9.example.x",
    ],
)
def test_types_without_a_vendor_prefix_are_refused(event_type):
    assert not is_prefixed_type(event_type)
    assert not EventTypeRule(ACCEPTED).is_prefixed(event_type)


@pytest.mark.parametrize("suffix", ["github.io", "blogspot.com", "co.uk", "com."])
def test_only_single_icann_labels_count_as_top_level_domains(suffix):
    # Private-section entries of the Public Suffix List (github.io, blogspot.com) and ICANN
    # second-level suffixes (co.uk) are public suffixes, but not top-level domains.
    assert not is_top_level_domain(suffix)


@pytest.mark.parametrize("label", ["com", "io", "org", "dev", "app", "uk", "de", "ck"])
def test_real_top_level_domains_are_known(label):
    assert is_top_level_domain(label)


@pytest.mark.parametrize("label", ["tool", "content", "task", "internal", "local", "example"])
def test_labels_that_are_not_delegated_top_level_domains_are_not(label):
    assert not is_top_level_domain(label)


def test_a_namespace_is_a_configured_prefix_or_reverse_dns_of_two_labels_or_more():
    rule = EventTypeRule(ACCEPTED)
    assert rule.is_namespace("io.mcpbridge")
    assert rule.is_namespace("com.example.team")
    assert rule.is_namespace("acme.internal")
    assert rule.is_namespace("acme.internal.billing")
    assert not rule.is_namespace("io")  # a bare TLD is nobody's namespace
    assert not rule.is_namespace("tool.call")
    assert not rule.is_namespace("acme")
    assert not rule.is_namespace("io..mcpbridge")


@pytest.mark.parametrize("prefix", ["", "a..b", "acme.", "bad_label.x", "-acme"])
def test_configured_prefixes_must_be_dns_labels(prefix):
    with pytest.raises(ValueError, match="DNS labels"):
        EventTypeRule([prefix])


# --- where the rule is applied, on the real broker --------------------------------------------


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str) -> Settings:
    return make_settings(kafka_bootstrap, topic_prefix, tasks={"accepted_event_prefixes": ACCEPTED})


@pytest.mark.kafka
async def test_the_indexer_and_reader_wrap_unprefixed_types_and_honour_configured_prefixes(topics):
    settings, task = topics, "task-types"
    written = [
        ("tool.call.started", {"i": 0}),
        ("acme.internal.step", {"i": 1}),
        ("com.example.ok", {"i": 2}),
        ("corp.internal.step", {"i": 3}),
    ]
    raw = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await raw.start()
    try:
        for event_type, payload in written:
            value = json.dumps({"type": event_type, "payload": payload}).encode()
            where = await raw.send_and_wait(settings.topics.events, key=task.encode(), value=value)
    finally:
        await raw.stop()
    live: list[tuple[int, str]] = []
    async with Indexer(settings) as indexer, Reader(settings, indexer) as reader:
        indexer.add_listener(lambda indexed: live.append((indexed.seq, indexed.event.type)))
        async with asyncio.timeout(BOUND):
            await indexer.wait_indexed(where.partition, where.offset)
            replayed = [(e.seq, e.event.type, e.event.payload) async for e in reader.read(task)]
        last = await reader.event_at(where.partition, where.offset)
    wrapped = f"{settings.tasks.event_type_prefix}.{EventSuffix.UNPREFIXED}"
    assert replayed == [
        (0, wrapped, {"type": "tool.call.started", "payload": {"i": 0}}),
        (1, "acme.internal.step", {"i": 1}),
        (2, "com.example.ok", {"i": 2}),
        (3, wrapped, {"type": "corp.internal.step", "payload": {"i": 3}}),
    ]
    assert live == [(seq, event_type) for seq, event_type, _ in replayed]
    assert last is not None and last.type == wrapped


@pytest.mark.kafka
async def test_the_publisher_refuses_types_the_rule_refuses_before_sending(topics):
    async with TaskEventPublisher(topics) as publisher:
        for event_type in ["tool.call.started", "content.partial.delta", "corp.internal.x"]:
            with pytest.raises(UnprefixedEventType, match="no vendor prefix"):
                await publisher.publish("t", event_type, {})
        await publisher.publish("t", "acme.internal.x", {})
        await publisher.publish("t", "com.example.x", {})
