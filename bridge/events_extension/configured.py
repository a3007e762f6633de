"""Configured event sources: an existing pipeline's Kafka topic as an event type.

Each ``events.sources`` entry of the settings (:class:`~bridge.config.EventSourceSpec`) becomes
one :class:`ConfiguredSource`. Every partition of the topic is read (a pipeline's partitioner is
its own business, so a key filter cannot pick one partition for sure); a record is an
occurrence when it passes the filters (a fixed key or the key named by an argument, headers
fixed or named by arguments) and its value is a JSON object that the declared payload schema
accepts. Records that pass the filters but fail the value checks (no value, larger than
``tasks.max_event_bytes``, not wire JSON, not an object, schema) are skipped and counted: whatever
bytes a producer writes, a poll or a stream goes on.

* **Authorization**: the principals the entry lists (``"*"``: every caller); nobody by default.
  Anyone else is refused with :class:`NotPermitted` before the arguments are looked at.
* **Occurrence**: ``eventId`` ``<name>/<partition>-<offset>`` (the source's name and the record's
  position: the same on every replica, and no other source's), ``timestamp`` the record's,
  ``data`` its value.
* **Cursor**: the next offset of every partition, ``k1.<topic tag>.<o0>.<o1>...``
  (:func:`~bridge.events_extension.cursor.encode_offsets`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from bridge.config import EventSourceSpec
from bridge.events_extension.cursor import decode_offsets, encode_offsets, topic_tag
from bridge.events_extension.kafkalog import Record
from bridge.events_extension.occurrences import Occurrence, record_event_id, record_position
from bridge.events_extension.offsets import Found, OffsetSource, Selection
from bridge.events_extension.skips import Skips
from bridge.events_extension.sources import validated
from bridge.strictjson import NotWireJson, loads

__all__ = ["ConfiguredSource", "NotPermitted", "input_schema"]

#: The principal entry that admits every caller.
EVERYONE = "*"


class NotPermitted(PermissionError):
    """The caller may not read this event type."""

    def __init__(self, name: str) -> None:
        super().__init__(f"not permitted to read event {name}")


def input_schema(spec: EventSourceSpec) -> dict[str, Any]:
    """The arguments of ``spec``: its key argument (required), its header arguments."""
    properties: dict[str, Any] = {}
    if spec.key_argument is not None:
        properties[spec.key_argument] = {
            "type": "string",
            "minLength": 1,
            "description": "Only records with this key",
        }
    for argument, header in spec.header_arguments.items():
        properties[argument] = {
            "type": "string",
            "description": f"Only records whose header {header!r} has this value",
        }
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if spec.key_argument is not None:
        schema["required"] = [spec.key_argument]
    return schema


def _has_headers(record: Record, wanted: Mapping[str, bytes]) -> bool:
    present = {(name, value) for name, value in record.headers or ()}
    return all((name, value) in present for name, value in wanted.items())


class ConfiguredSource(OffsetSource):
    """One configured event type (see the module docstring)."""

    def __init__(
        self, spec: EventSourceSpec, *args: Any, max_value_bytes: int, **kwargs: Any
    ) -> None:
        super().__init__(spec.name, spec.topic, *args, next_poll_ms=spec.poll_interval_ms, **kwargs)
        self.spec = spec
        self.max_value_bytes = max_value_bytes
        self.skips = Skips(spec.name)
        self._input = jsonschema.Draft202012Validator(input_schema(spec))
        self._payload = jsonschema.Draft202012Validator(spec.payload_schema)
        self._tag = topic_tag(spec.topic)

    def descriptor(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.spec.description,
            "delivery": ["poll", "push"],
            "inputSchema": input_schema(self.spec),
            "payloadSchema": self.spec.payload_schema,
        }

    def permits(self, principal: str) -> bool:
        return EVERYONE in self.spec.principals or principal in self.spec.principals

    async def select(self, principal: str, arguments: dict[str, Any]) -> Selection:
        if not self.permits(principal):
            raise NotPermitted(self.name)
        validated(self._input, arguments)
        spec = self.spec
        key = spec.key if spec.key_argument is None else arguments[spec.key_argument]
        headers = {name: value.encode("utf-8") for name, value in spec.headers.items()}
        for argument, header in spec.header_arguments.items():
            if argument in arguments:
                headers[header] = str(arguments[argument]).encode("utf-8")
        wanted_key = None if key is None else str(key).encode("utf-8")
        partitions = tuple(await self.reader.partitions(self.topic))
        return Selection(partitions, functools.partial(self._match, wanted_key, headers))

    async def read_event(
        self, principal: str, arguments: dict[str, Any], event_id: str
    ) -> Occurrence | None:
        """The occurrence ``event_id`` of this source for the subscription, or None (see
        :meth:`~bridge.events_extension.offsets.OffsetSource.read_at`): its id names its record."""
        position = record_position(self.name, event_id)
        if position is None:
            await self.select(principal, arguments)  # refused as a poll would be, all the same
            return None
        return await self.read_at(principal, arguments, *position)

    def _match(
        self, key: bytes | None, headers: Mapping[str, bytes], record: Record
    ) -> Found | None:
        if key is not None and record.key != key:
            return None
        if headers and not _has_headers(record, headers):
            return None
        data = self._data(record.value)
        if data is None:
            return None
        event_id = record_event_id(self.name, record.partition, record.offset)
        return Found(event_id, int(record.timestamp), data)

    def _data(self, value: bytes | None) -> dict[str, Any] | None:
        """The record value as occurrence data; None (counted) when it cannot be one."""
        if value is None or len(value) > self.max_value_bytes:
            self.skips.add("no_value" if value is None else "too_large")
            return None
        try:
            data = loads(value)
        except NotWireJson:
            self.skips.add("not_json")
            return None
        if not isinstance(data, dict):
            self.skips.add("not_object")
            return None
        try:
            valid = self._payload.is_valid(data)
        except Exception:  # e.g. a $ref the schema cannot resolve: the record, not the poll, fails
            valid = False
        if not valid:
            self.skips.add("schema")
            return None
        return data

    def encode(self, positions: Mapping[int, int]) -> str:
        return encode_offsets(self._tag, positions)

    def decode(self, cursor: str, partitions: Sequence[int]) -> dict[int, int]:
        return decode_offsets(cursor, self._tag)
