"""Settings: environment over file over defaults, and clear errors for bad files."""

from __future__ import annotations

import json
import os
import re

import pytest
from pydantic import ValidationError

from bridge.config import load_settings


def test_defaults_describe_the_design_topic_layout(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    settings = load_settings()
    assert settings.topics.events == "mcpbridge.task-events"
    assert settings.topics.index == "mcpbridge.task-index"
    assert settings.topics.control == "mcpbridge.task-control"
    assert settings.topics.jobs("greet") == "mcpbridge.jobs.greet"
    assert settings.kafka.bootstrap_servers is None


def test_environment_beats_the_file_and_the_file_beats_defaults(tmp_path, monkeypatch):
    config = tmp_path / "bridge.toml"
    config.write_text(
        'log_level = "DEBUG"\n[server]\nport = 9001\n[topics]\nprefix = "fromfile"\npartitions = 4\n'
    )
    monkeypatch.setenv("BRIDGE_CONFIG_FILE", str(config))
    monkeypatch.setenv("BRIDGE_SERVER__PORT", "9002")
    monkeypatch.setenv("BRIDGE_TOPICS__PARTITIONS", "8")
    settings = load_settings()
    assert settings.server.port == 9002
    assert settings.log_level == "DEBUG"
    assert settings.topics.prefix == "fromfile"
    assert settings.topics.partitions == 8


def test_plain_kafka_bootstrap_servers_is_honoured_unless_the_bridge_variable_is_set(monkeypatch):
    monkeypatch.delenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "plain:9092")
    assert load_settings().kafka.bootstrap_servers == "plain:9092"
    monkeypatch.setenv("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", "bridge:9092")
    assert load_settings().kafka.bootstrap_servers == "bridge:9092"


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
        load_settings(tasks={"event_type_prefix": "NoDots"})


def test_the_event_type_prefix_must_be_reverse_dns_under_a_real_tld_or_an_accepted_prefix():
    settings = load_settings(tasks={"event_type_prefix": "com.example"})
    assert settings.tasks.event_type_prefix == "com.example"
    for prefix in ["tool.call", "content.partial", "internal.acme", "io", "com..example"]:
        with pytest.raises(ValidationError, match=r"event_type_prefix|pattern"):
            load_settings(tasks={"event_type_prefix": prefix})
    with pytest.raises(
        ValidationError, match=re.escape("list it in tasks.accepted_event_prefixes")
    ):
        load_settings(tasks={"event_type_prefix": "acme.internal"})
    accepted = load_settings(
        tasks={"event_type_prefix": "acme.internal", "accepted_event_prefixes": ["acme.internal"]}
    )
    assert accepted.type_rule.is_prefixed("acme.internal.task.created")


def test_accepted_event_prefixes_come_from_the_environment_and_must_be_dns_labels(monkeypatch):
    monkeypatch.setenv("BRIDGE_TASKS__ACCEPTED_EVENT_PREFIXES", '["acme.internal", "corp"]')
    settings = load_settings()
    assert settings.tasks.accepted_event_prefixes == ["acme.internal", "corp"]
    assert settings.type_rule.is_prefixed("corp.build.finished")
    assert not settings.type_rule.is_prefixed("tool.call.started")
    with pytest.raises(ValidationError, match="DNS labels"):
        load_settings(tasks={"accepted_event_prefixes": ["acme..internal"]})


def test_a_copy_with_other_accepted_prefixes_gets_their_rule():
    settings = load_settings()
    tasks = settings.tasks.model_copy(update={"accepted_event_prefixes": ["corp"]})
    copy = settings.model_copy(update={"tasks": tasks})
    assert copy.type_rule.is_prefixed("corp.x")
    assert not settings.type_rule.is_prefixed("corp.x")


# --- secured Kafka -------------------------------------------------------------------------

SECRET = "hunter2-secret"


@pytest.fixture
def no_bridge_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("BRIDGE_"):
            monkeypatch.delenv(name)


def test_kafka_security_settings_come_from_nested_environment_variables(
    tmp_path, monkeypatch, no_bridge_env
):
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("pem")
    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")
    monkeypatch.setenv("BRIDGE_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("BRIDGE_KAFKA__TLS__CA_FILE", str(ca_file))
    monkeypatch.setenv("BRIDGE_KAFKA__TLS__CHECK_HOSTNAME", "false")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__USERNAME", "bridge")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD_FILE", str(password_file))
    settings = load_settings()
    assert settings.kafka.tls.ca_file == ca_file
    assert settings.kafka.tls.check_hostname is False
    assert settings.kafka.sasl.mechanism == "SCRAM-SHA-512"
    assert settings.kafka.sasl.password_value() == SECRET  # the file's newline is not in it


def test_the_environment_overrides_one_security_setting_and_the_file_keeps_the_others(
    tmp_path, monkeypatch, no_bridge_env
):
    config = tmp_path / "bridge.toml"
    config.write_text(
        'kafka_security_protocol = "SASL_SSL"\n'
        '[kafka_sasl]\nmechanism = "PLAIN"\nusername = "from-file"\npassword = "file-secret"\n'
    )
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__USERNAME", "from-env")
    settings = load_settings(config)
    assert settings.kafka.sasl.username == "from-env"
    assert settings.kafka.sasl.mechanism == "PLAIN"
    assert settings.kafka.sasl.password_value() == "file-secret"


