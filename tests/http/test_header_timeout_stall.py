"""The header timeout under a stalled event loop: a client whose request arrived while the loop was
held up (a node's cores busy with other work) is answered, not closed as if it had sent nothing; a
client that really sends nothing is still closed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from servekit.limits import ConnectionLimits
from servekit.protocol import QuickRoutes
from tests.support.listeners import listener

HEADER_TIMEOUT = 0.5
STALL = 1.5


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def stall(method: bytes, path: bytes, query: bytes, client: str | None) -> tuple[int, bytes, bytes]:
    # Holds the event loop inside a socket's callback, as a busy process's loop is held up: the loop
    # then runs its timers before it reads the sockets again.
    time.sleep(STALL)
    return 200, b"", b"ok"


@pytest.fixture
def port() -> Iterator[int]:
    quick = QuickRoutes(lambda path: path == b"/stall", stall)
    with listener(app, ConnectionLimits(header_timeout=HEADER_TIMEOUT), quick=quick) as port:
        yield port


def test_a_request_that_arrived_while_the_loop_was_held_up_is_answered(port: int):
    with (
        socket.create_connection(("127.0.0.1", port)) as waiting,
        socket.create_connection(("127.0.0.1", port)) as staller,
    ):
        time.sleep(0.2)  # both accepted: `waiting`'s header clock runs
        staller.sendall(b"GET /stall HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.5)  # the loop is held up now, past `waiting`'s header timeout
        waiting.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
        waiting.settimeout(10)
        assert waiting.recv(4096).startswith(b"HTTP/1.1 200")
        assert staller.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_client_that_sends_nothing_is_still_closed_at_the_timeout(port: int):
    with socket.create_connection(("127.0.0.1", port)) as idle:
        idle.settimeout(HEADER_TIMEOUT + 5)
        started = time.monotonic()
        assert idle.recv(1) == b""
        assert time.monotonic() - started < HEADER_TIMEOUT + 2
