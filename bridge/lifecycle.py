"""One shape for every long-lived component: ``start``/``stop``, usable as ``async with``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Lifecycle"]


class Lifecycle:
    """Subclasses implement ``start`` and ``stop``; ``async with`` calls them."""

    async def start(self) -> None:
        """Acquire connections and start background work."""

    async def stop(self) -> None:
        """Release everything; safe to call more than once."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