def test_a_secret_file_wins_over_the_inline_secret_and_is_read_each_time(
    tmp_path, monkeypatch, no_bridge_env
):
    password_file = tmp_path / "password"
    password_file.write_text("from-file")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD", "inline")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD_FILE", str(password_file))
    sasl = load_settings(
        kafka={"security_protocol": "SASL_SSL", "sasl": {"mechanism": "PLAIN", "username": "u"}}
    ).kafka.sasl
    assert sasl.password_value() == "from-file"
    password_file.write_text("rotated\r\n")
    assert sasl.password_value() == "rotated"


def _sasl(protocol="SASL_SSL", **values):
    return {"kafka": {"security_protocol": protocol, "sasl": values}}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"kafka": {"security_protocol": "SASL_SSL"}},
            "SASL_SSL needs BRIDGE_KAFKA__SASL__MECHANISM",
        ),
        (_sasl(mechanism="SCRAM-SHA-256", password=SECRET), "needs BRIDGE_KAFKA__SASL__USERNAME"),
        (_sasl(mechanism="PLAIN", username="u"), "needs BRIDGE_KAFKA__SASL__PASSWORD"),
        (_sasl(mechanism="OAUTHBEARER"), "needs a token"),
        (
            _sasl(mechanism="OAUTHBEARER", oauth_token_endpoint="https://idp/token"),
            "needs BRIDGE_KAFKA__SASL__OAUTH_CLIENT_ID and BRIDGE_KAFKA__SASL__OAUTH_CLIENT_SECRET",
        ),
        (
            _sasl("SSL", mechanism="PLAIN", username="u", password=SECRET),
            "SSL does not use SASL",
        ),
        (
            {"kafka": {"security_protocol": "SSL", "tls": {"cert_file": "{file}"}}},
            "a client certificate needs its key",
        ),
        (
            {"kafka": {"security_protocol": "SSL", "tls": {"key_file": "{file}"}}},
            "a client certificate needs its key",
        ),
        (
            {"kafka": {"security_protocol": "SSL", "tls": {"ca_file": "/no/such/ca.pem"}}},
            "file /no/such/ca.pem does not exist",
        ),
        (
            _sasl(mechanism="PLAIN", username="u", password_file="/no/such/password"),
            "file /no/such/password does not exist",
        ),
        ({"kafka": {"tls": {"ca_file": "{file}"}}}, "PLAINTEXT does not use TLS"),
    ],
)
def test_unusable_security_settings_are_clear_errors_at_load(
    settings, message, tmp_path, no_bridge_env
):
    existing = tmp_path / "exists.pem"
    existing.write_text("pem")
    values = json.loads(json.dumps(settings).replace("{file}", str(existing)))
    with pytest.raises(ValidationError, match=re.escape(message)):
        load_settings(**values)


def test_no_secret_shows_in_the_settings_or_in_a_validation_error(no_bridge_env):
    settings = load_settings(
        kafka={
            "security_protocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "u", "password": SECRET},
        }
    )
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert SECRET not in text
    with pytest.raises(ValidationError) as refused:  # no username: the input is not echoed
        load_settings(
            kafka={
                "security_protocol": "SASL_SSL",
                "sasl": {"mechanism": "PLAIN", "password": SECRET},
            }
        )
    assert SECRET not in str(refused.value)
    # A static token is a dict key: pydantic names a bad entry by its key, the token.
    with pytest.raises(ValidationError, match=r"auth\.tokens") as refused:
        load_settings(auth={"mode": "bearer", "tokens": {SECRET: 5}})
    assert SECRET not in str(refused.value)


def test_an_empty_security_variable_means_unset(monkeypatch, no_bridge_env):
    monkeypatch.setenv("BRIDGE_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__MECHANISM", "PLAIN")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__USERNAME", "u")
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD", SECRET)
    monkeypatch.setenv("BRIDGE_KAFKA__SASL__PASSWORD_FILE", "")  # a manifest listing every key
    monkeypatch.setenv("BRIDGE_KAFKA__TLS__CA_FILE", "")
    settings = load_settings()
    assert settings.kafka.sasl.password_file is None and settings.kafka.tls.ca_file is None
    assert settings.kafka.sasl.password_value() == SECRET


def test_the_server_loop_and_http_parser_are_chosen_by_name_and_default_to_asyncio_and_httptools(
    monkeypatch,
):
    assert (load_settings().server.loop, load_settings().server.http) == ("asyncio", "httptools")
    monkeypatch.setenv("BRIDGE_SERVER__LOOP", "asyncio")
    monkeypatch.setenv("BRIDGE_SERVER__HTTP", "h11")
    settings = load_settings()
    assert (settings.server.loop, settings.server.http) == ("asyncio", "h11")
    for name, bad in (("loop", "trio"), ("http", "h2")):
        with pytest.raises(ValidationError, match=f"server.{name}"):
            load_settings(server={name: bad})


def test_a_named_server_package_that_is_not_installed_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ValidationError, match="uvloop is not installed"):
        load_settings(server={"loop": "uvloop"})
    assert load_settings(server={"loop": "auto"}).server.loop == "auto"  # auto falls back quietly
