"""Stream clients over HTTP: ``tasks/stream`` through a replica's own MCP endpoint.

Some of a run's clients do not call the stream hub directly: they POST ``tasks/stream`` to the
replica's :class:`~bridge.server.http.McpHttp` (bearer authentication, the per-connection and
per-principal limits, the cursor check, the SSE framing of the bridge's rendered
notifications, the error mapping) through :class:`~simulation.transport.StreamingASGITransport`,
which streams the body as the app sends it: a slow client slows the server as a full TCP
window would. Each client has its own client address (one stream per connection is a rule the
endpoint enforces), and :class:`Hosts` routes a request to the replica its URL names.

The client reads the SSE body with a small line parser (``data:`` lines up to a blank line;
comments, ``id:`` and ``event:`` lines are skipped), records every
``notifications/tasks/event`` as the in-process clients do, and reads the final JSON-RPC
message: a result ends the stream, an error is a refusal (:meth:`World.refused`), and a body
that ends with neither is a stream cut short (moved, drained, crashed): the client resumes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import httpx

from bridge.metrics import Metrics
from bridge.server.auth import Authenticator
from bridge.server.handlers import MethodHandlers
from bridge.server.http import McpHttp, RawEndpoint
from bridge.server.routing import Routing
from bridge.server.wire import RpcError
from simulation.transport import App, Message, StreamingASGITransport

if TYPE_CHECKING:
    from simulation.world import Replica, TaskPlan, World

__all__ = ["TOKENS", "Hosts", "endpoint", "stream_http", "token_of"]

#: The bearer tokens of the run's principals (``token-user0`` is ``user0``).
TOKENS = {f"token-user{i}": f"user{i}" for i in range(3)}
VERSION = "2026-07-28"
EVENT_METHOD = "notifications/tasks/event"
_META = {
    "io.modelcontextprotocol/protocolVersion": VERSION,
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
}


def token_of(principal: str) -> str:
    return next(token for token, who in TOKENS.items() if who == principal)


def endpoint(replica: Replica) -> App:
    """The replica's ``POST /mcp``, built from its own parts (no peers: clients go to owners)."""
    s = replica.settings
    handlers = MethodHandlers(s, replica.service, [], replica.hub, [])
    mcp = McpHttp(
        s,
        Authenticator(s.auth),
        handlers,
        Metrics(),
        on_cancelled=replica.hub.cancel,
        routing=Routing(s, replica.indexer),
    )
    return RawEndpoint(mcp.post)


class Hosts:
    """An ASGI app that hands a request to the replica its host names (``r1.sim``)."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        name = str(scope["server"][0]).split(".", 1)[0]
        replica = self.world.replicas.get(name)
        if replica is None or not replica.up:
            raise ConnectionRefusedError(f"{name} is down")
        await replica.app(scope, receive, send)


def client_of(world: World, client_id: str) -> httpx.AsyncClient:
    """The client's own connection (its own address: one stream per connection)."""
    number = int(client_id[1:])
    transport = StreamingASGITransport(Hosts(world), client=(f"10.0.0.{number + 1}", 40000))
    return httpx.AsyncClient(transport=transport, timeout=None)


async def stream_http(
    world: World, replica: Replica, client_id: str, task: TaskPlan, after: int | None, slow: bool
) -> tuple[bool, int | None]:
    """One ``tasks/stream`` over HTTP: (whether it ended with the result, the cursor after)."""
    params: dict[str, Any] = {"taskId": task.task_id, "_meta": _META}
    if after is not None:
        params["after"] = after
    body = {
        "jsonrpc": "2.0",
        "id": next(world.request_ids),
        "method": "tasks/stream",
        "params": params,
    }
    headers = {
        "Authorization": f"Bearer {token_of(task.principal)}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tasks/stream",
        "Mcp-Name": task.task_id,
    }
    url = f"http://{replica.name}.sim:8081/mcp"
    async with (
        client_of(world, client_id) as http,
        http.stream("POST", url, json=body, headers=headers) as reply,
    ):
        if "text/event-stream" not in reply.headers.get("content-type", ""):
            return _final(world, client_id, task, after, json.loads(await reply.aread()))
        async for message in _messages(reply.aiter_lines()):
            if message.get("method") == EVENT_METHOD:
                event = message["params"]
                seq = int(event["seq"])
                if after is None and seq > 0:
                    # Without a cursor a stream starts at the earliest retained seq: as if it
                    # were told the rest is gone (the checker counts retained ones skipped).
                    world.recording.gone(client_id, task.task_id, -1, seq)
                world.recording.record(
                    client_id,
                    task.task_id,
                    seq,
                    event["type"],
                    event["payload"],
                    replica=replica.name,
                )
                after = seq
                if slow or client_id in world.stalled:
                    await world.sleep(0.2, 3.0 if client_id in world.stalled else 0.8)
            elif "result" in message or "error" in message:
                return _final(world, client_id, task, after, message)
    return False, after  # cut short: moved, drained, or its replica went


def _final(
    world: World, client_id: str, task: TaskPlan, after: int | None, message: dict[str, Any]
) -> tuple[bool, int | None]:
    if "result" in message:
        return True, after
    error = message.get("error")
    if not isinstance(error, dict):  # not a JSON-RPC answer: the request itself was refused
        raise RuntimeError(f"{client_id}: tasks/stream answered {message!r}")
    exc = RpcError(int(error.get("code", 0)), str(error.get("message", "")), error.get("data"))
    return False, world.refused(client_id, task, after, exc)


async def _messages(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON messages of an SSE body, one per event (its ``data:`` lines joined)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        # comments (": keep-alive"), id: and event: lines carry nothing the client needs
    if data:
        yield json.loads("\n".join(data))
