"""The Events extension (SEP-3415) on the Kafka log: event sources and their cursors.

Data flow: the log (:mod:`bridge.log.reader` for history, :mod:`bridge.log.fanout` for live
events) → an event source (:mod:`bridge.mcpevents.sources`) → occurrences and poll batches
(:mod:`bridge.mcpevents.occurrences`) → the ``events/*`` methods (:mod:`bridge.server.events`).
Nothing here knows HTTP or JSON-RPC.
"""

from bridge.mcpevents.cursor import BadCursor
from bridge.mcpevents.occurrences import Active, Heartbeat, Occurrence, PollBatch, StreamItem
from bridge.mcpevents.sources import EventSource, InvalidArguments, TaskEvents

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
