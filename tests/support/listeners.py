"""A servekit listener for tests: an ASGI app under a `Gate` on a free loopback port, in uvicorn on uvloop
in a thread, as the agent and the tracker run theirs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from servekit.limits import ConnectionLimits, Gate
from servekit.protocol import QuickRoutes, uvicorn_options
from servekit.server import QuietServer
from tests.support.procs import free_port, loop_until


@contextlib.contextmanager
def listener(
    app: Any, limits: ConnectionLimits, zerocopy: bool = False, quick: QuickRoutes | None = None
) -> Iterator[int]:
    """Serve `app` until the block ends; yields the port."""
    with serving(app, limits, zerocopy, quick) as (_, _, port):
        yield port


@contextlib.contextmanager
def serving(
    app: Any, limits: ConnectionLimits, zerocopy: bool = False, quick: QuickRoutes | None = None
) -> Iterator[tuple[QuietServer, threading.Thread, int]]:
    """`listener`, yielding the server and its thread too."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        loop="uvloop",
        lifespan="off",
        interface="asgi3",
        **uvicorn_options(Gate(limits, "test"), zerocopy=zerocopy, quick=quick),
    )
    server = QuietServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    loop_until(lambda: server.started, timeout=10, what="uvicorn")
    try:
        yield server, thread, port
    finally:
        server.exit_now()
        thread.join(10)
