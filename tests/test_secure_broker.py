"""The secured local broker (bridgedev.kafka.start_secure and `bridge kafka start --secure`).

Its clients here are plain aiokafka with a TLS context built from the broker's CA file: what is
under test is the broker (TLS, SASL users, the authorizer), not the bridge's client options;
two tests show the bridge's own settings reaching it. The first tests need no broker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError
from support.unavailable import unavailable
from support.waits import BOUND

from bridge.config import load_settings
from bridge.kafka.admin import kafka_admin
from bridgedev.kafka import KafkaProviderError, SecureBroker, SecureBrokerInfo, check_bootstrap
from bridgedev.kafka.security import new_security, write_client_config

PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


# --- the broker's files and settings (no broker) --------------------------------------------


def test_the_keystore_holds_a_pkcs8_key_then_the_chain_readable_by_its_owner_only(
    tmp_path: Path,
) -> None:
    security = new_security(tmp_path, ["worker"])
    keystore = security.keystore_file.read_text()
    # Kafka's PEM keystore reads PKCS#8 keys only ("BEGIN PRIVATE KEY"), not trustme's default
    assert keystore.startswith("-----BEGIN PRIVATE KEY-----\n")
    assert keystore.count("-----BEGIN CERTIFICATE-----") >= 1
    for secret in (security.keystore_file, tmp_path / "users.json"):
        assert secret.stat().st_mode & 0o077 == 0, secret
    assert security.ssl_context().verify_mode == ssl.CERT_REQUIRED


def test_no_unauthenticated_principal_is_a_super_user_and_no_acl_means_no_access(
    tmp_path: Path,
) -> None:
    config = new_security(tmp_path).server_config(port=9093, cport=9094)
    protocols = dict(
        pair.split(":") for pair in config["listener.security.protocol.map"].split(",")
    )
    assert set(protocols.values()) == {"SASL_SSL", "SASL_PLAINTEXT"}
    assert config["advertised.listeners"] == "SASL_SSL://127.0.0.1:9093"
    assert config["super.users"] == "User:admin"
    assert config["allow.everyone.if.no.acl.found"] == "false"


def test_a_user_name_that_cannot_go_into_the_jaas_configuration_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(KafkaProviderError, match="user name 'two words'"):
        new_security(tmp_path, ["two words"])


def test_the_client_settings_file_names_a_private_password_file_and_loads_as_settings(
    tmp_path: Path,
) -> None:
    security = new_security(tmp_path / "broker")
    info = security.info("127.0.0.1:9093", "test")
    config = tmp_path / "client" / "secure.toml"
    write_client_config(info, config)
    text = config.read_text()
    assert info.admin_password not in text
    values = tomllib.loads(text)
    assert values["kafka"]["bootstrap_servers"] == "127.0.0.1:9093"
    password_file = Path(values["kafka"]["sasl"]["password_file"])
    assert password_file == tmp_path / "client" / "secure.password"
    assert password_file.read_text() == info.admin_password
    assert password_file.stat().st_mode & 0o077 == 0
    settings = load_settings(config)
    assert settings.kafka.security_protocol == "SASL_SSL"
    assert settings.kafka.tls.ca_file == security.ca_file
    assert (settings.kafka.sasl.mechanism, settings.kafka.sasl.username) == (
        "SCRAM-SHA-512",
        "admin",
    )


def test_the_broker_info_shows_no_password(tmp_path: Path) -> None:
    info = new_security(tmp_path, ["worker"]).info("127.0.0.1:9093", "test")
    assert all(password not in repr(info) for password in info.users.values())


# --- the running broker -----------------------------------------------------------------------


def _tls(info: SecureBrokerInfo) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(info.ca_file))


def _sasl(
    info: SecureBrokerInfo, user: str, mechanism: str, password: str | None = None
) -> dict[str, Any]:
    """aiokafka options for ``user`` over TLS; ``password`` defaults to the user's."""
    return {
        "bootstrap_servers": info.bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_context": _tls(info),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": info.users[user] if password is None else password,
    }


def _oauth(info: SecureBrokerInfo, sub: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": info.bootstrap_servers,
        "security_protocol": "SASL_SSL",
        "ssl_context": _tls(info),
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": _UnsignedToken(sub),
    }


class _UnsignedToken(AbstractTokenProvider):  # type: ignore[misc]
    """An unsecured JWS (``alg: none``): what Kafka's unsecured validator accepts."""

    def __init__(self, sub: str) -> None:
        self.sub = sub

    async def token(self) -> str:
        now = int(time.time())
        claims = {"sub": self.sub, "iat": now, "exp": now + 600}
        return f"{_b64({'alg': 'none'})}.{_b64(claims)}."


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


@contextlib.asynccontextmanager
async def _admin(options: dict[str, Any]) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _create_topic(info: SecureBrokerInfo, topic: str) -> None:
    async with _admin(_sasl(info, "admin", "SCRAM-SHA-512")) as admin:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])


async def _produce(options: dict[str, Any], topic: str, value: bytes) -> None:
    async with AIOKafkaProducer(**options) as producer, asyncio.timeout(BOUND):
        await producer.send_and_wait(topic, value)


