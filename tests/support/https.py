"""A threaded HTTP(S) server on 127.0.0.1 for tests that need a real listener (webhook
receivers): ``serving(handler, ca)`` starts it with a certificate from ``ca`` for ``names``,
yields its port, and shuts it down however the test ends."""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trustme

__all__ = ["serving"]


@contextlib.contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler],
    ca: trustme.CA | None,
    names: tuple[str, ...] = ("localhost",),
    port: int = 0,
) -> Iterator[int]:
    """Serve ``handler`` over TLS (a certificate of ``ca`` for ``names``), or plain HTTP when
    ``ca`` is None, on ``port`` (0: any free one); yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    if ca is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(*names).configure_cert(context)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    # A short poll: shutdown() waits for the loop's next look at its flag (0.5 s by default,
    # which every test using a receiver paid at its teardown).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
