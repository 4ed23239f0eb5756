"""The ASGI zero-copy send extension of servekit's protocol (`os.sendfile` from the file to the socket), on
a real uvicorn server on loopback under uvloop, as the agent's network listener runs it."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servekit.limits import ConnectionLimits
from servekit.protocol import ZEROCOPY
from tests.support.listeners import listener

DATA = os.urandom(3 * 2**20 + 12345)
LONG = DATA * 8
"""At /small: longer than a loopback socket's send buffer grows to here, so a reader that waits fills it."""


def app_for(path: Path, seen: list[bool]):
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        offset = int(scope["query_string"].decode() or 0)
        zerocopy = ZEROCOPY in scope.get("extensions", {})
        seen.append(zerocopy)
        body = (LONG if scope["path"] == "/small" else DATA)[offset:]
        head = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        if not zerocopy:
            await send({"type": "http.response.body", "body": body})
            return
        with open(path, "rb") as f:
            # In spans, the last ending the body, as a relay sends a growing file: three long ones (a
            # worker thread sends each), or at /small many short ones (sent from the event loop as far
            # as the socket takes them).
            step = 64 << 10 if scope["path"] == "/small" else len(body) // 3 + 1
            spans = [(offset + at, min(step, len(body) - at)) for at in range(0, len(body), step)]
            for i, (start, count) in enumerate(spans):
                more = i < len(spans) - 1
                await send({"type": ZEROCOPY, "file": f, "offset": start, "count": count, "more_body": more})

    return app


@pytest.fixture(params=[True, False], ids=["zerocopy", "plain"])
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, list[bool]]]:
    """A listener with the extension, and one without (the tracker's: the app sends its bytes itself)."""
    path = tmp_path / "blob"
    path.write_bytes(LONG)  # DATA is its start
    seen: list[bool] = []
    with listener(app_for(path, seen), ConnectionLimits(), zerocopy=request.param) as port:
        yield f"http://127.0.0.1:{port}", seen
    assert seen and set(seen) == {request.param}  # offered where asked for, and only there


@pytest.mark.parametrize("path", ["/", "/small"])
def test_a_file_goes_out_whole_in_spans_and_the_connection_stays_usable(server, path: str):
    url, seen = server
    with httpx.Client(timeout=10) as client:
        for offset in (0, 1, 2**20 + 7):
            resp = client.get(f"{url}{path}?{offset}")
            assert resp.status_code == 200 and resp.content == (LONG if path == "/small" else DATA)[offset:]
    assert len(seen) == 3  # one keep-alive connection served all


def test_short_spans_to_a_slow_reader_wait_for_room_and_lose_nothing(server):
    """A reader slower than the spans come: the socket fills, a span goes out partly from the loop and
    the rest from a worker thread, in order."""
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # before connecting: the window it offers
        s.settimeout(10)
        s.connect((host, int(port)))
        s.sendall(b"GET /small?3 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)  # not reading yet: the server's socket fills
        got = b""
        head, body_len = b"", None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            chunk = s.recv(8192)
            if not chunk:
                break
            got += chunk
            if body_len is None and b"\r\n\r\n" in got:
                head, got = got.split(b"\r\n\r\n", 1)
                body_len = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if body_len is not None and len(got) >= body_len:
                break
    assert head.startswith(b"HTTP/1.1 200") and got == LONG[3:]


def test_a_client_that_goes_away_mid_body_frees_the_server(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(
                b"GET /small?0 HTTP/1.1\r\nHost: x\r\n\r\n"
                if _ % 2
                else b"GET /?0 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            s.recv(1024)
    # The server is not stuck on the abandoned sends: a new client gets the whole file at once.
    started = time.monotonic()
    assert httpx.get(f"{url}/?5", timeout=10).content == DATA[5:]
    assert time.monotonic() - started < 5