async def test_the_admin_produces_and_consumes_with_scram_sha_512_over_tls(
    secure_kafka: SecureBroker, topic_prefix: str
) -> None:
    info = secure_kafka.info
    topic = f"{topic_prefix}.secured"
    await _create_topic(info, topic)
    options = _sasl(info, "admin", "SCRAM-SHA-512")
    await _produce({**options, "enable_idempotence": True}, topic, b"over tls")
    group = f"{topic_prefix}.readers"
    consumer = AIOKafkaConsumer(topic, **options, group_id=group, auto_offset_reset="earliest")
    async with consumer, asyncio.timeout(BOUND):
        record = await consumer.getone()
    assert record.value == b"over tls"


@pytest.mark.parametrize("mechanism", PASSWORD_MECHANISMS)
async def test_every_user_authenticates_with_its_password(
    secure_kafka: SecureBroker, mechanism: str
) -> None:
    info = secure_kafka.info
    for user in info.users:
        async with _admin(_sasl(info, user, mechanism)) as admin:
            await admin.list_topics()  # answered only after authentication


@pytest.mark.parametrize("mechanism", PASSWORD_MECHANISMS)
async def test_a_wrong_password_is_refused(
    secure_kafka: SecureBroker, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = _sasl(secure_kafka.info, "worker", mechanism, password="not-the-password")
    with caplog.at_level(logging.ERROR, "aiokafka"), pytest.raises(KafkaConnectionError):
        async with _admin(options):
            pass
    assert "SaslAuthenticationFailed" in caplog.text


async def test_a_client_that_does_not_trust_the_broker_ca_is_refused(
    secure_kafka: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    options = _sasl(secure_kafka.info, "admin", "SCRAM-SHA-512")
    options["ssl_context"] = ssl.create_default_context()
    trustme.CA().configure_trust(options["ssl_context"])  # some other CA
    with caplog.at_level(logging.ERROR, "aiokafka"), pytest.raises(KafkaConnectionError):
        async with _admin(options):
            pass
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_the_client_listener_does_not_speak_plaintext(secure_kafka: SecureBroker) -> None:
    with pytest.raises(KafkaProviderError, match="does not answer"):
        check_bootstrap(secure_kafka.info.bootstrap_servers, "PLAINTEXT", timeout_s=10)


async def test_a_user_no_acl_names_may_not_write_where_the_admin_may(
    secure_kafka: SecureBroker, topic_prefix: str
) -> None:
    info = secure_kafka.info
    topic = f"{topic_prefix}.guarded"
    await _create_topic(info, topic)
    await _produce(_sasl(info, "admin", "SCRAM-SHA-512"), topic, b"allowed")
    with pytest.raises(TopicAuthorizationFailedError):
        await _produce(_sasl(info, "nobody", "SCRAM-SHA-512"), topic, b"denied")


async def test_oauthbearer_takes_the_principal_from_the_unsigned_tokens_sub(
    secure_kafka: SecureBroker, topic_prefix: str
) -> None:
    info = secure_kafka.info
    topic = f"{topic_prefix}.oauth"
    await _create_topic(info, topic)
    await _produce(_oauth(info, "admin"), topic, b"as the super user")
    with pytest.raises(TopicAuthorizationFailedError):
        await _produce(_oauth(info, "nobody"), topic, b"as nobody")


async def test_the_bridge_settings_of_a_user_reach_the_broker_as_that_user(
    secure_kafka: SecureBroker, topic_prefix: str
) -> None:
    info = secure_kafka.info
    topic = f"{topic_prefix}.described"
    await _create_topic(info, topic)
    async with kafka_admin(load_settings(**info.client_settings("admin"))) as admin:
        assert topic in await admin.list_topics()
    async with kafka_admin(load_settings(**info.client_settings("nobody"))) as admin:
        assert topic not in await admin.list_topics()  # no DESCRIBE for nobody


# --- bridge kafka start --secure ----------------------------------------------------------------


def _bridge(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


# It starts brokers of its own (two JVM starts, ~17 s): with the Kafka tests, as
# test_broker.py's detached broker, not in `make test-fast`'s broker-free tier.
@pytest.mark.kafka
@pytest.mark.slow
def test_kafka_start_secure_writes_client_settings_that_outlive_a_restart(
    tmp_path: Path, topic_prefix: str
) -> None:
    config = tmp_path / "client" / "secure.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIDGE_")}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env.update(
        BRIDGE_KAFKA__LOCAL__STATE_DIR=str(tmp_path / "state"),
        BRIDGE_KAFKA__LOCAL__USE_DOCKER="false",
        BRIDGE_TOPICS__PREFIX=topic_prefix,
    )
    try:
        started = _bridge(env, "kafka", "start", "--secure", "--write-config", str(config))
        if started.returncode != 0 and "Maven" in started.stderr:
            unavailable(f"no local Kafka jars: {started.stderr.strip()}")
        assert f"client settings in {config}" in _ok(started)
        assert f"client settings in {config}" in _ok(_bridge(env, "kafka", "status"))
        assert "created" in _ok(_bridge(env, "--config", str(config), "topics", "create"))

        plaintext = _bridge(env, "kafka", "start")
        assert plaintext.returncode == 2
        assert "a secured (SASL_SSL) local broker is running" in plaintext.stderr

        # the users live in the formatted storage: a restart keeps the file's password valid
        assert _ok(_bridge(env, "kafka", "stop")) == "kafka stopped\n"
        _ok(_bridge(env, "kafka", "start", "--secure", "--write-config", str(config)))
        assert "exists" in _ok(_bridge(env, "--config", str(config), "topics", "create"))
    finally:
        _bridge(env, "kafka", "stop")
