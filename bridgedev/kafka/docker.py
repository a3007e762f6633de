"""Kafka in Docker: testcontainers' ``KafkaContainer`` in KRaft mode, and a bounded probe of
whether a Docker engine answers at all.

``docker`` and ``testcontainers`` are imported only when asked for, so the package works
without them. Whether to use Docker is the provider's choice (:mod:`bridgedev.kafka.provider`).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from bridge.config import Settings
from bridge.kafka.probe import _api_versions, _parse_bootstrap
from bridgedev.kafka.broker import Broker, BrokerInfo, KafkaProviderError, Progress, _one_line
from bridgedev.kafka.kraft import _SINGLE_NODE_CONFIG

#: Image for the Docker provider. Confluent Platform 7.9 is Kafka 3.9; testcontainers'
#: ``KafkaContainer.with_kraft()`` does not work with the 8.x (Kafka 4) images.
DOCKER_IMAGE = "confluentinc/cp-kafka:7.9.0"
#: Bound of the Docker engine probe.
DOCKER_PROBE_TIMEOUT_S = 1.5


class DockerBroker(Broker):
    """A testcontainers ``KafkaContainer``; :meth:`stop` removes the container."""

    def __init__(self, info: BrokerInfo, container: Any) -> None:
        super().__init__(info)
        self._container: Any = container
        self._lock = threading.Lock()

    def stop(self) -> None:
        with self._lock:
            container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()


@dataclass(frozen=True)
class DockerProbe:
    available: bool
    reason: str


def detect_docker(timeout_s: float = DOCKER_PROBE_TIMEOUT_S) -> DockerProbe:
    """Whether a Docker engine answers a ping within ``timeout_s`` (never takes much longer).

    Uses testcontainers' idea of the Docker host (its properties file, ``DOCKER_HOST``, the
    current Docker context). The probe runs in a daemon thread so that even an engine that
    accepts connections and never answers cannot hold the caller past the bound.
    """
    result: list[DockerProbe] = []

    def probe() -> None:
        try:
            docker = importlib.import_module("docker")
            tc_client = importlib.import_module("testcontainers.core.docker_client")
        except ImportError as exc:
            result.append(DockerProbe(False, f"docker/testcontainers not installed ({exc})"))
            return
        try:
            host = tc_client.get_docker_host()
            if host:
                client = docker.DockerClient(base_url=host, timeout=timeout_s)
            else:
                client = docker.from_env(timeout=timeout_s)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:
            result.append(DockerProbe(False, f"no Docker engine answers ({_one_line(exc)})"))
        else:
            result.append(DockerProbe(True, f"Docker engine at {host or 'the default socket'}"))

    thread = threading.Thread(target=probe, name="docker-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.2)
    if not result:
        return DockerProbe(False, f"the Docker engine did not answer within {timeout_s:g} s")
    return result[0]


def _start_docker(settings: Settings, say: Progress) -> Broker:
    try:
        tc_kafka = importlib.import_module("testcontainers.community.kafka")
    except ImportError as exc:
        raise KafkaProviderError(f"testcontainers' Kafka module is missing: {exc}") from exc
    say(f"starting Kafka in Docker ({DOCKER_IMAGE}, KRaft)")
    started = time.monotonic()
    container: Any = None
    try:
        container = tc_kafka.KafkaContainer(image=DOCKER_IMAGE).with_kraft()
        for key, value in _SINGLE_NODE_CONFIG.items():
            if not key.startswith("share."):  # Kafka 3.9 has no share coordinator
                container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        container.start(timeout=int(settings.kafka.local.start_timeout_s))
        bootstrap = container.get_bootstrap_server()
        _api_versions(*_parse_bootstrap(bootstrap)[0], timeout_s=10.0)
        container_id = container.get_wrapped_container().short_id
    except Exception as exc:
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()
        raise KafkaProviderError(f"Kafka in Docker did not start: {_one_line(exc)}") from exc
    say(f"Kafka (Docker) ready at {bootstrap} in {time.monotonic() - started:.1f} s")
    return DockerBroker(
        BrokerInfo(bootstrap, "docker", f"{DOCKER_IMAGE}, container {container_id}"), container
    )
