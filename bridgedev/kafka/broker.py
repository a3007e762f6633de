"""What every provider hands out: a :class:`Broker` handle, its :class:`BrokerInfo`, and the
one error, :class:`KafkaProviderError`; a secured broker's handle carries a
:class:`SecureBrokerInfo`.

Near the bottom of :mod:`bridgedev.kafka`: it imports only the probe (whose error it re-exports)
and starts nothing. Each handle that owns something to stop lives beside the code that starts it
(:class:`~bridgedev.kafka.local.LocalBroker`, :class:`~bridgedev.kafka.docker.DockerBroker`,
:class:`~bridgedev.kafka.provider.ExternalBroker`). Also the default progress line and the
one-line exception text the other modules put into their messages.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

# The probe is the runtime's (the CLI's pre-flight asks it too): the one error and the one-line
# exception text live there, and every provider shares them.
from bridge.kafka.probe import KafkaProviderError, _one_line

__all__ = [
    "Broker",
    "BrokerInfo",
    "KafkaProviderError",
    "Progress",
    "SecureBrokerInfo",
    "_one_line",
    "_stderr_progress",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BrokerInfo:
    """Where a broker answers and what provides it."""

    bootstrap_servers: str
    provider: Literal["external", "docker", "local"]
    #: Human text: version, pid, log file, container id...
    detail: str


@dataclass(frozen=True)
class SecureBrokerInfo(BrokerInfo):
    """A secured local broker: SASL_SSL at ``bootstrap_servers``, the CA its certificate is
    signed by, and its users (SCRAM-SHA-256/512 and PLAIN, one password each)."""

    ca_file: Path
    admin_user: str
    admin_password: str = field(repr=False)
    #: Every user created with the storage, the admin included: ``{name: password}``.
    users: Mapping[str, str] = field(repr=False)
    #: The client settings file of ``bridge kafka start --secure`` (None for other brokers).
    client_config: Path | None = None

    def client_settings(self, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        """Settings overrides (``load_settings(**them)``) connecting as ``user``."""
        sasl = {"mechanism": mechanism, "username": user, "password": self.users[user]}
        return {
            "kafka": {
                "bootstrap_servers": self.bootstrap_servers,
                "security_protocol": "SASL_SSL",
                "tls": {"ca_file": str(self.ca_file)},
                "sasl": sasl,
            }
        }


class Broker(abc.ABC):
    """A running broker. :meth:`stop` is idempotent; also a context manager."""

    info: BrokerInfo

    def __init__(self, info: BrokerInfo) -> None:
        self.info = info

    @property
    def bootstrap_servers(self) -> str:
        return self.info.bootstrap_servers

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the broker (if this handle owns it); safe to call more than once."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.provider} {self.info.bootstrap_servers}>"


def _stderr_progress(message: str) -> None:
    print(f"[kafka] {message}", file=sys.stderr, flush=True)
