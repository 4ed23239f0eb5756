"""uvicorn's HTTP protocol under a listener's `Gate` (servekit.limits: connection caps, header timeout, a
request's head and body), with the ASGI zero-copy send extension (`ZEROCOPY`), which uvicorn itself does
not offer, and a probe port (`ProbePort`): a second socket of the same server, under a gate of its own,
that answers only /healthz and /readyz.

A request's head is counted in `data_received` before the parser sees its bytes (httptools keeps a
header line until it ends, uvicorn every line in `self.headers`) and its lines and target in the
parser's callbacks; a callback over a limit raises, which stops the parse, and the refusal goes out in
place of uvicorn's 400. The body's clock is the connection's one timer, as its other deadlines.

Zero-copy send: an app that finds `ZEROCOPY` in `scope["extensions"]` may send the body as
`{"type": ZEROCOPY, "file": <file object or descriptor>, "offset": N, "count": N, "more_body": bool}`
after its `http.response.start` (with a Content-Length). The bytes go from the file to the socket in
the kernel (`os.sendfile`): no read into Python, no copy into the transport's buffer, which a relay seed
otherwise paid for every byte (benchmarks.md, "The relay: seed and receiver").

uvloop's `loop.sendfile` is not implemented, so the protocol does it itself: once the transport's own
buffer is empty (the head, earlier bodies), a short span (`INLINE_SPAN`) goes out from the event loop as
far as the socket takes it at once, and the rest, or a longer span, from a worker thread that sends on a
duplicate of the connection's descriptor (its own: the loop may close the connection meanwhile), waiting
for room with `poll`. The loop reads the connection meanwhile as usual (a disconnect, a pipelined
request) and writes nothing to it: the response is this cycle's until its last byte.

Quick routes (`QuickRoutes`): requests a listener answers from the protocol itself, synchronously, in
one write, without an ASGI cycle: no task, no scope, no message dicts. For a BitTorrent announce that
machinery cost more CPU than the announce. Only a plain request qualifies (no body expected, nothing
pipelined ahead of it, the transport taking writes); anything else takes the ASGI path as usual. A
read that is exactly one such request in its plainest form (`_PLAIN_REQUEST`: GET or HEAD, HTTP/1.1,
visible ASCII, no header that announces a body, an upgrade or an expectation) is answered before the
parser sees it: the parser's callbacks cost a tenth of an announce's CPU. Any other read, or a request
that arrives in pieces, goes through the parser, and a quick route still answers it after its headers.
"""

from __future__ import annotations

import asyncio
import os
import re
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
INLINE_SPAN = 512 << 10
"""A span at most this long is sent from the event loop, as far as the socket takes it at once (the rest
from a worker thread): a relay hop on a slow link sends a span every few tens of milliseconds, and a
worker thread for each cost more CPU than its bytes. At most this much is read from the file on the loop
(a blob being relayed was just written: its bytes are in the page cache)."""
LOOP_HELD_UP = 0.25
"""Seconds a header timeout may fire late before it counts as the event loop held up, not the client."""

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 27\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections; retry"
)
"""What a connection over a cap is told before it is closed (no request of it is read)."""
_REFUSALS = {
    404: b"this port answers /healthz and /readyz only",
    408: b"the request body did not arrive in time",
    414: b"request target too long",
    431: b"request head too large",
}
"""What a request over a limit of its head or its body is told before its connection is closed."""


class _OverLimit(Exception):
    """Raised in a parser callback to stop the parse of a request over a limit (`_over` says which)."""


_PLAIN_REQUEST = re.compile(
    rb"(GET|HEAD) (/[\x21\x22\x24-\x3e\x40-\x7e]*)(?:\?([\x21\x22\x24-\x7e]*))? HTTP/1\.1"
    rb"((?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e]*)*)\r\n\r\n"
)
"""One whole request, nothing after it: method, path, query (no fragment), then the header lines (each
a token, a colon and visible ASCII), lower-cased by the reader before it looks for names."""
_NOT_PLAIN = re.compile(rb"\r\n(?:content-length|transfer-encoding|upgrade|expect):")
"""Header names (lower-cased) that take a request off the plain path."""


