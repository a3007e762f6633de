"""What every provider hands out: a :class:`Broker` handle, its :class:`BrokerInfo`, and the
one error, :class:`KafkaProviderError`.

The bottom of :mod:`bridge.devkafka`: it imports none of the package's other modules and starts
nothing. Each handle that owns something to stop lives beside the code that starts it
(:class:`~bridge.devkafka.local.LocalBroker`, :class:`~bridge.devkafka.docker.DockerBroker`,
:class:`~bridge.devkafka.provider.ExternalBroker`). Also the default progress line and the
one-line exception text the other modules put into their messages.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BrokerInfo:
    """Where a broker answers and what provides it."""

    bootstrap_servers: str
    provider: Literal["external", "docker", "local"]
    #: Human text: version, pid, log file, container id...
    detail: str


class KafkaProviderError(Exception):
    """No broker could be provided; the message says why and what to do next."""


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


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
