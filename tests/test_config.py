"""Settings: environment over file over defaults, and clear errors for bad files."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bridge.config import load_settings


def test_defaults_describe_the_design_topic_layout(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("BRIDGE_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    settings = load_settings()
    assert settings.topics.events == "mcpbridge.task-events"
    assert settings.topics.index == "mcpbridge.task-index"
    assert settings.topics.control == "mcpbridge.task-control"
    assert settings.topics.jobs("greet") == "mcpbridge.jobs.greet"
    assert settings.kafka_bootstrap_servers is None


def test_environment_beats_the_file_and_the_file_beats_defaults(tmp_path, monkeypatch):
    config = tmp_path / "bridge.toml"
    config.write_text(
        'http_port = 9001\nlog_level = "DEBUG"\n[topics]\nprefix = "fromfile"\npartitions = 4\n'
    )
    monkeypatch.setenv("BRIDGE_CONFIG_FILE", str(config))
    monkeypatch.setenv("BRIDGE_HTTP_PORT", "9002")
    monkeypatch.setenv("BRIDGE_TOPICS__PARTITIONS", "8")
    settings = load_settings()
    assert settings.http_port == 9002
    assert settings.log_level == "DEBUG"
    assert settings.topics.prefix == "fromfile"
    assert settings.topics.partitions == 8


def test_plain_kafka_bootstrap_servers_is_honoured_unless_the_bridge_variable_is_set(monkeypatch):
    monkeypatch.delenv("BRIDGE_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "plain:9092")
    assert load_settings().kafka_bootstrap_servers == "plain:9092"
    monkeypatch.setenv("BRIDGE_KAFKA_BOOTSTRAP_SERVERS", "bridge:9092")
    assert load_settings().kafka_bootstrap_servers == "bridge:9092"


def test_missing_or_broken_files_and_bad_values_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("http_port = = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_settings(broken)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("no_such_setting = 1")
    with pytest.raises(ValidationError):
        load_settings(unknown)
    with pytest.raises(ValidationError):
        load_settings(event_type_prefix="NoDots")


def test_the_event_type_prefix_must_be_reverse_dns_under_a_real_tld_or_an_accepted_prefix():
    assert load_settings(event_type_prefix="com.example").event_type_prefix == "com.example"
    for prefix in ["tool.call", "content.partial", "internal.acme", "io", "com..example"]:
        with pytest.raises(ValidationError, match=r"event_type_prefix|pattern"):
            load_settings(event_type_prefix=prefix)
    with pytest.raises(ValidationError, match="list it in accepted_event_prefixes"):
        load_settings(event_type_prefix="acme.internal")
    accepted = load_settings(
        event_type_prefix="acme.internal", accepted_event_prefixes=["acme.internal"]
    )
    assert accepted.type_rule.is_prefixed("acme.internal.task.created")


def test_accepted_event_prefixes_come_from_the_environment_and_must_be_dns_labels(monkeypatch):
    monkeypatch.setenv("BRIDGE_ACCEPTED_EVENT_PREFIXES", '["acme.internal", "corp"]')
    settings = load_settings()
    assert settings.accepted_event_prefixes == ["acme.internal", "corp"]
    assert settings.type_rule.is_prefixed("corp.build.finished")
    assert not settings.type_rule.is_prefixed("tool.call.started")
    with pytest.raises(ValidationError, match="DNS labels"):
        load_settings(accepted_event_prefixes=["acme..internal"])


def test_a_copy_with_other_accepted_prefixes_gets_their_rule():
    settings = load_settings()
    copy = settings.model_copy(update={"accepted_event_prefixes": ["corp"]})
    assert copy.type_rule.is_prefixed("corp.x")
    assert not settings.type_rule.is_prefixed("corp.x")
