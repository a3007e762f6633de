"""One Kafka provider for the CLI, the demo, the tests and the benches.

:func:`provide_broker` hands out a running broker, trying in order

1. the cluster named by ``settings.kafka.bootstrap_servers`` (checked with an ApiVersions
   request; :meth:`Broker.stop` leaves it alone),
2. a Docker engine, if ``settings.kafka.local.use_docker`` and one answers within ~1.5 s
   (testcontainers' ``KafkaContainer`` in KRaft mode, :mod:`bridgedev.kafka.docker`),
3. a single-node KRaft broker run from the Maven Central jars of
   ``org.apache.kafka:kafka_2.13:<settings.kafka.local.version>`` in a fresh temporary
   directory, killed (process group) on :meth:`Broker.stop` and at interpreter exit
   (:mod:`bridgedev.kafka.local`).

This module only chooses; how each broker is started lives in the module named above.
"""

from __future__ import annotations

from bridge.config import Settings
from bridge.kafka.probe import EXTERNAL_PROBE_TIMEOUT_S, check_bootstrap
from bridgedev.kafka.broker import (
    Broker,
    BrokerInfo,
    KafkaProviderError,
    Progress,
    _stderr_progress,
)
from bridgedev.kafka.docker import _start_docker, detect_docker
from bridgedev.kafka.local import start_local


class ExternalBroker(Broker):
    """A cluster somebody else runs: :meth:`stop` does nothing."""

    def stop(self) -> None:
        return None


def provide_broker(settings: Settings, *, progress: Progress | None = None) -> Broker:
    """A running broker: the configured cluster, else Docker, else local jars (see module doc)."""
    say = progress or _stderr_progress
    if settings.kafka.bootstrap_servers:
        addr = check_bootstrap(
            settings.kafka.bootstrap_servers,
            settings.kafka.security_protocol,
            timeout_s=EXTERNAL_PROBE_TIMEOUT_S,
        )
        return ExternalBroker(
            BrokerInfo(
                settings.kafka.bootstrap_servers,
                "external",
                f"configured cluster ({settings.kafka.security_protocol}); {addr} answered",
            )
        )
    if settings.kafka.local.use_docker:
        probe = detect_docker()
        if probe.available:
            try:
                return _start_docker(settings, say)
            except KafkaProviderError as exc:
                say(f"Docker Kafka failed, falling back to local jars: {exc}")
        else:
            say(f"{probe.reason}; using local Kafka jars")
    return start_local(settings, progress=say)
