"""The Events client profile of a deployment: which client's wire the ``events/*`` methods speak.

One setting (``events.profile``, env ``BRIDGE_EVENTS__PROFILE``) chooses it for the whole
deployment, as other servers do: the bridge never guesses per request. Two profiles:

* ``sep-3415`` (the default): the Events extension as docs/events.md describes it (the SEP at
  the commit that page follows), every delivery mode, ``gap`` and ``terminated`` envelopes.
* ``chatgpt``: what ChatGPT's MCP Events integration expects (OpenAI's "MCP Events" guide, and
  servers tested with ChatGPT; docs/events.md, "Connecting ChatGPT"): a top-level
  ``capabilities.events: {}`` on ``server/discover`` and on the legacy ``initialize`` (beside the
  extension key), the Events methods on the legacy path too, callback verification failures as
  ``-32015``, ``{}`` for an unsubscribe of an unknown subscription, no ``deliveryStatus`` in the
  subscribe result, no control envelopes, request bodies of at most 256 KiB, and a task's
  outcome inline in ``task.updated`` deliveries when it fits.

Poll and push stay available to every client under both profiles; storage, delivery, signing,
the SSRF rules and at-least-once delivery from the Kafka cursor are shared.

Where it sits: built once at composition (:meth:`EventsProfile.of`), consulted by the wire layer
(:mod:`bridge.server.handlers` for capabilities and the legacy methods, :mod:`bridge.server.events`
for errors and results) and handed to the delivery loops as plain values
(:class:`~bridge.events_extension.delivery.DeliveryPolicy`). Nothing else reads the setting: no module
asks which profile is on, each asks the profile what to do. The settings check
(:meth:`EventsProfile.problems`, run when the settings load) is the profile's too: the settings
a profile cannot work without are refused at start, naming them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from bridge.config import Settings, env_name
from bridge.server.wire import CALLBACK_ENDPOINT_ERROR, CHATGPT_CALLBACK_ENDPOINT_ERROR

__all__ = [
    "CHATGPT",
    "CHATGPT_ANSWER_WITHIN_S",
    "CHATGPT_MAX_BODY_BYTES",
    "CHATGPT_TIMEOUT_S",
    "EVENTS_EXTENSION",
    "EVENTS_METHODS",
    "SEP_3415",
    "EventsProfile",
    "check_profile",
]

#: The identifier of the Events extension (its key under ``capabilities.extensions``).
EVENTS_EXTENSION = "io.modelcontextprotocol/events"
#: The methods ChatGPT calls (it neither polls nor streams).
EVENTS_METHODS = ("events/list", "events/subscribe", "events/unsubscribe")
#: ChatGPT's bound on one webhook request body, the envelope included (256 KiB).
CHATGPT_MAX_BODY_BYTES = 256 * 1024
#: About how long ChatGPT waits for an answer (to its MCP requests; its receiver answers within
#: it too): ``events/subscribe`` runs the verification challenge inside it, so the challenge's
#: own deadline (``webhooks.timeout_s``) must leave room for the answer (a settings check holds
#: it below 8 s under this profile).
CHATGPT_TIMEOUT_S = 10.0
#: The bridge answers ChatGPT's ``events/subscribe`` within this (or refuses it, retriable,
#: storing nothing), leaving the rest of :data:`CHATGPT_TIMEOUT_S` to the network.
CHATGPT_ANSWER_WITHIN_S = 8.0


@dataclass(frozen=True, slots=True)
class EventsProfile:
    """What differs between the Events clients this server speaks to (see the module docstring)."""

    #: The setting's value: ``"sep-3415"`` or ``"chatgpt"``.
    name: str
    #: Advertise ``capabilities.events: {}`` beside the extension key.
    top_level_capability: bool
    #: The Events methods the legacy (``initialize``) path serves besides its own.
    legacy_methods: tuple[str, ...]
    #: The code of a failed callback verification (the SEP's ``CallbackEndpointError``).
    callback_error_code: int
    #: ``events/unsubscribe`` of a subscription that does not exist answers ``NotFound``
    #: (else ``{}``).
    unknown_unsubscribe_is_error: bool
    #: A refresh's result reports the ``deliveryStatus`` it resumes.
    reports_delivery_status: bool
    #: ``gap`` and ``terminated`` envelopes are sent to webhook endpoints.
    control_envelopes: bool
    #: The largest webhook request body sent as is; a larger one is reduced (None: no bound).
    max_body_bytes: int | None
    #: ``task.updated`` deliveries of completed and failed tasks carry the result (or the
    #: error) inline when the body still fits, instead of only the request that fetches it.
    inline_outcomes: bool
    #: ``events/subscribe`` answers within this many seconds, the verification challenge
    #: included, or refuses (retriable) without storing anything (None: no deadline).
    answer_within_s: float | None = None
    #: The client subscribes by webhook only: the settings must offer webhooks (an
    #: authenticating auth mode and a key that seals secrets at rest).
    needs_webhooks: bool = False

    @staticmethod
    def of(settings: Settings) -> EventsProfile:
        """The profile the settings choose."""
        return CHATGPT if settings.events.profile == "chatgpt" else SEP_3415

    def problems(self, settings: Settings) -> list[str]:
        """What in ``settings`` this profile cannot work with, each naming the settings to
        change (empty: none). :func:`check_profile` runs it when the app is built, so a
        deployment that would advertise events to a client it can never deliver to does not
        start."""
        found: list[str] = []
        named = f"{env_name('events', 'profile')}={self.name}"
        bound = self.answer_within_s
        if bound is not None and settings.webhooks.timeout_s >= bound:
            found.append(
                f"{named} needs webhooks.timeout_s below {bound:g} s "
                f"({env_name('webhooks', 'timeout_s')}): the client waits about "
                f"{CHATGPT_TIMEOUT_S:g} s for events/subscribe, which runs the verification "
                "challenge inside it"
            )
        if self.needs_webhooks and settings.auth.mode == "none":
            found.append(
                f"{named} needs an authenticating auth mode ({env_name('auth', 'mode')}): "
                "the client subscribes by webhook only, and webhooks need a principal"
            )
        if self.needs_webhooks and settings.webhooks.keys.file is None:
            found.append(
                f"{named} needs a key that seals webhook secrets at rest "
                f"({env_name('webhooks', 'keys', 'file')}): without it webhooks are off, and the "
                "client subscribes by webhook only"
            )
        return found

    def capabilities(self, extensions: Collection[str]) -> dict[str, Any]:
        """The top-level capability keys to add for the extensions served (``{}`` or
        ``{"events": {}}``): never advertised when the Events extension is not served."""
        if self.top_level_capability and EVENTS_EXTENSION in extensions:
            return {"events": {}}
        return {}


SEP_3415 = EventsProfile(
    name="sep-3415",
    top_level_capability=False,
    legacy_methods=(),
    callback_error_code=CALLBACK_ENDPOINT_ERROR,
    unknown_unsubscribe_is_error=True,
    reports_delivery_status=True,
    control_envelopes=True,
    max_body_bytes=None,
    inline_outcomes=False,
)

CHATGPT = EventsProfile(
    name="chatgpt",
    top_level_capability=True,
    legacy_methods=EVENTS_METHODS,
    callback_error_code=CHATGPT_CALLBACK_ENDPOINT_ERROR,
    unknown_unsubscribe_is_error=False,
    reports_delivery_status=False,
    control_envelopes=False,
    max_body_bytes=CHATGPT_MAX_BODY_BYTES,
    inline_outcomes=True,
    answer_within_s=CHATGPT_ANSWER_WITHIN_S,
    needs_webhooks=True,
)


def check_profile(settings: Settings) -> None:
    """Refuse (``ValueError``, naming the settings to change) settings the chosen Events
    profile cannot work with: called where the app is composed, beside the exposure check
    (not by the settings model: this module reads the settings)."""
    problems = EventsProfile.of(settings).problems(settings)
    if problems:
        raise ValueError("; ".join(problems))