@dataclass(frozen=True)
class QuickRoutes:
    """Requests answered in the protocol (see the module's docstring)."""

    claims: Callable[[bytes], bool]
    """Whether a raw path (still percent-encoded) is one of these routes."""

    answer: Callable[[bytes, bytes, bytes, str | None], tuple[int, bytes, bytes]]
    """(method, raw path, raw query, client address) -> (status, header lines each ending in CRLF,
    body). Synchronous: it must not block. The Content-Length is added here."""


@dataclass(frozen=True)
class ProbePort:
    """A second listening port of the same server that answers only the probes (`PROBE_PATHS`), under a
    gate of its own: kubelet's probes are answered while the main port is full of hostile connections."""

    port: int
    """The TCP port it listens on (the server is given its socket too)."""

    gate: Gate


PROBE_PATHS = (b"/healthz", b"/readyz")
"""The only paths a `ProbePort` serves; any other is answered 404 and closed."""


def guarded_protocol(
    gate: Gate, zerocopy: bool = False, quick: QuickRoutes | None = None, probe: ProbePort | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under `gate` and its header timeout (servekit.limits): pass it as
    `uvicorn.Config(http=...)`. `zerocopy`: offer `ZEROCOPY` to the app (a closure per request: only
    for listeners whose app sends files). `quick`: routes answered without the app. `probe`: connections
    to that port are under its gate and get the probes only.

    Long because it is one class: its methods are uvicorn's parser callbacks and close over the gate,
    the timeout and the options."""
    heads = _ResponseHeads()

    class GuardedProtocol(HttpToolsProtocol):
        _admitted = False
        _gate = gate
        _limits = gate.limits
        _probe = False
        """A connection to the probe port."""
        _client: str | None = None
        _timer: asyncio.TimerHandle | None = None
        _timer_at = 0.0
        _header_due: float | None = None
        _idle_due: float | None = None
        _quick_request: tuple[bytes, bytes, bytes, bool] | None = None
        _in_message = False
        """The parser holds part of a request (from its first byte to its end)."""
        _head_seen: int | None = 0
        """Bytes received since this request's head began (None: its head is complete)."""
        _head_tail = b""
        _line_ended = False
        """This request's line has ended (a head too long before it is a target too long: 414)."""
        _url_bytes = 0
        _header_count = 0
        _body_due: float | None = None
        _body_from = 0.0
        _body_got = 0
        _over: int | None = None
        """The status a parser callback refused the request with (its parse then stops)."""
        _refusal: int | None = None
        """The status the connection was refused with: nothing more of it is read."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            self._client = str(peer[0]) if isinstance(peer, tuple) and peer else None
            if probe is not None:
                local = transport.get_extra_info("sockname")
                if isinstance(local, tuple) and len(local) > 1 and local[1] == probe.port:
                    self._gate, self._limits, self._probe = probe.gate, probe.gate.limits, True
            if not self._gate.admit(self._client):
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
            self._gate.release(self._client)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refusal is not None:
                return
            seen = self._head_seen
            if seen is not None:
                # Counted before the parser sees them: it would keep a header line's bytes until the
                # line ends. Over the limit only if the head does not end within it.
                room = max(self._limits.max_head_bytes - seen, 0)
                if len(data) > room and (self._head_tail + data[:room]).find(b"\r\n\r\n") < 0:
                    # Still in the request line: its target is what is too long.
                    self._refuse(431 if self._line_ended or b"\n" in data[:room] else 414)
                    return
                self._head_seen = seen + len(data)
                self._head_tail = data[-3:]
                self._line_ended = self._line_ended or b"\n" in data
            if quick is None or self._probe or self._in_message or not self._plain_answered(data):
                super().data_received(data)

        def on_url(self, url: bytes) -> None:
            self._url_bytes += len(url)
            if self._url_bytes > self._limits.max_url_bytes:
                self._over = 414
                raise _OverLimit
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > self._limits.max_headers:
                self._over = 431
                raise _OverLimit
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to any parse error; a callback's `_OverLimit` is one too.
            if self._over is None:
                super().send_400_response(msg)
            else:
                self._refuse(self._over)

        def _refuse(self, status: int) -> None:
            """Answer `status` (unless a response of this request has started) and close: a request over
            a limit of its head or its body."""
            self._refusal = status
            cycle = self.cycle
            if cycle is None or not cycle.response_started or cycle.response_complete:
                body = _REFUSALS[status]
                self.transport.write(
                    b"".join([
                        STATUS_LINE[status],
                        b"content-type: text/plain\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
                        % len(body),
                        body,
                    ])
                )
            if cycle is not None:
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

        def on_message_begin(self) -> None:
            self._in_message = True
            self._url_bytes = self._header_count = 0
            super().on_message_begin()

        def _plain_answered(self, data: bytes) -> bool:
            """Answer `data` if it is one plain request (`_PLAIN_REQUEST`) for a quick route that can be
            answered now; False leaves it to the parser."""
            assert quick is not None
            if not self._answerable_now():
                return False
            plain = _PLAIN_REQUEST.fullmatch(data)
            if plain is None or not quick.claims(plain[2]):
                return False
            headers = plain[4].lower()
            if _NOT_PLAIN.search(headers):
                return False
            keep_alive = True
            at = headers.find(b"\r\nconnection:")
            if at >= 0:
                if headers.find(b"\r\nconnection:", at + 2) >= 0:
                    return False
                end = headers.find(b"\r\n", at + 2)
                value = headers[at + 13 : end if end >= 0 else None]
                if b"upgrade" in value:
                    return False
                keep_alive = b"close" not in value
            self._answer(plain[1], plain[2], plain[3] or b"", keep_alive)  # it sets the deadlines anew
            return True

        def on_headers_complete(self) -> None:
            self._disarm()
            self._head_seen = None
            if self._probe and httptools.parse_url(self.url).path not in PROBE_PATHS:
                self._over = 404
                raise _OverLimit
            if quick is not None and self._quick_eligible():
                return
            if any(n in (b"content-length", b"transfer-encoding") for n, _ in self.headers):
                # The body's clock: the header timeout ended with the head.
                self._body_from, self._body_got = self.loop.time(), 0
                self._body_due = self._body_from + self._limits.body_timeout
                self._wake_by(self._body_due)
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
            if not self._answerable_now():
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

        def _answerable_now(self) -> bool:
            """No response of this connection is in flight or queued, and the transport takes writes."""
            cycle = self.cycle
            return not (
                self.pipeline or (cycle is not None and not cycle.response_complete) or self.flow.write_paused
            )

        def on_body(self, body: bytes) -> None:
            self._body_got += len(body)
            if self._quick_request is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_message = False
            self._body_due = None
            self._head_seen, self._head_tail, self._line_ended = 0, b"", False
            request = self._quick_request
            if request is None:
                super().on_message_complete()
                return
            self._quick_request = None
            self._answer(*request)

        def _answer(self, method: bytes, path: bytes, query: bytes, keep_alive: bool) -> None:
            """Answer a quick request, then what `on_response_complete` does after one: nothing paused the
            reading and nothing is pipelined (the request was taken only then)."""
            assert quick is not None
            status, head, body = quick.answer(method, path, query, self._client)
            response = [heads.get(self.server_state.default_headers, status, head), b"%d\r\n" % len(body)]
            if not keep_alive:
                response.append(b"connection: close\r\n")
            response.append(b"\r\n")
            if method != b"HEAD":
                response.append(body)
            self.transport.write(b"".join(response))
            self.server_state.total_requests += 1
            self._head_seen, self._head_tail, self._line_ended = 0, b"", False
            if not keep_alive:
                self.transport.close()
                return
            now = self.loop.time()
            self._header_due = now + self._limits.header_timeout
            self._idle_due = now + self.timeout_keep_alive
            self._wake_by(min(self._header_due, self._idle_due))

        def on_response_complete(self) -> None:
            # uvicorn's, its keep-alive timer made a deadline of the connection's one timer (`_wake_by`).
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            if self.pipeline:  # its headers are complete already
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
                return
            self._idle_due = self.loop.time() + self.timeout_keep_alive
            self._wake_by(self._idle_due)
            self._arm()  # the next request has its time

        def _unset_keepalive_if_required(self) -> None:
            self._idle_due = None

        def _arm(self) -> None:
            self._header_due = self.loop.time() + self._limits.header_timeout
            self._wake_by(self._header_due)

        def _disarm(self) -> None:
            self._header_due = None

        def _wake_by(self, due: float) -> None:
            """The connection's one timer set to fire by `due`. A request moves its deadlines later and
            leaves the timer be (when it fires early it is set again): a timer made and cancelled per
            request, twice, was a few percent of an announce's CPU."""
            timer = self._timer
            if timer is None or due < self._timer_at:
                if timer is not None:
                    timer.cancel()
                self._timer = self.loop.call_at(due, self._deadline)
                self._timer_at = due

        def _deadline(self) -> None:
            """The keep-alive (no byte of a next request), the header timeout or the body's passed: close."""
            now = self.loop.time()
            late = now - self._timer_at
            self._timer = None
            if self._body_due is not None:
                self._body_due = self._body_late_at(now)
            dues = [due for due in (self._header_due, self._idle_due, self._body_due) if due is not None]
            if not dues:
                return
            if min(dues) > now:
                self._wake_by(min(dues))
                return
            if late > LOOP_HELD_UP:
                # The loop itself was held up (a busy process): what meets the deadline may have come
                # meanwhile and not been read yet, as the loop runs timers before it reads sockets. Look
                # once more after it has.
                self._wake_by(now + LOOP_HELD_UP)
                return
            if self.transport.is_closing():
                return
            if self._body_due is not None and self._body_due <= now:
                self._refuse(408)
            else:
                self.transport.close()

        def _body_late_at(self, now: float) -> float:
            """When the body in progress is late: `body_timeout` after its head, plus the time its bytes
            so far take at `min_body_rate`."""
            rate = self._limits.min_body_rate
            if self.flow.read_paused:
                # The app is not reading, so the client cannot send: its grace starts again from now.
                self._body_from = now - self._body_got / rate
            return self._body_from + self._limits.body_timeout + self._body_got / rate

    return GuardedProtocol


class _ResponseHeads:
    """A listener's quick answers' status line, default headers and `head`, up to the name of their
    Content-Length: made once per second (uvicorn's default headers hold the date), not per answer."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, bytes], bytes] = {}
        self._defaults: object = None

    def get(self, defaults: list[tuple[bytes, bytes]], status: int, head: bytes) -> bytes:
        if self._defaults is not defaults or len(self._made) > 64:
            self._made.clear()
            self._defaults = defaults
        made = self._made.get((status, head))
        if made is None:
            lines = [name + b": " + value + b"\r\n" for name, value in defaults]
            made = b"".join([STATUS_LINE[status], *lines, head, b"content-length: "])
            self._made[status, head] = made
        return made


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
    sock_fd = transport.get_extra_info("socket").fileno()
    try:
        sent = _sendfile_now(sock_fd, in_fd, offset, count) if count <= INLINE_SPAN else 0
        if sent < count:
            out_fd = os.dup(sock_fd)
            try:
                await anyio.to_thread.run_sync(_sendfile, out_fd, in_fd, offset + sent, count - sent)
            finally:
                os.close(out_fd)
    except (OSError, EOFError):
        # The client went away, stopped reading, or the file is shorter than said: the response cannot
        # complete, so the connection goes (the client sees fewer bytes than the Content-Length).
        cycle.disconnected = True
        transport.close()
        return
    cycle.expected_content_length -= count
    if not message.get("more_body", False):
        if cycle.expected_content_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()


def _sendfile_now(out_fd: int, in_fd: int, offset: int, count: int) -> int:
    """As much of [offset, offset + count) of `in_fd` as the non-blocking socket `out_fd` takes at once."""
    done = 0
    while done < count:
        try:
            sent = os.sendfile(out_fd, in_fd, offset + done, count - done)
        except BlockingIOError:
            break
        if sent == 0:
            raise EOFError(f"the file ends {count - done} bytes short")
        done += sent
    return done


def _sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> None:
    """All of [offset, offset + count) of `in_fd` onto the non-blocking socket `out_fd`."""
    room = select.poll()
    room.register(out_fd, select.POLLOUT)
    done = _sendfile_now(out_fd, in_fd, offset, count)
    while done < count:
        if not room.poll(SEND_STALL * 1000):
            raise TimeoutError(f"the client took nothing for {SEND_STALL:.0f}s")
        done += _sendfile_now(out_fd, in_fd, offset + done, count - done)


def uvicorn_options(
    gate: Gate, zerocopy: bool = False, quick: QuickRoutes | None = None, probe: ProbePort | None = None
) -> dict[str, Any]:
    """The `uvicorn.Config` options that put a listener under `gate` (`zerocopy`, `quick`, `probe`: see
    `guarded_protocol`)."""
    return {
        "http": guarded_protocol(gate, zerocopy, quick, probe),
        "timeout_keep_alive": gate.limits.keepalive_timeout,
    }
