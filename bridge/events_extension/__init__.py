"""The Events extension (SEP-3415) on the Kafka log: event sources and their cursors, the live
topic tails of push streams, and webhook subscriptions with their delivery.

Data flow: the log (:mod:`bridge.log.reader` for history, :mod:`bridge.log.fanout` for live
events) → an event source (:mod:`bridge.events_extension.sources`) → occurrences and poll
batches (:mod:`bridge.events_extension.occurrences`) → the ``events/*`` methods, the
extension's JSON-RPC face (:mod:`bridge.server.events`). Nothing here knows HTTP or JSON-RPC.
"""

from bridge.events_extension.cursor import BadCursor
from bridge.events_extension.occurrences import Active, Heartbeat, Occurrence, PollBatch, StreamItem
from bridge.events_extension.sources import EventSource, InvalidArguments, TaskEvents

__all__ = [
    "Active",
    "BadCursor",
    "EventSource",
    "Heartbeat",
    "InvalidArguments",
    "Occurrence",
    "PollBatch",
    "StreamItem",
    "TaskEvents",
]
