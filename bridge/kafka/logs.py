"""What aiokafka logs, as the bridge's operators should read it.

aiokafka logs at ERROR every failed lookup of a consumer group's coordinator, then retries it.
At the first start of a cluster (or of a group) the broker answers "coordinator not available"
or "load in progress" until it has created the offsets topic and loaded the group: an expected
transient that ``make demo`` printed as ``ERROR ... GroupCoordinatorNotAvailableError`` before
the bridge was ready. :class:`StartupTransients` demotes exactly those records to INFO for a
minute from the first of them, i.e. from the group's first coordinator lookup, not from the
process start: a broker that is slow to come up (the demo starts its own; a pod may start before
its Kafka) does not use up the window before the group even asks. Later ones stay ERROR (a
coordinator missing that long is worth an operator's look). The command line installs it once, where it configures logging
(:func:`demote_startup_transients`); the library never touches logging.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiokafka.errors import GroupCoordinatorNotAvailableError, GroupLoadInProgressError

__all__ = ["COORDINATOR_LOGGER", "STARTUP_S", "StartupTransients", "demote_startup_transients"]

#: The aiokafka logger of the group coordinator, where the lookup failures are logged.
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"
#: How long after the first coordinator lookup failure a missing coordinator counts as the
#: start's transient: a first start of the local broker takes a few seconds to create
#: ``__consumer_offsets`` once it answers.
STARTUP_S = 60.0
#: The broker's answers while a coordinator is being set up (error codes 14 and 15).
_TRANSIENT = (GroupCoordinatorNotAvailableError, GroupLoadInProgressError)


class StartupTransients(logging.Filter):
    """Demote the coordinator-not-ready ERROR records to INFO for ``window_s`` from the first.

    The window opens at the first such record (the first failed lookup: the group's join has
    begun, whenever the broker came up), once per process. A demoted record is kept only if its
    logger would have logged it at INFO, so a process that shows only warnings (the demo's
    narration) does not show it at all.
    """

    def __init__(
        self, window_s: float = STARTUP_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._clock = clock
        self._window_s = window_s
        self._until: float | None = None  # set by the first transient record

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._transient(record):
            return True
        if self._until is None:
            self._until = self._clock() + self._window_s
        if self._clock() >= self._until:
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg = f"{record.msg} (expected while the group coordinator starts; retrying)"
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)

    @staticmethod
    def _transient(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return record.levelno == logging.ERROR and any(isinstance(a, _TRANSIENT) for a in args)


def demote_startup_transients(window_s: float = STARTUP_S) -> StartupTransients:
    """Install (once per process) the filter on aiokafka's group coordinator logger."""
    logger = logging.getLogger(COORDINATOR_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, StartupTransients):
            return existing
    installed = StartupTransients(window_s)
    logger.addFilter(installed)
    return installed
