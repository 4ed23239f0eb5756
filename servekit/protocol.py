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
"""

from __future__ import annotations

import asyncio
import os
import select
from typing import Any

import anyio
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from servekit.limits import Gate

ZEROCOPY = "http.response.zerocopysend"
SEND_STALL = 60.0
"""Seconds a zero-copy send waits for room in a socket that takes nothing (a client that stopped
reading) before it gives the connection up."""
_FLUSH_POLL = 0.001

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 27\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections; retry"
)
"""What a connection over a cap is told before it is closed (no request of it is read)."""


def guarded_protocol(gate: Gate, zerocopy: bool = False) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under `gate` and its header timeout (servekit.limits): pass it as
    `uvicorn.Config(http=...)`. `zerocopy`: offer `ZEROCOPY` to the app (a closure per request: only
    for listeners whose app sends files)."""
    header_timeout = gate.limits.header_timeout

    class GuardedProtocol(HttpToolsProtocol):
        _admitted = False
        _client: str | None = None
        _header_timer: asyncio.TimerHandle | None = None

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
            if not zerocopy:
                super().on_headers_complete()
                return
            self.scope.setdefault("extensions", {})[ZEROCOPY] = {}
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade: a cycle of this request
                _with_zerocopy(cycle)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # A pipelined request's headers are complete already; otherwise the next one has its time.
            if not self.transport.is_closing() and not self.pipeline:
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
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


def uvicorn_options(gate: Gate, zerocopy: bool = False) -> dict[str, Any]:
    """The `uvicorn.Config` options that put a listener under `gate` (`zerocopy`: see `guarded_protocol`)."""
    return {"http": guarded_protocol(gate, zerocopy), "timeout_keep_alive": gate.limits.keepalive_timeout}
