"""Kafka client factories: the one place that knows how the bridge configures aiokafka.

Every client is built through ``_common``: bootstrap servers, client id, and the security
options of :func:`bridge.kafka.security.client_security_options` (TLS, SASL). Every producer is
idempotent (acks=all) except the pipeline-like :func:`plain_producer`; every consumer reads
``read_committed`` and never auto-resets offsets (``auto_offset_reset="none"``), so an
out-of-range position is an error we handle, not a silent jump. Nothing here knows about tasks
or seq.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    BrokerResponseError,
    KafkaError,
    OffsetOutOfRangeError,
    ProducerFenced,
)
from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord, RecordMetadata, TopicPartition

from bridge.config import Settings
from bridge.kafka.security import client_security_options

__all__ = [
    "AIOKafkaConsumer",
    "AIOKafkaProducer",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "KafkaError",
    "OffsetOutOfRangeError",
    "ProducerFenced",
    "RecordMetadata",
    "RecordsToDelete",
    "TopicPartition",
    "admin_client",
    "bootstrap",
    "check_credentials",
    "committed_consumer",
    "fence_timeout_s",
    "idempotent_producer",
    "partition_for_key",
    "plain_producer",
    "request_timeout_s",
    "retriable",
    "transactional_producer",
]


def bootstrap(settings: Settings) -> str:
    """The bootstrap servers of ``settings``; a clear error when none is configured."""
    if not settings.kafka.bootstrap_servers:
        raise RuntimeError(
            "no Kafka cluster configured: set BRIDGE_KAFKA__BOOTSTRAP_SERVERS (or "
            "KAFKA_BOOTSTRAP_SERVERS), or start the local broker with `bridge kafka start`"
        )
    return settings.kafka.bootstrap_servers


def retriable(exc: KafkaError) -> bool:
    """False only for a broker's answer that retrying cannot change (aiokafka's ``retriable``
    is false on a broker error: an authorization refused, a message too large, an unsupported
    version). Every other Kafka error says that Kafka did not answer, or not yet: a connection,
    a leader or a coordinator missing, a client-side timeout, cluster metadata unreachable
    (which aiokafka raises as a bare ``KafkaError``)."""
    return exc.retriable or not isinstance(exc, BrokerResponseError)


#: aiokafka's request timeout when ``kafka.request_timeout_ms`` is unset.
DEFAULT_REQUEST_TIMEOUT_MS = 40_000


def request_timeout_s(settings: Settings) -> float:
    """Seconds a client waits for a broker's answer (the setting, or aiokafka's default)."""
    return (settings.kafka.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS) / 1000


def fence_timeout_s(settings: Settings) -> float:
    """Seconds a new transactional writer waits to fence the older one (InitProducerId): two
    request timeouts, time for the coordinator to abort the older writer's open transaction."""
    return 2 * request_timeout_s(settings)


def _common(settings: Settings, role: str) -> dict[str, Any]:
    # Built anew for each client: secrets in files are read now, so a rotated one is used.
    options = {
        "bootstrap_servers": bootstrap(settings),
        "client_id": f"{settings.kafka.client_id}-{role}",
        **client_security_options(settings),
    }
    if settings.kafka.request_timeout_ms is not None:
        options["request_timeout_ms"] = settings.kafka.request_timeout_ms
    return options


async def check_credentials(settings: Settings, timeout_s: float = 10.0) -> None:
    """Open one connection to a bootstrap server as every client would: TLS, then SASL.

    Raises what the first refused server raised (``ssl.SSLCertVerificationError``,
    ``SaslAuthenticationFailed``, :class:`~bridge.kafka.security.KafkaSecurityError`, ...),
    which a client would only have logged before giving up with "unable to bootstrap".
    """
    options = _common(settings, "check")
    del options["bootstrap_servers"]
    options.pop("request_timeout_ms", None)  # this check's own bound below
    failure: BaseException | None = None
    for host, port, _family in collect_hosts(bootstrap(settings), randomize=False):
        try:
            connection = await create_conn(
                host, port, request_timeout_ms=int(timeout_s * 1000), **options
            )
        except (OSError, KafkaError, TimeoutError) as exc:
            failure = failure or exc
            continue
        connection.close()
        return
    assert failure is not None, "collect_hosts gives at least one address"
    raise failure


def admin_client(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client; the caller must ``await start()`` and ``await close()``."""
    options = {"request_timeout_ms": 30_000, **_common(settings, "admin")}
    return AIOKafkaAdminClient(**options)


def idempotent_producer(
    settings: Settings, role: str = "producer", **overrides: Any
) -> AIOKafkaProducer:
    """An idempotent acks=all producer whose request size admits ``tasks.max_event_bytes`` records."""
    options: dict[str, Any] = {
        **_common(settings, role),
        "enable_idempotence": True,
        "acks": "all",
        "linger_ms": 2,
        "max_request_size": max(1_048_576, settings.tasks.max_event_bytes + 64 * 1024),
    }
    options.update(overrides)
    return AIOKafkaProducer(**options)


def committed_consumer(
    settings: Settings, role: str = "reader", **overrides: Any
) -> AIOKafkaConsumer:
    """A group-less, manually assigned consumer reading only committed records."""
    options: dict[str, Any] = {
        **_common(settings, role),
        "group_id": None,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "none",
        "max_partition_fetch_bytes": max(1_048_576, settings.tasks.max_event_bytes + 64 * 1024),
        "fetch_max_wait_ms": 100,
    }
    options.update(overrides)
    return AIOKafkaConsumer(**options)


def plain_producer(settings: Settings, role: str = "pipeline") -> AIOKafkaProducer:
    """A producer like any other pipeline's (no idempotence, default acks): for examples."""
    return AIOKafkaProducer(**_common(settings, role))


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner (murmur2) picks for ``key``."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def transactional_producer(settings: Settings, transactional_id: str) -> AIOKafkaProducer:
    """A transactional producer; a newer one with the same id fences this one."""
    return idempotent_producer(
        settings,
        role="indexer",
        transactional_id=transactional_id,
        transaction_timeout_ms=15_000,
        linger_ms=5,
    )
