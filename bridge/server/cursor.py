"""The SSE ``id`` of a task event: an opaque cursor naming the request, the task and the seq.

Clients treat it as opaque; the bridge reads it back only from ``Last-Event-ID`` on a ``GET``
resume. It holds no server state (any replica can resume it) and is not a credential
(authorization is checked again on every use). The part before the seq is the same for every
event of one stream, so a stream encodes it once (:func:`cursor_prefix`).
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["cursor_prefix", "decode_cursor", "encode_cursor"]

_VERSION = "v1."


def cursor_prefix(request_id: str | int, task_id: str) -> str:
    """The part of a stream's cursors that names the request and the task (one per stream)."""
    raw = f"{type(request_id).__name__[0]}{request_id}\x00{task_id}".encode()
    return _VERSION + base64.urlsafe_b64encode(raw).decode().rstrip("=") + "."


def encode_cursor(request_id: str | int, task_id: str, seq: int) -> str:
    """The SSE ``id`` of an event: opaque to clients, it names the request, task and seq."""
    return f"{cursor_prefix(request_id, task_id)}{seq}"


def decode_cursor(cursor: str) -> tuple[str | int, str, int]:
    """``(request id, task id, seq)``; ValueError for anything that is not our cursor."""
    if not cursor.startswith(_VERSION):
        raise ValueError("not a stream cursor")
    body, _, seq_text = cursor[len(_VERSION) :].rpartition(".")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        rid, task_id = raw.split("\x00")
        if not seq_text.isdigit():
            raise ValueError(seq_text)
        seq = int(seq_text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a stream cursor") from None
    if not task_id or not rid or rid[0] not in "is":
        raise ValueError("not a stream cursor")
    request_id: str | int = int(rid[1:]) if rid[0] == "i" else rid[1:]
    return request_id, task_id, seq
