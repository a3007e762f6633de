"""The sleeping agent: a client process that starts a long task, goes away, and is woken later.

Run as ``python -m bridgedev.demo.agent start|wake --home DIR`` (the demo's step 6 does, see
:mod:`bridgedev.demo.sleeper`); nothing imports this module. Everything it keeps between runs is in
its home directory (:mod:`bridgedev.demo.agenthome`): its configuration, its tasks/stream cursor,
the task it waits for, and a journal of its runs.

``start``: note where the caller's task updates are now (``events/poll``, cursor null), start
the tool as a task (``tools/call``), subscribe a webhook for that task's updates from that
position (so an update between the two calls is not lost), read the task's first events, and
exit. ``wake`` (started by the receiver when the task has ended): resume ``tasks/stream`` from
the saved cursor to the task's end, read the result with ``tasks/get``, unsubscribe, exit.

It is a plain MCP client: it knows the bridge only through :mod:`bridge.client`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

from bridge.client import StreamEvent, TaskStreamClient
from bridgedev.demo.agenthome import AgentConfig, AgentHome

__all__ = ["main"]

#: How long a webhook subscription is asked for: long enough for any demo task.
SUBSCRIPTION_TTL_MS = 600_000


def _say(text: str) -> None:
    print(text, flush=True)  # the demo relays this process's output line by line


def _client(config: AgentConfig, home: AgentHome) -> TaskStreamClient:
    return TaskStreamClient(config.url, token=config.token, store=home.cursors)


def _subscription(config: AgentConfig, task_id: str) -> dict[str, Any]:
    """The webhook subscription's key: event type, arguments, callback URL."""
    return {"name": config.event, "arguments": {"taskId": task_id}}


async def start(home: AgentHome) -> None:
    config = home.config()
    client = _client(config, home)
    now = await client.call("events/poll", {"name": config.event, "arguments": {}, "cursor": None})
    created = await client.call(
        "tools/call", {"name": config.tool, "arguments": config.arguments}, config.tool
    )
    if created.get("resultType") != "task":
        raise SystemExit(f"{config.tool} did not start a task: {created.get('resultType')}")
    task_id = str(created["taskId"])
    home.remember_task(task_id)
    _say(f"tools/call {config.tool} → task {task_id} ({created.get('status')})")
    delivery = {"mode": "webhook", "url": config.callback, "secret": config.secret}
    sub = await client.call(
        "events/subscribe",
        {
            **_subscription(config, task_id),
            "delivery": delivery,
            "cursor": now["cursor"],  # from before the task existed: no update can slip by
            "ttlMs": SUBSCRIPTION_TTL_MS,
        },
    )
    _say(f"events/subscribe {config.event} {{taskId}} → {sub['id']} (webhook to {config.callback})")
    seqs = await _read_some(client, task_id, config.read_before_sleep)
    cursor = home.cursors.load(task_id)
    _say(f"processed seqs {seqs[0]}..{seqs[-1]}; cursor {cursor} saved; going to sleep (exit)")
    home.journal({"run": "start", "pid": os.getpid(), "taskId": task_id, "seqs": seqs})


async def _read_some(client: TaskStreamClient, task_id: str, count: int) -> list[int]:
    """Process ``count`` events, then leave: the next one arrives but is not processed, so the
    saved cursor is the last processed seq (the client saves a seq when it asks for the next)."""
    seqs: list[int] = []
    stream = cast(AsyncGenerator[StreamEvent, None], client.stream(task_id))
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            if len(seqs) == count:
                break
            _event(event)
            seqs.append(event.seq)
    return seqs


def _event(event: StreamEvent) -> None:
    payload = json.dumps(event.payload, separators=(",", ":"))
    _say(f"  seq {event.seq:>3}  {event.type}  {payload[:60]}")


async def wake(home: AgentHome, task_id: str, seq: int, status: str) -> None:
    config = home.config()
    if task_id != home.task_id():
        raise SystemExit(f"woken for task {task_id}, but waiting for {home.task_id()}")
    client = _client(config, home)
    cursor = home.cursors.load(task_id)
    _say(f"woken: task {task_id} is {status} (seq {seq}); tasks/stream after {cursor}")
    seqs: list[int] = []
    async for event in client.stream(task_id):  # from the saved cursor; ends with the task
        _event(event)
        seqs.append(event.seq)
    view = await client.call("tasks/get", {"taskId": task_id}, task_id)
    text = _result_text(view)
    _say(f"tasks/get → {view.get('status')}: {text}")
    target = {"url": config.callback}
    await client.call("events/unsubscribe", {**_subscription(config, task_id), "delivery": target})
    _say("events/unsubscribe → done; exit")
    home.journal(
        {
            "run": "wake",
            "pid": os.getpid(),
            "taskId": task_id,
            "after": cursor,
            "seqs": seqs,
            "status": view.get("status"),
            "result": text,
        }
    )


def _result_text(view: dict[str, Any]) -> str:
    result = view.get("result") or {}
    texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
    return " ".join(t for t in texts if t) or json.dumps(view.get("error"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridgedev.demo.agent")
    parser.add_argument("run", choices=["start", "wake"])
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--task", help="wake: the task the webhook named")
    parser.add_argument("--seq", type=int, help="wake: the seq of the status event")
    parser.add_argument("--status", help="wake: the task's status")
    args = parser.parse_args(argv)
    home = AgentHome(args.home)
    if args.run == "start":
        asyncio.run(start(home))
    else:
        if args.task is None or args.seq is None or args.status is None:
            parser.error("wake needs --task, --seq and --status")
        asyncio.run(wake(home, args.task, args.seq, args.status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
