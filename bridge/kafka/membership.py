"""Removing a static member from a consumer group now: Kafka's LeaveGroup v3 by instance id.

Where it sits: under :meth:`bridge.kafka.adapter.KafkaLog.remove_members`. A static member
(``group.instance.id``) never leaves its group when its process stops: its partitions stay
assigned, and unserved, until its session times out. Kafka (KIP-345) lets anyone allowed to
act on the group remove such a member by its instance id with LeaveGroup v3+ (what the Java
admin's ``removeMembersFromConsumerGroup`` sends: an unknown member id and the instance id);
aiokafka 0.14 ships LeaveGroup v0/v1 only (one member, by member id) and no admin call for it,
so the v3 request and response are declared here on aiokafka's protocol layer, and sent to the
group's coordinator through the admin client.

What it does not do: decide whom to remove (bridge.server.failover does, from the group's own
ownership map), or retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

__all__ = ["LeaveGroupV3", "remove_static_members"]

#: Kafka's error codes this call treats as "the member is not there" (already gone).
_UNKNOWN_MEMBER_ID = 25


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]  # aiokafka naming of versions
    """LeaveGroup v3's answer: an error for the request, and one per member named."""

    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
    """LeaveGroup v3 (Kafka 2.4+): members named by member id or, for static members, by
    ``group_instance_id`` with an empty member id. Not yet a flexible version (v4 is)."""

    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class LeaveGroupV3(Request[LeaveGroupRequest_v3]):  # type: ignore[misc]
    """Remove the static members ``instance_ids`` from ``group`` (a broker without v3 is
    refused by aiokafka's version negotiation: ``NotImplementedError``)."""

    API_KEY = 13

    def __init__(self, group: str, instance_ids: Sequence[str]) -> None:
        self._group = group
        self._instance_ids = list(instance_ids)

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(self._group, [("", i) for i in self._instance_ids])


def _raise_for(code: int, what: str) -> None:
    if code != 0:
        error: type[KafkaError] = for_code(code)
        raise error(what)


async def remove_static_members(
    admin: AIOKafkaAdminClient, group: str, instance_ids: Sequence[str]
) -> None:
    """Remove the static members ``instance_ids`` from ``group`` at its coordinator: the group
    rebalances at once without them. An instance id the group does not know is no error (it
    left, or was removed already); any other refusal raises the client's ``KafkaError``."""
    if not instance_ids:
        return
    coordinator = await admin.find_coordinator(group)
    # The admin client's own request path (no public call sends an arbitrary request).
    response: Any = await admin._send_request(LeaveGroupV3(group, instance_ids), coordinator)
    _raise_for(response.error_code, f"LeaveGroup of {group!r}")
    for _member_id, instance_id, code in response.members:
        if code != _UNKNOWN_MEMBER_ID:
            _raise_for(code, f"LeaveGroup of {instance_id!r} from {group!r}")
