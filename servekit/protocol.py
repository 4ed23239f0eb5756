"""uvicorn's HTTP protocol under a listener's `Gate` (servekit.limits: connection caps, header timeout),
with the ASGI zero-copy send extension (`ZEROCOPY`), which uvicorn itself does not offer.

Zero-copy send: an app that finds `ZEROCOPY` in `scope["extensions"]` may send the body as
`{"type": ZEROCOPY, "file": <file object or descriptor>, "offset": N, "count": N, "more_body": bool}`
after its `http.response.start` (with a Content-Length). The bytes go from the file to the socket in
the kernel (`os.sendfile`): no read into Python, no copy into the transport's buffer. A relay seed
sent a blob at about 0.9 CPU-s per GiB through a Python loop of reads and writes.

uvloop's `loop.sendfile` is not implemented, so the protocol does it itself: once the transport's own
buffer is empty (the head, earlier bodies), a worker thread sends on a duplicate of the connection's
descriptor (its own: the loop may close the connection meanwhile), waiting for room with `poll`. The
loop reads the connection meanwhile as usual (a disconnect, a pipelined request) and writes nothing to
it: the response is this cycle's until its last byte.

Quick routes (`QuickRoutes`): requests a listener answers from the protocol itself, synchronously, in
one write, without an ASGI cycle: no task, no scope, no message dicts. For a BitTorrent announce that
machinery cost more CPU than the announce. Only a plain request qualifies (no body expected, nothing
pipelined ahead of it, the transport taking writes); anything else takes the ASGI path as usual.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from servekit.limits import Gate

ZEROCOPY = "http.response.zerocopysend"
SEND_STALL = 60.0
"""Seconds a zero-copy send waits for room in a socket that takes nothing (a client that stopped
reading) before it gives the connection up."""
_FLUSH_POLL = 0.001
LOOP_HELD_UP = 0.25
"""Seconds a header timeout may fire late before it counts as the event loop held up, not the client."""

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 27\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections; retry"
)
"""What a connection over a cap is told before it is closed (no request of it is read)."""


@dataclass(frozen=True)
class QuickRoutes:
    """Requests answered in the protocol (see the module's docstring)."""

    claims: Callable[[bytes], bool]
    """Whether a raw path (still percent-encoded) is one of these routes."""

    answer: Callable[[bytes, bytes, bytes, str | None], tuple[int, bytes, bytes]]
    """(method, raw path, raw query, client address) -> (status, header lines each ending in CRLF,
    body). Synchronous: it must not block. The Content-Length is added here."""


def guarded_protocol(
    gate: Gate, zerocopy: bool = False, quick: QuickRoutes | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under `gate` and its header timeout (servekit.limits): pass it as
    `uvicorn.Config(http=...)`. `zerocopy`: offer `ZEROCOPY` to the app (a closure per request: only
    for listeners whose app sends files). `quick`: routes answered without the app.

    Long because it is one class: its methods are uvicorn's parser callbacks and close over the gate,
    the timeout and the options."""
    header_timeout = gate.limits.header_timeout

    class GuardedProtocol(HttpToolsProtocol):
        _admitted = False
        _client: str | None = None
        _header_timer: asyncio.TimerHandle | None = None
        _quick_request: tuple[bytes, bytes, bytes, bool] | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            self._client = str(peer[0]) if isinstance(peer, tuple) and peer else None
            if not gate.admit(self._client):
                transport.write(BUSY)
                transport.close()
                return
            self._admitted = True
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._admitted:
                return
            self._admitted = False
            gate.release(self._client)
            self._disarm()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm()
            if quick is not None and self._quick_eligible():
                return
            if not zerocopy:
                super().on_headers_complete()
                return
            self.scope.setdefault("extensions", {})[ZEROCOPY] = {}
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade: a cycle of this request
                _with_zerocopy(cycle)

        def _quick_eligible(self) -> bool:
            """Take this request for `quick`: its path is one of the routes, no body is coming, no
            response of this connection is in flight or queued, and the transport takes writes."""
            assert quick is not None
            cycle = self.cycle
            if self.pipeline or (cycle is not None and not cycle.response_complete) or self.flow.write_paused:
                return False
            parser = self.parser
            if parser.should_upgrade() or any(
                n in (b"content-length", b"transfer-encoding") for n, _ in self.headers
            ):
                return False
            url = httptools.parse_url(self.url)
            if not quick.claims(url.path):
                return False
            keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
            self._quick_request = (parser.get_method(), url.path, url.query or b"", keep_alive)
            return True

        def on_body(self, body: bytes) -> None:
            if self._quick_request is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            request = self._quick_request
            if request is None:
                super().on_message_complete()
                return
            self._quick_request = None
            assert quick is not None
            method, path, query, keep_alive = request
            status, head, body = quick.answer(method, path, query, self._client)
            parts = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                parts += [name, b": ", value, b"\r\n"]
            parts += [head, b"content-length: %d\r\n" % len(body)]
            if not keep_alive:
                parts.append(b"connection: close\r\n")
            parts.append(b"\r\n")
            if method != b"HEAD":
                parts.append(body)
            self.transport.write(b"".join(parts))
            if not keep_alive:
                self.transport.close()
            self.on_response_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # A pipelined request's headers are complete already; otherwise the next one has its time.
            if not self.transport.is_closing() and not self.pipeline:
                self._arm()

        def _arm(self, seconds: float = header_timeout) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_late, self.loop.time() + seconds)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self, due: float) -> None:
            self._header_timer = None
            if self.loop.time() - due > LOOP_HELD_UP:
                # The loop itself was held up (a busy process): the headers may have come meanwhile and
                # not been read yet, as the loop runs timers before it reads sockets. Look once more
                # after it has.
                self._arm(LOOP_HELD_UP)
                return
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedProtocol


def _with_zerocopy(cycle: RequestResponseCycle) -> None:
    """`cycle.send` taking `ZEROCOPY` messages too (its task has not started yet: it sends through this)."""
    plain = cycle.send

    async def send(message: Any) -> None:
        if message["type"] == ZEROCOPY:
            await _send_file(cycle, message)
        else:
            await plain(message)

    cycle.send = send  # type: ignore[method-assign]


async def _send_file(cycle: RequestResponseCycle, message: Any) -> None:
    if cycle.disconnected:
        return
    if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding:
        raise RuntimeError(f"{ZEROCOPY} needs a started response with a Content-Length, not yet complete")
    file = message["file"]
    in_fd = file if isinstance(file, int) else file.fileno()
    offset, count = int(message.get("offset", 0)), int(message["count"])
    if count > cycle.expected_content_length:
        raise RuntimeError("Response content longer than Content-Length")
    transport = cycle.transport
    while transport.get_write_buffer_size() and not transport.is_closing():
        await asyncio.sleep(_FLUSH_POLL)  # what the transport holds goes first
    if transport.is_closing():
        cycle.disconnected = True
        return
    out_fd = os.dup(transport.get_extra_info("socket").fileno())
    try:
        await anyio.to_thread.run_sync(_sendfile, out_fd, in_fd, offset, count)
    except (OSError, EOFError):
        # The client went away, stopped reading, or the file is shorter than said: the response cannot
        # complete, so the connection goes (the client sees fewer bytes than the Content-Length).
        cycle.disconnected = True
        transport.close()
        return
    finally:
        os.close(out_fd)
    cycle.expected_content_length -= count
    if not message.get("more_body", False):
        if cycle.expected_content_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()


def _sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> None:
    """All of [offset, offset + count) of `in_fd` onto the non-blocking socket `out_fd`."""
    room = select.poll()
    room.register(out_fd, select.POLLOUT)
    done = 0
    while done < count:
        try:
            sent = os.sendfile(out_fd, in_fd, offset + done, count - done)
        except BlockingIOError:
            if not room.poll(SEND_STALL * 1000):
                raise TimeoutError(f"the client took nothing for {SEND_STALL:.0f}s") from None
            continue
        if sent == 0:
            raise EOFError(f"the file ends {count - done} bytes short")
        done += sent


def uvicorn_options(gate: Gate, zerocopy: bool = False, quick: QuickRoutes | None = None) -> dict[str, Any]:
    """The `uvicorn.Config` options that put a listener under `gate` (`zerocopy`, `quick`: see
    `guarded_protocol`)."""
    return {
        "http": guarded_protocol(gate, zerocopy, quick),
        "timeout_keep_alive": gate.limits.keepalive_timeout,
    }
