"""servekit's quick routes: requests a listener answers inside its protocol, without an ASGI cycle, on a
real uvicorn server on loopback under uvloop (as the tracker answers announces). What must hold: a
quick answer is the same HTTP as any other (keep-alive, HTTP/1.0, HEAD, order behind a pipelined
request in flight), anything unusual goes to the app, and the listener's timeouts still apply. A plain
request is answered before the parser reads it; a request that says it has a body, however it spells it,
never is (its body would be read as the next request), and an odd one still goes through the parser."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servekit.limits import ConnectionLimits
from servekit.protocol import QuickRoutes
from tests.support.listeners import listener

HEADER_TIMEOUT = 1.0


class Recorder:
    def __init__(self) -> None:
        self.app_paths: list[str] = []
        self.quick: list[tuple[bytes, bytes, bytes, str | None]] = []

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.app_paths.append(scope["path"])
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        answer = b"app:" + scope["path"].encode() + b":" + body
        head = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": answer})

    def answer(
        self, method: bytes, path: bytes, query: bytes, client: str | None
    ) -> tuple[int, bytes, bytes]:
        self.quick.append((method, path, query, client))
        return 200, b"content-type: text/plain\r\n", b"quick:" + path + b"?" + query


@pytest.fixture
def server() -> Iterator[tuple[int, Recorder]]:
    rec = Recorder()
    quick = QuickRoutes(claims=lambda path: path.startswith(b"/q"), answer=rec.answer)
    with listener(
        rec.app, ConnectionLimits(header_timeout=HEADER_TIMEOUT, keepalive_timeout=30), quick=quick
    ) as port:
        yield port, rec


def read_response(sock: socket.socket, buf: bytearray) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response off `sock` (extra bytes stay in `buf`): (status line, headers, body)."""
    deadline = time.monotonic() + 10
    while (end := buf.find(b"\r\n\r\n")) < 0:
        assert time.monotonic() < deadline, "no response head"
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {bytes(buf)!r}"
        buf += chunk
    status, *lines = bytes(buf[:end]).split(b"\r\n")
    del buf[: end + 4]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
    length = int(headers[b"content-length"])
    while len(buf) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return status, headers, body


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_quick_routes_are_answered_by_the_protocol_and_the_rest_by_the_app(server):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray()
        for path in (b"/q/a?x=1", b"/other", b"/q/b"):
            sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, body = read_response(sock, buf)
            assert status == b"HTTP/1.1 200 OK"
            assert int(headers[b"content-length"]) == len(body)
        assert body == b"quick:/q/b?"
    assert rec.app_paths == ["/other"]  # one keep-alive connection, the app only for its route
    assert [(m, p, q) for m, p, q, _ in rec.quick] == [(b"GET", b"/q/a", b"x=1"), (b"GET", b"/q/b", b"")]
    assert rec.quick[0][3] == "127.0.0.1"


