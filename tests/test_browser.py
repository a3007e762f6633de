"""The browser view in a real browser: Debian's Chromium, headless, driven by Playwright.

The page is served by a real `bridge serve` on the real broker, through a TCP proxy of the
test's own, so that the test can cut the browser's connections (a dropped network) and hold
new ones while events are written. Checked: live events appear; a dropped connection resumes
with ``Last-Event-ID`` and nothing is lost or repeated; a hostile payload is shown as text and
never runs; the end of the task shows its status and closes the stream.

Chromium comes from ``make system-deps`` (``apt-get install chromium``), never from
``playwright install``. Without it these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from support.layout import fresh_prefix, make_settings
from support.mcp import cancel, long_task
from support.procs import Bridge, running_bridge
from support.unavailable import unavailable
from support.waits import BOUND, wait_until

from bridge.log.publisher import TaskEventPublisher

pytestmark = pytest.mark.kafka

HOSTILE = {
    "img": "<img src=x onerror=\"window.__pwned='img'\">",
    "script": "<script>window.__pwned='script'</script>",
    "svg": "<svg onload=\"window.__pwned='svg'\"></svg>",
}


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("Debian's chromium is not installed (run `make system-deps`)")
    return found


class Proxy:
    """A TCP proxy in front of the bridge that can drop every connection and hold new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepting = asyncio.Event()
        self.accepting.set()
        self.connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        #: The first bytes the browser sent on each connection (its request head).
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop(self) -> None:
        """Cut every open connection, as a network failure does."""
        for pair in list(self.connections):
            for writer in pair:
                writer.transport.abort()
        self.connections.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.accepting.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self.connections.add(pair)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            first = record
            try:
                while data := await src.read(65536):
                    if first:
                        self.requests.append(data.decode("latin-1"))
                        first = False
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        finally:
            self.connections.discard(pair)


@pytest.fixture(scope="module")
def wbridge(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    settings = make_settings(kafka_bootstrap, fresh_prefix("w"))
    env = {"BRIDGE_STREAMS__KEEPALIVE_S": "0.5", "BRIDGE_VIEW__RETRY_MS": "200"}
    with running_bridge(settings, tmp_path_factory.mktemp("wbridge"), **env) as running:
        yield running


@pytest.fixture
async def proxy(wbridge: Bridge) -> AsyncIterator[Proxy]:
    front = Proxy(wbridge.port)
    await front.start()
    try:
        yield front
    finally:
        await front.close()


@pytest.fixture
async def page(proxy: Proxy) -> AsyncIterator[Any]:
    executable = chromium_path()
    from playwright.async_api import async_playwright

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            context = await browser.new_context()
            tab = await context.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.page_errors = errors  # uncaught script errors of the page, checked at the end
            yield tab
        finally:
            await browser.close()


async def view_path(bridge: Bridge, task: str) -> str:
    async with httpx.AsyncClient(timeout=BOUND) as http:
        reply = await http.post(f"http://127.0.0.1:{bridge.port}/view/token", json={"taskId": task})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["viewPath"])


async def rows(page: Any) -> list[tuple[int, str, str]]:
    """The timeline as shown: (seq, type, payload text) per row."""
    found = await page.locator("#events tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.seq, r.querySelector('.type').textContent,"
        " r.querySelector('.payload').textContent])"
    )
    return [(int(seq), type_, payload) for seq, type_, payload in found]


async def shown_seqs(page: Any) -> list[int]:
    return [seq for seq, _, _ in await rows(page)]


async def wait_step(page: Any, i: int) -> list[tuple[int, str, str]]:
    """The rows once the step ``{"i": i}`` is among them."""

    async def shown() -> list[tuple[int, str, str]] | None:
        now = await rows(page)
        return now if any(p == f'{{"i":{i}}}' for _, _, p in now) else None

    return await wait_until(shown, what=f"step {i} is shown")


async def publish(bridge: Bridge, task: str, payloads: list[dict[str, Any]]) -> None:
    async with TaskEventPublisher(bridge.settings) as pub:
        for payload in payloads:
            await pub.publish(task, "com.example.step", payload)


async def test_live_events_appear_and_a_hostile_payload_is_text(wbridge, proxy, page):
    task = await long_task(wbridge.url)
    path = await view_path(wbridge, task)
    await page.goto(f"http://127.0.0.1:{proxy.port}{path}")
    await wait_until(lambda: shown_seqs(page), what="task.created is shown")
    assert "token" not in page.url  # the fragment left the address bar (and the history)
    assert await page.locator("#task-id").text_content() == task
    await publish(wbridge, task, [{"i": 0}, HOSTILE, {"i": 2}])
    shown = await wait_step(page, 2)
    assert [seq for seq, _, _ in shown] == list(range(len(shown)))
    [hostile] = [payload for _, _, payload in shown if "__pwned" in payload]
    for value in HOSTILE.values():
        assert value.replace('"', '\\"') in hostile  # shown as the JSON text it is
    assert await page.locator("#events img, #events script, #events svg").count() == 0
    assert await page.evaluate("window.__pwned") is None
    await cancel(wbridge.url, task)
    await page.wait_for_selector("body[data-state=ended]", timeout=BOUND * 1000)
    assert await page.locator("#status").text_content() == "cancelled"
    assert await page.evaluate("window.__pwned") is None
    assert page.page_errors == []


async def test_a_dropped_connection_resumes_with_nothing_lost(wbridge, proxy, page):
    task = await long_task(wbridge.url)
    path = await view_path(wbridge, task)
    await page.goto(f"http://127.0.0.1:{proxy.port}{path}")
    await publish(wbridge, task, [{"i": i} for i in range(5)])
    await wait_step(page, 4)
    # The network fails: every connection cut, new ones held, while the task goes on.
    proxy.accepting.clear()
    proxy.drop()
    await page.wait_for_selector("body[data-state=reconnecting]", timeout=BOUND * 1000)
    last = (await shown_seqs(page))[-1]  # what the browser saw before the cut
    await publish(wbridge, task, [{"i": i} for i in range(5, 12)])
    opened = len(proxy.requests)
    proxy.accepting.set()
    seqs = [seq for seq, _, _ in await wait_step(page, 11)]
    assert seqs == list(range(len(seqs)))  # contiguous: nothing lost, nothing twice
    resumes = [r for r in proxy.requests[opened:] if "/events?" in r.split("\r\n", 1)[0]]
    assert resumes and f"last-event-id: {last}" in resumes[0].lower()  # resumed, not replayed
    assert await page.evaluate("document.body.dataset.duplicates") is None  # exactly
    await cancel(wbridge.url, task)
    await page.wait_for_selector("body[data-state=ended]", timeout=BOUND * 1000)
    final = await shown_seqs(page)
    assert final == list(range(len(final))) and len(final) > len(seqs)
    assert page.page_errors == []
