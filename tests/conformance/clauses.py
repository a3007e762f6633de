"""The clauses of SEP-2694 (Resumable Task Event Streams) the suite reports on, in spec order.

Every MUST / MUST NOT / SHOULD of the SEP is listed, plus the few normative statements written
without a keyword (tagged ``NORMATIVE``) and consequences of its rules that a review found
servers getting wrong (tagged ``DERIVED``: many viewers of one task, a cursor ahead of the
head, records that keep their seq, ...). Each test carries ``@clause(key)``; the session report
prints one row per entry here, so a clause without a test (or whose tests were deselected)
shows up as ``NOT RUN``.

Clauses a server cannot be checked against black-box (client obligations, documentation,
deployment limits) carry the reason in ``not_checkable`` and are reported as N/A, so the report
still names them without a skipped test in every run. Some of them can still be checked when
the suite runs our own bridge (it chose the limits; the client duties are checked against the
shipped client, ``bridge.client``): their tests skip for a foreign server, and the clause is then
N/A; against our bridge they run like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

__all__ = ["CLAUSES", "Clause", "clause"]


@dataclass(frozen=True)
class Clause:
    key: str
    text: str  # "<LEVEL>: <the clause, quoted or closely paraphrased>"
    section: str
    #: Why no black-box test of a server can check it (client duties, documentation, deployment
    #: limits); such a clause is N/A when it has no test, or when all its tests were skipped
    #: (those that run only against our own bridge).
    not_checkable: str = ""

    @property
    def level(self) -> str:
        return self.text.split(":", 1)[0]


_LIST = [
    # --- Specification (support) ---------------------------------------------------------
    Clause(
        "method-supported",
        "NORMATIVE: Clients that call tasks/stream against a receiver that does not support "
        "task event streams receive -32601 (Method not found) — a supporting server does not",
        "Specification",
    ),
    # --- Task Event ------------------------------------------------------------------------
    Clause(
        "immutable",
        "NORMATIVE: A task event is an immutable entry in a task's event stream",
        "Task Event",
    ),
    Clause(
        "related-task-meta",
        "MUST: Task events related to a task MUST include io.modelcontextprotocol/related-task "
        "with the same taskId",
        "Task Event",
    ),
    Clause(
        "event-task-id",
        "NORMATIVE: TaskEvent.taskId is the task this event belongs to (the streamed task)",
        "Task Event",
    ),
    Clause(
        "seq-per-task",
        "NORMATIVE: Sequence numbers are scoped to a single task",
        "Task Event",
    ),
    Clause(
        "seq-first-zero",
        "MUST: The first event in a task stream MUST use seq: 0",
        "Task Event",
    ),
    Clause(
        "seq-plus-one",
        "MUST: Each subsequent event for that task MUST increment by exactly 1",
        "Task Event",
    ),
    Clause(
        "seq-order",
        "MUST: Servers MUST deliver events in sequence order",
        "Task Event",
    ),
    Clause(
        "payload-object",
        "MUST: Event payloads MUST be JSON objects",
        "Task Event",
    ),
    Clause(
        "no-unprefixed-types",
        "MUST NOT: Event type strings that are not prefixed by a vendor- or "
        "implementation-controlled namespace are reserved and MUST NOT be emitted "
        "(e.g. content.partial, task.status, tool.started)",
        "Task Event / Event Types",
    ),
    Clause(
        "vendor-prefix",
        "MUST: Implementation-defined event types MUST use a vendor-specific prefix, "
        "preferably reverse-DNS (e.g. com.example.review.comment)",
        "Task Event / Event Types",
    ),
    # --- tasks/stream ----------------------------------------------------------------------
    Clause(
        "empty-result",
        "NORMATIVE: When the receiver closes the stream normally, it returns an empty result "
        "(TaskStreamResult = EmptyResult)",
        "tasks/stream",
    ),
    Clause(
        "one-active-stream",
        "MUST: A receiver MUST allow at most one active tasks/stream request per task per "
        "connection (on HTTP/1.1 an open stream occupies its TCP connection: a second request "
        "pipelined on it is read only once the first response ended, so the rule holds by "
        "construction; checked by pipelining two requests on one connection)",
        "tasks/stream",
    ),
    Clause(
        "second-stream-32602",
        "MUST: If a client sends a second tasks/stream for a task that already has an active "
        "stream on the same connection, the receiver MUST return -32602 (Invalid params) (on "
        "HTTP/1.1 the second request of a connection is answered after the first response "
        "ended, or with -32602; never as a second stream interleaved with the first)",
        "tasks/stream",
    ),
    Clause(
        "per-connection",
        "DERIVED: The one-stream rule is per connection, not per client or credentials: streams "
        "of the same task on other connections (another client, a late joiner, a dashboard, a "
        "second tab, with the same credentials) are admitted and each gets every event in order",
        "tasks/stream",
    ),
    Clause(
        "cancel-then-reopen",
        "SHOULD: Clients that want to change the cursor SHOULD cancel the active stream first, "
        "then open a new one (server side: the new stream is accepted once the old one is "
        "cancelled)",
        "tasks/stream",
    ),
    Clause(
        "cancel-notification",
        "NORMATIVE: Clients cancel an active stream with the normal MCP cancellation mechanism "
        "for the tasks/stream request (notifications/cancelled naming its request id): the "
        "stream's delivery stops and its response ends without a result",
        "tasks/stream",
    ),
    Clause(
        "cancel-keeps-task",
        "MUST: Cancellation stops event delivery but does not cancel the underlying task",
        "tasks/stream",
    ),
    # --- notifications/tasks/event -----------------------------------------------------------
    Clause(
        "meta-on-notifications",
        "MUST: Receivers MUST include io.modelcontextprotocol/related-task metadata on task "
        "event notifications",
        "notifications/tasks/event",
    ),
    Clause(
        "meta-matches-task-id",
        "MUST: The metadata task ID MUST match params.taskId",
        "notifications/tasks/event",
    ),
    Clause(
        "events-on-stream",
        "MUST: Task event notifications that are intended to be resumable MUST be sent in "
        "response to an active tasks/stream request",
        "notifications/tasks/event",
    ),
    Clause(
        "client-no-unsolicited",
        "MUST NOT: Clients MUST NOT rely on unsolicited notifications for replay or resume "
        "semantics",
        "notifications/tasks/event",
        not_checkable="client requirement: not checkable against a server",
    ),
    # --- Resume and Replay Semantics ---------------------------------------------------------
    Clause(
        "after-client-valid",
        "MUST: The after parameter MUST be a non-negative integer (client obligation)",
        "Resume and Replay",
        not_checkable="client requirement: checked against the shipped client (bridge.client) "
        "when the suite runs our bridge",
    ),
    Clause(
        "after-invalid-32602",
        "MUST: Receivers MUST return -32602 (Invalid params) if after is negative, not an "
        "integer, or otherwise not a valid sequence number value",
        "Resume and Replay",
    ),
    Clause(
        "cursor-ahead",
        "DERIVED: An after at or beyond the task's next seq names no event the task had: the "
        "receiver answers -32602 (not a valid sequence number value) or streams from there and "
        "ends at the task's terminal status; it never hangs. after = the last event is valid "
        "and the stream ends with the result once the task finishes",
        "Resume and Replay",
    ),
    Clause(
        "after-replay-then-live",
        "MUST: With a valid after, deliver retained events with seq greater than the supplied "
        "value, then continue with live events (or return events_gone)",
        "Resume and Replay",
    ),
    Clause(
        "after-terminal-immediate",
        "MUST: If no retained events have seq greater than after and the task has reached a "
        "terminal state, the receiver MUST return TaskStreamResult immediately with no event "
        "notifications",
        "Resume and Replay",
    ),
    Clause(
        "after-gone",
        "MUST: With a valid after, return an events_gone error if events after the supplied "
        "sequence number are no longer retained",
        "Resume and Replay",
    ),
    Clause(
        "omit-earliest-then-live",
        "MUST: If after is omitted, the receiver MUST start at the earliest event it still "
        "retains for the task, then continue with live events",
        "Resume and Replay",
    ),
    Clause(
        "omit-none-retained-live",
        "NORMATIVE: If no events are retained and the task still exists, the receiver starts "
        "with future live events",
        "Resume and Replay",
    ),
    Clause(
        "omit-none-retained-terminal",
        "MUST: If no events are retained and the task has reached a terminal state, the "
        "receiver MUST return TaskStreamResult immediately",
        "Resume and Replay",
    ),
    Clause(
        "terminal-stream-ends",
        "DERIVED: A stream of a terminal task ends with TaskStreamResult once its retained "
        "events are delivered (it then has nothing after its position)",
        "Resume and Replay",
    ),
    Clause(
        "no-silent-skip",
        "MUST NOT: Receivers MUST NOT silently skip retained events after the requested "
        "cursor; if the receiver cannot provide a gap-free stream after the cursor, it MUST "
        "return events_gone",
        "Resume and Replay",
    ),
    Clause(
        "client-persist",
        "SHOULD: Clients SHOULD persist the latest sequence number only after fully processing "
        "that event, and pass it as after on reconnect",
        "Resume and Replay",
        not_checkable="client requirement: checked against the shipped client (bridge.client) "
        "when the suite runs our bridge",
    ),
    Clause(
        "client-duplicates",
        "MUST: Clients MUST tolerate duplicate delivery after reconnect and SHOULD de-duplicate "
        "events by (taskId, seq)",
        "Resume and Replay",
        not_checkable="client requirement: checked against the shipped client (bridge.client) "
        "when the suite runs our bridge",
    ),
    Clause(
        "records-keep-seq",
        "DERIVED: Every event keeps its seq whatever its producer wrote (content the receiver "
        "cannot write back as JSON, bytes that are no event): seq 0..n-1 are all delivered, the "
        "stream still ends with its result, and tasks/get still answers (from seq-plus-one and "
        "no-silent-skip)",
        "Resume and Replay",
    ),
    # --- events_gone -----------------------------------------------------------------------
    Clause(
        "gone-shape",
        "NORMATIVE: events_gone is a JSON-RPC error with code -32010, a message, and data "
        "{reason: 'events_gone', taskId, earliestSeq}",
        "events_gone error",
    ),
    Clause(
        "gone-earliest",
        "NORMATIVE: earliestSeq is the oldest event the receiver still retains; after = "
        "earliestSeq - 1 resumes from the earliest retained event",
        "events_gone error",
    ),
    Clause(
        "gone-transport",
        "NORMATIVE: An implementation MAY map events_gone to HTTP 410 at the Streamable HTTP "
        "transport layer (stream resume), but the data-layer error reason remains events_gone",
        "events_gone error",
    ),
    # --- Event Retention -------------------------------------------------------------------
    Clause(
        "retain-while-retrievable",
        "SHOULD: Receivers SHOULD retain task events for at least as long as the task remains "
        "retrievable",
        "Event Retention",
    ),
    Clause(
        "document-retention",
        "SHOULD: Receivers SHOULD document maximum event age, maximum events per task, "
        "terminal retention and payload size limits",
        "Event Retention",
        not_checkable="documentation requirement: not checkable over the wire",
    ),
    Clause(
        "dropped-gone",
        "MUST: Once a receiver drops an event needed to resume a stream, it MUST return "
        "events_gone for clients that resume from before the retained range",
        "Event Retention",
    ),
    # --- Relationships ---------------------------------------------------------------------
    Clause(
        "status-consistent",
        "SHOULD: A receiver that emits both notifications/tasks/status and "
        "notifications/tasks/event SHOULD keep status event entries consistent with tasks/get",
        "Relationship to Task Status Notifications",
        not_checkable="event types are vendor-defined: a status event cannot be recognised black-box",
    ),
    Clause(
        "pause-resume-events",
        "SHOULD: If SEP-2669 is accepted, receivers SHOULD emit task events for externally "
        "visible pause and resume transitions",
        "Relationship to Task Status Notifications",
        not_checkable="SEP-2669 (tasks/pause, tasks/resume) is not part of the protocol under test",
    ),
    Clause(
        "progress-not-events",
        "MUST NOT: Progress notifications (progressToken on tasks/stream) MUST NOT be treated "
        "as task event records and do not affect task event seq values",
        "Relationship to Progress Notifications",
    ),
    Clause(
        "progress-consistent",
        "SHOULD: A receiver that emits both progress notifications and task event streams "
        "SHOULD keep them consistent",
        "Relationship to Progress Notifications",
        not_checkable="payload semantics are vendor-defined: consistency is not checkable black-box",
    ),
    # --- Security --------------------------------------------------------------------------
    Clause(
        "authz-as-tasks-get",
        "MUST: Implementations MUST apply the same authorization checks to tasks/stream that "
        "they apply to tasks/get",
        "Security Implications",
    ),
    Clause(
        "authz-bind-context",
        "SHOULD: Receivers SHOULD bind task event streams to the same session, tenant, and "
        "authentication context as the task",
        "Security Implications",
    ),
    Clause(
        "authz-no-stream",
        "MUST NOT: A client that cannot access a task MUST NOT be allowed to stream its events",
        "Security Implications",
    ),
    Clause(
        "unknown-task",
        "DERIVED: tasks/stream for a task that does not exist is an error, as tasks/get is",
        "Security Implications",
    ),
    Clause(
        "payload-untrusted",
        "SHOULD: Receivers SHOULD treat event payloads as untrusted data",
        "Security Implications",
        not_checkable="an implementation property: not observable over the wire",
    ),
    Clause(
        "client-no-exec",
        "MUST NOT: Clients MUST NOT execute event payloads as code; clients that render them "
        "SHOULD sanitize them",
        "Security Implications",
        not_checkable="client requirement: not checkable against a server",
    ),
    Clause(
        "limits",
        "SHOULD: Receivers SHOULD enforce limits on concurrent streams per client, payload "
        "size, retention duration, events per task and resume attempts",
        "Security Implications",
        not_checkable="limits are deployment-specific: checked only against our bridge, whose "
        "limits the suite sets when it starts it",
    ),
    Clause(
        "sensitive-retention",
        "SHOULD: Receivers SHOULD avoid retaining sensitive event payloads longer than "
        "necessary; clients SHOULD request deletion of tasks and their history",
        "Security Implications",
        not_checkable="a retention policy and a client duty: not checkable over the wire",
    ),
]

CLAUSES: dict[str, Clause] = {c.key: c for c in _LIST}
assert len(CLAUSES) == len(_LIST), "duplicate clause keys"


def clause(key: str) -> pytest.MarkDecorator:
    """``@clause("seq-first-zero")``: the test checks that clause (the marker carries its text)."""
    found = CLAUSES[key]  # KeyError at import for a typo
    return pytest.mark.clause(found.text, key=found.key)
