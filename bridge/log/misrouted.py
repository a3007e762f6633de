"""Task events in a partition their task id does not map to: counted, and logged at a bounded rate.

Every event of a task must land in the partition that the Java client's default partitioner
(murmur2 of the key) picks for its task id: that partition holds the task's ``task.created``
and derives its seq. A producer with another partitioner (librdkafka's default
``consistent_random``, kafka-go's round robin, Flink's fixed partitioner) puts events
elsewhere, where they belong to no task: no stream, ``tasks/get`` or index ever shows them.
:class:`MisroutedEvents` notices them as the indexer applies records (docs/workers.md,
"Partitioning"; docs/operations.md, "Misrouted task events" is the runbook).

The check costs one hash per task id and partition (at the id's first record there, seq 0; a
task's own ``task.created`` has it cached already), and one dict lookup per record while
misrouted ids are remembered; the indexer skips the call for every other record. The hash is
linear in the key and any producer picks keys (up to the broker's record size): a key longer
than any bridge task id could be (``MAX_CHECKED_KEY_CHARS``) is never hashed, since it cannot
be a task's. It knows
nothing of Kafka clients; the indexer calls it, and the owner of the metric passes the count.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MAX_CHECKED_KEY_CHARS", "MisroutedEvents"]

log = logging.getLogger(__name__)

#: How many misrouted task ids are remembered, so that their later events count too.
_REMEMBERED = 4096
#: The characters of a task id a warning quotes.
_LOGGED_ID_CHARS = 64
#: Keys longer than this are not checked: a bridge task id is 32 URL-safe characters
#: (bridge.tasks.messages), and hashing a pipeline's megabyte key would hold the event loop.
MAX_CHECKED_KEY_CHARS = 64
#: At most one warning per this many seconds; the ones in between are summed into the next.
_LOG_EVERY_S = 60.0


def _count_nothing() -> None:
    """A count nobody keeps (an indexer outside a server)."""


class MisroutedEvents:
    """Counts the events of a partition whose task id maps to another partition.

    ``partition_of(task_id)`` is the partition the id maps to; ``on_misrouted`` is called once
    per misrouted event (the server passes its counter's ``inc``).
    """

    def __init__(
        self,
        partition_of: Callable[[str], int],
        on_misrouted: Callable[[], None] | None = None,
        *,
        log_every_s: float = _LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._partition_of = partition_of
        self._on_misrouted = on_misrouted or _count_nothing
        self._log_every_s = log_every_s
        self._clock = clock
        #: The misrouted (task id, partition) pairs whose later events count too: while empty,
        #: only a task id's first record in a partition (seq 0) needs :meth:`check`.
        self.remembered: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._next_log = float("-inf")
        self._unlogged = 0
        #: Misrouted events seen by this process.
        self.count = 0

    def check(self, task_id: str, partition: int, seq: int) -> None:
        """The record of ``task_id`` with derived ``seq`` was applied in ``partition``."""
        if seq != 0:
            if (task_id, partition) not in self.remembered:
                return  # the common case: a later event of a task already found in place
        elif len(task_id) > MAX_CHECKED_KEY_CHARS:
            return  # not a bridge task id, whatever partition it is in: never hashed
        elif self._partition_of(task_id) == partition:
            return
        else:
            self._remember((task_id, partition))
        self.count += 1
        self._on_misrouted()
        self._report(task_id, partition)

    def _remember(self, key: tuple[str, int]) -> None:
        self.remembered[key] = None
        if len(self.remembered) > _REMEMBERED:
            self.remembered.popitem(
                last=False
            )  # the oldest: its later events are no longer counted

    def _report(self, task_id: str, partition: int) -> None:
        self._unlogged += 1
        now = self._clock()
        if now < self._next_log:
            return
        self._next_log = now + self._log_every_s
        log.warning(
            "%d task event(s) landed in a partition their task id does not map to, e.g. task "
            "%r in partition %d instead of %d: they belong to no task; a producer is not using "
            "the murmur2 partitioner (docs/operations.md, 'Misrouted task events')",
            self._unlogged,
            # Any producer picks the key: quoted and cut, so it can neither forge log lines
            # nor make one huge.
            task_id[:_LOGGED_ID_CHARS],
            partition,
            self._partition_of(task_id),
        )
        self._unlogged = 0
