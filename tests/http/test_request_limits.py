"""What one request may make a listener hold (servekit.limits): its head's bytes, header lines and target
(431 / 414, then close, counted as the bytes arrive), and its announced body's time and rate (408, then
close). uvicorn's h11 protocol caps an incomplete request at 16 KiB (`h11_max_incomplete_event_size`);
nginx answers a head over `large_client_header_buffers` with 400/414 and a slow body with 408
(`client_body_timeout`). The whole processes under these attacks: tests/daemon/test_request_floods.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from servekit.limits import ConnectionLimits
from tests.support.listeners import listener

LIMITS = ConnectionLimits(
    header_timeout=30, max_head_bytes=4096, max_headers=20, max_url_bytes=1024, body_timeout=1.0,
    min_body_rate=1000,
)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    head = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def port() -> Iterator[int]:
    with listener(app, LIMITS) as port:
        yield port


def _answer(s: socket.socket, timeout: float = 5) -> bytes:
    """What the server sent until it closed `s` (bounded by `timeout`)."""
    s.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        got += chunk
    return got


def _send_all(s: socket.socket, data: bytes, piece: int) -> None:
    """`data` in pieces of `piece` bytes, as far as the server takes them (it may close meanwhile)."""
    for at in range(0, len(data), piece):
        try:
            s.sendall(data[at : at + piece])
        except (BrokenPipeError, ConnectionResetError):
            return


@pytest.mark.parametrize("piece", [1, 512, 1 << 20])
def test_a_head_past_its_bytes_is_answered_431_and_closed(port: int, piece: int):
    # One header line that never ends, sent at once or a byte at a time.
    with socket.create_connection(("127.0.0.1", port)) as s:
        _send_all(s, b"GET / HTTP/1.1\r\nHost: t\r\nX-Grow: " + b"a" * 8192, piece)
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert b"connection: close" in answer


def test_more_header_lines_than_allowed_are_answered_431(port: int):
    head = b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(25)) + b"\r\n"
    assert len(head) < LIMITS.max_head_bytes  # the count refuses it, not the bytes
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head)
        assert _answer(s).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("piece", [1, 4096])
def test_a_request_target_past_its_bytes_is_answered_414(port: int, piece: int):
    with socket.create_connection(("127.0.0.1", port)) as s:
        _send_all(s, b"GET /" + b"a" * 2000, piece)
        assert _answer(s).startswith(b"HTTP/1.1 414 ")


def test_a_head_within_the_limits_is_served_and_the_next_request_counts_afresh(port: int):
    head = b"GET /" + b"a" * 1000 + b" HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * 2500 + b"\r\n\r\n"
    assert len(head) < LIMITS.max_head_bytes
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(5)
        for _ in range(3):  # kept alive: three heads of 3.5 KiB each on one connection
            s.sendall(head)
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        # A head with a body in the same read: the body's bytes are not the head's.
        s.sendall(b"PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 20000\r\n\r\n" + b"b" * 20000)
        assert s.recv(4096).endswith(b"\r\n\r\n20000")


def test_a_body_announced_and_never_sent_is_answered_408_at_its_deadline(port: int):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        answer = _answer(s, timeout=LIMITS.body_timeout + 5)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert LIMITS.body_timeout - 0.2 <= took <= LIMITS.body_timeout + 2, took


def test_a_body_dribbled_below_the_rate_is_closed_and_one_at_the_rate_is_served(port: int):
    # 100 bytes every 0.5 s (200 B/s) against 1,000 B/s after 1 s of grace: late by about 1.3 s.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        started = time.monotonic()
        answer = _dribble_until_answered(s, 100, 0.5, limit=20)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert LIMITS.body_timeout <= took <= 5, took
    # 3,000 bytes in 1 s (above the rate) is served.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 3000\r\n\r\n")
        for _ in range(10):
            s.sendall(b"b" * 300)
            time.sleep(0.1)
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200 ")


def _dribble_until_answered(s: socket.socket, piece: int, every: float, limit: int) -> bytes:
    """Send `piece` bytes every `every` seconds until the server answers or closes `s` (at most `limit`
    pieces); what it sent."""
    s.settimeout(every)
    for _ in range(limit):
        try:
            s.sendall(b"b" * piece)
            return s.recv(4096)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return b""
    raise AssertionError(f"still open after {limit} pieces")
