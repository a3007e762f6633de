"""An answer's head leaves with its body (bridge.server.protocols._BatchedWrites).

uvicorn writes a response's head when the app starts it and its body when the app sends it:
two sends (two TLS records) for every JSON answer, and two wake-ups of its reader; a hop pays
that on the owner and again on the forwarder. The protocols the bridge serves with hold an
answer's head for its body. These drive the real protocol classes over a transport that records
each write, so a count of writes is exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.server import ServerState

from bridge.server import protocols
from bridge.server.protocols import protocol_class

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t"}}'
REQUEST = (
    b"POST /json HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it, each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.written = asyncio.Event()
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.written.set()

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 80)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def answer(request: Request) -> Response:
    await request.body()
    return JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"status": "working"}})


#: Set by a test: the stream's second part waits for it (another turn of the loop).
gate: asyncio.Event


async def stream(request: Request) -> Response:
    async def parts() -> Any:
        yield b"event: a\n\n"
        await gate.wait()
        yield b"event: b\n\n"

    return StreamingResponse(parts(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/json", answer, methods=["POST"]), Route("/sse", stream)])


def connect(http: str) -> tuple[Recording, Any]:
    """One connection of the bridge's protocol for ``http``, over a :class:`Recording`."""
    cls = protocol_class(http, read_timeout_s=30.0, max_head_bytes=65536)  # type: ignore[arg-type]
    config = uvicorn.Config(APP, http=cls, log_level="error", access_log=False, lifespan="off")
    config.load()
    protocol: Any = cls(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Recording()
    protocol.connection_made(transport)
    return transport, protocol


async def serve_one(http: str, request: bytes) -> tuple[Recording, Any]:
    """One connection, ``request`` fed to it (its app's task started, not finished)."""
    transport, protocol = connect(http)
    protocol.data_received(request)
    return transport, protocol


async def finished(protocol: Any) -> None:
    async with asyncio.timeout(10):
        await asyncio.gather(*protocol.tasks)


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_json_answer_leaves_in_one_write(http: str) -> None:
    transport, protocol = await serve_one(http, REQUEST)
    await finished(protocol)
    assert len(transport.writes) == 1, transport.writes
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 200 ")
    assert written.endswith(b'"result":{"status":"working"}}')
    protocol.connection_lost(None)


async def test_a_stream_s_parts_of_different_turns_are_not_held_for_each_other() -> None:
    global gate
    gate = asyncio.Event()
    request = b"GET /sse HTTP/1.1\r\nhost: a\r\n\r\n"
    transport, protocol = await serve_one("httptools", request)
    # The head and the first part go out together, in the turn that wrote them, while the
    # app waits for the gate: nothing waits for a later write.
    async with asyncio.timeout(10):
        await transport.written.wait()
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 ")
    assert b"event: a\n\n" in transport.writes[0]
    gate.set()
    await finished(protocol)
    assert b"event: b\n\n" in transport.writes[1]
    protocol.connection_lost(None)


async def test_only_an_answer_s_head_is_held_and_its_body_joins_it_at_once() -> None:
    recording = Recording()
    batched = protocols._BatchedWrites(recording, asyncio.get_running_loop())
    batched.write(b"not after a request")
    assert recording.writes == [b"not after a request"]  # straight through: nothing held
    batched.hold_next()
    batched.write(b"HEAD\r\n\r\n")
    assert recording.writes == [b"not after a request"]  # the head waits for its body
    assert batched.get_write_buffer_size() == len(b"HEAD\r\n\r\n")
    batched.write(b"body")
    assert recording.writes[1:] == [b"HEAD\r\n\r\nbody"]  # at once, not at the turn's end
    batched.write(b"event")
    assert recording.writes[2:] == [b"event"]  # a stream's next write is not held
    await asyncio.sleep(0)  # the head's flush, cancelled, writes nothing more
    assert len(recording.writes) == 3


async def test_a_large_body_is_not_copied_to_join_its_head() -> None:
    recording = Recording()
    batched = protocols._BatchedWrites(recording, asyncio.get_running_loop())
    batched.hold_next()
    batched.write(b"HEAD")
    large = b"x" * protocols._JOIN_BYTES
    batched.write(large)
    assert recording.writes == [b"HEAD", large]


async def test_close_writes_what_is_held_first_and_abort_drops_it() -> None:
    recording = Recording()
    batched = protocols._BatchedWrites(recording, asyncio.get_running_loop())
    batched.hold_next()
    batched.write(b"last words")
    batched.close()
    assert recording.writes == [b"last words"] and recording.closed
    await asyncio.sleep(0)  # the scheduled flush finds nothing more to write
    assert recording.writes == [b"last words"]

    recording = Recording()
    batched = protocols._BatchedWrites(recording, asyncio.get_running_loop())
    batched.hold_next()
    batched.write(b"never sent")
    batched.abort()
    await asyncio.sleep(0)
    assert recording.writes == [] and recording.aborted


async def test_a_held_head_goes_to_a_transport_that_closes_but_still_sends() -> None:
    """asyncio closes a transport when its peer half-closes (uvicorn keeps no half-open
    connection) and still sends what it was given: what it already buffers, and any write
    before the connection is lost. A head held across that close goes too, so the body
    written after it is never sent without it."""
    recording = Recording()
    batched = protocols._BatchedWrites(recording, asyncio.get_running_loop())
    batched.hold_next()
    batched.write(b"HEAD")  # a stream's head: its first event comes in a later turn
    recording.closed = True  # closing, its buffer still being sent
    await asyncio.sleep(0)  # the turn ends
    batched.write(b"event")
    assert recording.writes == [b"HEAD", b"event"]


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_head_held_when_the_connection_is_lost_is_dropped_with_it(http: str) -> None:
    """A lost connection's transport takes no more writes (uvloop's raises from the flush's
    callback): the held head goes with the connection, and nothing is written after."""
    transport, protocol = connect(http)
    protocol.transport.hold_next()
    protocol.transport.write(b"HEAD")
    transport.closed = True
    protocol.connection_lost(ConnectionResetError())  # uvicorn closes nothing then
    await asyncio.sleep(0)  # the turn ends
    assert transport.writes == []


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_an_answer_after_100_continue_still_leaves_in_one_write(http: str) -> None:
    head = REQUEST[: REQUEST.index(b"\r\n\r\n")] + b"\r\nexpect: 100-continue\r\n\r\n"
    transport, protocol = await serve_one(http, head)
    async with asyncio.timeout(10):
        await transport.written.wait()  # the app reads the body: its client is told to send it
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    protocol.data_received(BODY)
    await finished(protocol)
    assert len(transport.writes) == 2, transport.writes  # the interim answer, then the answer
    assert transport.writes[1].endswith(b'"result":{"status":"working"}}')
    protocol.connection_lost(None)
