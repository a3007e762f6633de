"""Small helpers for speaking the 2026-07-28 wire to a bridge over real HTTP in tests."""

from __future__ import annotations

import json
from typing import Any

import httpx

VERSION = "2026-07-28"
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
NAME_PARAM = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}
_ids = iter(range(1, 10**9))


def request(
    method: str,
    params: dict[str, Any] | None = None,
    *,
    caps: dict[str, Any] | None = None,
    request_id: int | None = None,
    **meta: Any,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of one request, with the routing headers filled from the params."""
    params = dict(params or {})
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": TASKS if caps is None else caps,
        **meta,
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    name = NAME_PARAM.get(method)
    if name and isinstance(params.get(name), str):
        headers["Mcp-Name"] = params[name]
    body = {"jsonrpc": "2.0", "id": request_id or next(_ids), "method": method, "params": params}
    return headers, body


async def call(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    """One request; returns the JSON-RPC response message (the last one of an SSE body)."""
    headers, body = request(method, params, **kw)
    reply = await http.post(url, json=body, headers=headers)
    if "text/event-stream" in reply.headers.get("content-type", ""):
        return sse_messages(reply.text)[-1]
    return dict(reply.json())


async def result(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    message = await call(http, url, method, params, **kw)
    assert "result" in message, message
    return dict(message["result"])


def sse_messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def create_task(
    http: httpx.AsyncClient, url: str, tool: str, arguments: dict[str, Any]
) -> str:
    created = await result(http, url, "tools/call", {"name": tool, "arguments": arguments})
    assert created["resultType"] == "task", created
    return str(created["taskId"])
