"""A webhook subscription as the registry stores it, for the tests that need one."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from bridge.events_extension.subscriptions import Subscription

#: The event name the subscriptions of these tests are to.
NAME = "io.mcpbridge.task.event"
#: A Standard Webhooks secret (32 bytes).
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


def subscription(**changes: Any) -> Subscription:
    """Ann's subscription ``sub_1`` to one task's events, with ``changes``."""
    base = Subscription(
        id="sub_1",
        name=NAME,
        principal="ann",
        arguments={"taskId": "t"},
        url="https://example.com/hooks/1",
        secrets=(SECRET,),
        previous_until_ms=0,
        expires_ms=10_000,
        refreshed_ms=100,
        cursor="c0",
        floor_ms=None,
        delivery_rev=0,
    )
    return dataclasses.replace(base, **changes)