def test_pipelined_requests_are_answered_in_order_behind_one_in_flight(server):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"".join(b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % p for p in (b"/slow", b"/q/1", b"/q/2"))
        )
        buf = bytearray()
        bodies = [read_response(sock, buf)[2] for _ in range(3)]
        # Queued behind /slow, they go through the app, in order; once it is done the next is quick.
        assert bodies == [b"app:/slow:", b"app:/q/1:", b"app:/q/2:"]
        sock.sendall(b"GET /q/3 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(sock, buf)[2] == b"quick:/q/3?"


def test_a_request_with_a_body_goes_to_the_app(server):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /q/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        assert read_response(sock, bytearray())[2] == b"app:/q/x:hello"
    assert rec.quick == []


def test_http_1_0_is_closed_after_its_answer_and_head_has_no_body(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"HEAD /q/h HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5)
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
        assert b"content-length: 11\r\n" in head  # the GET's length, no body follows
        sock.sendall(b"GET /q/h HTTP/1.0\r\n\r\n")
        status, headers, body = read_response(sock, bytearray())
        assert body == b"quick:/q/h?" and headers[b"connection"] == b"close"
        assert closed_within(sock, 5)


def test_the_header_timeout_still_applies_after_a_quick_answer(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /q/t HTTP/1.1\r\nHost: t\r\n\r\n")
        read_response(sock, bytearray())
        sock.sendall(b"GET /q/t HTTP/1.1\r\n")  # the next request's headers never end
        started = time.monotonic()
        assert closed_within(sock, HEADER_TIMEOUT + 5)
        assert time.monotonic() - started < HEADER_TIMEOUT + 2


def test_a_client_that_pipelines_thousands_and_reads_late_gets_every_answer_in_order(server):
    # An attacker's shape: requests sent as fast as the socket takes them, no answer read. Quick answers
    # stop once the transport's buffer is over its mark (the rest queue through the app, which stops
    # reading), so the server holds a bounded amount and every answer still comes, in order.
    port, rec = server
    # Enough answers (~120 bytes each) to fill the kernel's largest send buffer twice over.
    send_buffer_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    count = 2 * send_buffer_max // 100
    requests = b"".join(b"GET /q/%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(count))
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answers back up at once
        sock.connect(("127.0.0.1", port))
        sock.settimeout(30)
        sender = threading.Thread(target=sock.sendall, args=(requests,), daemon=True)
        sender.start()
        time.sleep(1.0)  # the server meets a full socket before anything is read
        buf = bytearray()
        bodies = [read_response(sock, buf)[2] for _ in range(count)]
        sender.join(10)
    assert [body.split(b"/q/")[1].rstrip(b"?:") for body in bodies] == [b"%d" % i for i in range(count)]
    assert rec.quick and rec.app_paths  # the buffer's mark was met: the rest went the app's way


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /q/b HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /q/b HTTP/1.1\r\nHost: t\r\ncOnTeNt-LeNgTh: 5\r\n\r\nhello",
        b"GET /q/b HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET /q/b HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
    ],
)
def test_a_request_that_says_it_has_a_body_goes_to_the_app_however_it_spells_it(server, request_bytes):
    # A quick answer that skipped a body would leave its bytes to be read as the next request: a
    # smuggled request behind a proxy that read the body as the body.
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_bytes)
        body = read_response(sock, bytearray())[2]
    assert body.startswith(b"app:/q/b:") and rec.quick == []


def test_a_connection_close_request_is_answered_quick_and_closed(server):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /q/c?x=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(sock, bytearray())
        assert body == b"quick:/q/c?x=1" and headers[b"connection"] == b"close"
        assert closed_within(sock, 5)
    assert rec.app_paths == []


@pytest.mark.parametrize(
    "odd",
    [
        b"GET /q/o HTTP/1.1\r\nHost: t\r\nX-Odd: caf\xc3\xa9\r\n\r\n",  # a header value that is not ASCII
        b"GET /q/o?a=%41 HTTP/1.1\r\nHost: t\r\nX-Many: a\r\nX-Many: b\r\nX-Long: "
        + b"y" * 4000
        + b"\r\n\r\n",
    ],
)
def test_a_request_the_plain_reader_does_not_take_is_still_answered_through_the_parser(server, odd):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(odd)
        assert read_response(sock, bytearray())[2].startswith(b"quick:/q/o?")
    assert rec.app_paths == []


def test_requests_in_pieces_or_two_in_one_read_are_answered_in_order(server):
    port, rec = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray()
        sock.sendall(b"GET /q/1 HTTP/1.1\r\nHo")
        time.sleep(0.2)  # the server reads half a request first
        sock.sendall(b"st: t\r\n\r\n")
        assert read_response(sock, buf)[2] == b"quick:/q/1?"
        sock.sendall(b"GET /q/2 HTTP/1.1\r\nHost: t\r\n\r\nGET /q/3 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert [read_response(sock, buf)[2] for _ in range(2)] == [b"quick:/q/2?", b"quick:/q/3?"]


@pytest.fixture
def short_keepalive() -> Iterator[int]:
    rec = Recorder()
    quick = QuickRoutes(claims=lambda path: path.startswith(b"/q"), answer=rec.answer)
    with listener(rec.app, ConnectionLimits(header_timeout=4.0, keepalive_timeout=1.0), quick=quick) as port:
        yield port


def test_after_a_quick_answer_an_idle_connection_goes_at_the_keep_alive_timeout(short_keepalive):
    # Both timeouts are deadlines on one timer that each request moves on without cancelling it: the
    # timer fires on the old deadline, is set again, and closes at the new one, not before.
    with socket.create_connection(("127.0.0.1", short_keepalive)) as sock:
        buf = bytearray()
        for _ in range(3):
            sock.sendall(b"GET /q/k HTTP/1.1\r\nHost: t\r\n\r\n")
            read_response(sock, buf)
            time.sleep(0.7)  # each request within the keep-alive timeout of the one before
        started = time.monotonic()
        assert closed_within(sock, 5)
        assert 0.1 < time.monotonic() - started < 1.5  # 1.0 s after the last answer, 0.7 s of it slept


def test_a_next_request_begun_within_the_keep_alive_has_the_header_timeout_to_end(short_keepalive):
    with socket.create_connection(("127.0.0.1", short_keepalive)) as sock:
        buf = bytearray()
        sock.sendall(b"GET /q/k HTTP/1.1\r\nHost: t\r\n\r\n")
        read_response(sock, buf)
        time.sleep(0.5)
        sock.sendall(b"GET /q/k HTTP/1.1\r\n")
        time.sleep(1.5)  # past the keep-alive, within the header timeout
        sock.sendall(b"Host: t\r\n\r\n")
        assert read_response(sock, buf)[2] == b"quick:/q/k?"
        sock.sendall(b"GET /q/k HTTP/1.1\r\n")  # and this one never ends: the header timeout closes it
        started = time.monotonic()
        assert closed_within(sock, 8)
        assert 3.0 < time.monotonic() - started < 5.5


def test_a_quick_answer_carries_the_date_of_its_second(server):
    # The head of a quick answer is made once per second of uvicorn's date header, not kept longer.
    port, rec = server
    dates = []
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /q/d HTTP/1.1\r\nHost: t\r\n\r\n")
            dates.append(read_response(sock, bytearray())[1][b"date"])
        time.sleep(1.6)
    assert len(rec.quick) == 2 and dates[0] != dates[1]
