"""The test hub's file bodies: Range, the bandwidth caps, the body faults, egress counted as it goes out.

`FileSender` is the part of the request handler (`agent.hub.handler`) that sends a repo file's bytes, for
the hub's own file routes and for its CDN alike.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from agent.hub.errors import HttpError
from agent.hub.faults import TokenBucket, chunk_for
from agent.hub.ranges import parse_range
from agent.hub.repos import RepoFile

if TYPE_CHECKING:
    from agent.hub.state import HubState


class _BodyFaults(NamedTuple):
    """The one-off faults (agent.hub.faults) and the rate caps one body is sent under."""

    truncate: int | None
    corrupt: bool
    stall: tuple[int, float] | None
    buckets: list[TokenBucket]


_SENDFILE_CAP = 8 * 2**20  # bytes one os.sendfile call may take (the stats move at least this often)


def _acked(sock: socket.socket) -> int | None:
    """Bytes of the connection its peer has acknowledged (Linux TCP_INFO `tcpi_bytes_acked`), or None."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 128)
    except (OSError, AttributeError):
        return None
    return int(struct.unpack_from("=Q", info, 120)[0]) if len(info) >= 128 else None


def _wait_writable(sock: socket.socket) -> None:
    """Until `sock` takes bytes again, at most its timeout."""
    with selectors.DefaultSelector() as ready:
        ready.register(sock, selectors.EVENT_WRITE)
        if not ready.select(sock.gettimeout()):
            raise TimeoutError("the client stopped reading")


class FileSender(BaseHTTPRequestHandler):
    """Sends a file's bytes (`send_file`); the handler sets `hub` and `conn_bucket` in its setup."""

    hub: HubState
    conn_bucket: TokenBucket | None
    _body_sent = 0
    """Bytes of the body being sent that were counted as egress."""

    def send_file(
        self,
        method: str,
        entry: RepoFile,
        headers: dict[str, str],
        names: tuple[str, ...],
        content_type: str = "application/octet-stream",
    ) -> None:
        """200 or 206 with `headers`, Accept-Ranges and Content-Length, and the body unless HEAD.
        `names`: what the corrupt faults may name this body by (repo path, blob id)."""
        try:
            f = open(entry.abs_path, "rb")  # noqa: SIM115 - closed below; the fd pins the bytes we checked
        except OSError as exc:
            raise HttpError(404, f"Entry not found: {entry.path}", "EntryNotFound", headers) from exc
        faults = self.hub.faults
        with f:
            st = os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
                msg = f"Entry changed on disk since this commit: {entry.path}"
                raise HttpError(404, msg, "EntryNotFound", headers)
            size = faults.claimed_sizes.get(entry.path, entry.size)
            rng = None if faults.ignore_range else parse_range(self.headers.get("Range"), size)
            if rng == "unsatisfiable":
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = rng if isinstance(rng, tuple) else (0, size - 1)
            length = end - start + 1
            self.send_response(206 if isinstance(rng, tuple) else 200)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", content_type)
            if not (method == "HEAD" and faults.head_without_length):
                self.send_header("Content-Length", str(length))
            if isinstance(rng, tuple):
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            has = max(0, min(end, entry.size - 1) - start + 1)  # less than promised when the size is a lie
            if faults.answer_bytes is not None and entry.path in faults.claimed_sizes:
                has = min(has, faults.answer_bytes)
            body = method != "HEAD" and length > 0
            # A body's faults are taken before its headers go out: once they are out the client may ask
            # for the next range, and that request's thread must not take the fault meant for this one.
            plan = self._body_faults(start, has, names) if body and has else None
            self.end_headers()
            if not body:
                return
            if plan is not None:
                self._send_body(f, start, has, plan)
            if has < length:
                self.close_connection = True

    def _body_faults(self, start: int, length: int, names: tuple[str, ...]) -> _BodyFaults:
        """The faults and rate caps this body is sent under, taken from `hub.faults` (each a one-off)."""
        faults = self.hub.faults
        truncate = faults.take_truncate()
        corrupt = faults.take_corrupt(names)
        stall = faults.take_stall(start + length - 1)
        caps = (self.hub.total_bucket, self.hub.client_bucket(self.client_address[0]), self.conn_bucket)
        buckets = [b for b in (*caps, faults.take_slow(start + length - 1)) if b is not None]
        return _BodyFaults(truncate, corrupt, stall, buckets)

    def _send_body(self, f: BinaryIO, start: int, length: int, plan: _BodyFaults) -> None:
        """The body, its bytes counted as egress as the kernel takes them; when the client leaves halfway,
        only what it acknowledged stays counted (the rest of the socket's send buffer never went out)."""
        self._body_sent = 0
        acked = _acked(self.connection)
        try:
            self._send_payload(f, start, length, plan)
        except OSError:
            now = _acked(self.connection)
            if acked is not None and now is not None:
                self.hub._add_egress(-max(0, self._body_sent - (now - acked)))
            raise

    def _send_payload(self, f: BinaryIO, start: int, length: int, plan: _BodyFaults) -> None:
        truncate, corrupt, stall, buckets = plan
        if not (buckets or corrupt or stall or truncate is not None):
            return self._sendfile(f, start, length)
        limit = length if truncate is None else min(length, truncate)
        rate = min((b.rate for b in buckets), default=None)
        step = chunk_for(rate)
        f.seek(start)
        sent = 0
        while sent < limit:
            if stall is not None and sent >= stall[0]:
                time.sleep(stall[1])
                stall = None
            want = min(step, limit - sent)
            if stall is not None and sent < stall[0]:
                want = min(want, stall[0] - sent)
            for bucket in buckets:
                bucket.take(want)
            if corrupt and sent == 0:
                data = f.read(want)
                if not data:
                    break
                self.wfile.write(bytes([data[0] ^ 0xFF]) + data[1:])
                n = len(data)
                self._counted(n)
            else:
                # sendfile: a capped body costs the server no copies through Python, so a
                # benchmark measures the client, not this test origin's CPU.
                n = self._send_counted(f, start + sent, want)
                if n == 0:
                    break
            sent += n
        if stall is not None:  # stall_after beyond the body: stall at the end instead
            time.sleep(stall[1])
        if sent < length:  # a truncated body: the client sees the connection drop
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _sendfile(self, f: BinaryIO, start: int, length: int) -> None:
        if self._send_counted(f, start, length) < length:
            raise BrokenPipeError("file shrank while sending")

    def _send_counted(self, f: BinaryIO, offset: int, count: int) -> int:
        """Up to `count` bytes of `f` from `offset` by sendfile, counted as the kernel takes them.
        (socket.sendfile reports nothing of a call that ends in an error: a response the client closed
        halfway, as the fetch engine closes a hedged range, went uncounted, and a cold start, which cannot
        take less than one copy, read less.)"""
        sock = self.connection
        out, src = sock.fileno(), f.fileno()
        sent = 0
        while sent < count:
            try:
                n = os.sendfile(out, src, offset + sent, min(_SENDFILE_CAP, count - sent))
            except BlockingIOError:  # the socket has a timeout, so it is non-blocking underneath
                _wait_writable(sock)
                continue
            if n == 0:
                break
            sent += n
            self._counted(n)
        return sent

    def _counted(self, n: int) -> None:
        self._body_sent += n
        self.hub._add_egress(n)
