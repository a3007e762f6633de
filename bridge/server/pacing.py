"""Replay pacing: a bound on the events per second one stream's catch-up sends.

Where it sits: inside the stream hub's catch-up loop (:mod:`bridge.server.streams`). When a
replica goes away, every client it served comes back at once, and each reconnecting stream
replays what it missed from the log as fast as Kafka hands it over: a burst of reads and writes
on the replicas that take them over. With ``recovery.replay_events_per_s`` set, each stream's
catch-up is a token bucket: ``burst`` events at once, then that many per second (a batch is
sent whole, and the next waits until the bucket has paid for it). Live events are never held.

What it does not do: bound live delivery, or pace streams against each other (each stream has
its own bucket: the admission limits bound how many there are).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["ReplayPace"]


class ReplayPace:
    """One stream's token bucket over ``clock`` (monotonic seconds).

    ``wait(seconds)`` suspends for up to that long and returns False when the stream should
    stop instead (the hub's: it returns early when the process drains); ``on_paced`` counts the
    seconds waited (a metric, wired at composition).
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float],
        wait: Callable[[float], Awaitable[bool]],
        on_paced: Callable[[float], object] = lambda seconds: None,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a pace needs a positive rate and a burst of at least 1")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._wait = wait
        self._on_paced = on_paced
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now

    async def take(self, events: int) -> bool:
        """Pay for ``events`` about to be sent: returns at once while the bucket has them,
        else after the wait that pays the debt. False when the stream should stop."""
        self._refill()
        if self._tokens < 0:  # the last batch's debt: wait until it is paid
            delay = -self._tokens / self._rate
            self._on_paced(delay)
            if not await self._wait(delay):
                return False
            self._refill()
        self._tokens -= events  # a batch larger than the bucket goes whole, in debt
        return True
