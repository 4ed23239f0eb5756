"""What one connection may make `agent serve-hub` hold: it runs the stdlib's ThreadingHTTPServer, a thread
per connection, which bounds none of it (a head may be 100 lines of 64 KiB each, and a client that sends
it a byte at a time holds its thread as long as it likes). The same limits as the other listeners
(servekit.limits.ConnectionLimits), kept here by the listener and its handler (agent.hub.handler):
- connections in total and per client address (`Slots`): one more is answered 503 and closed;
- a request's head (`HeadReader`): at most `max_head_bytes` read before it ends (431 and close; the
  stdlib's own caps answer 100+ header lines 431 and a request line past 64 KiB 414), within
  `header_timeout` of its first byte, whatever the pace of its bytes;
- a body: the hub reads none, so a request that announces one has its connection closed after its answer
  (the body's bytes would otherwise be read as the next request, or wait for ever).
"""

from __future__ import annotations

import http.client
import io
import socket
import threading
import time

from servekit.limits import ConnectionLimits

HUB_LIMITS = ConnectionLimits(max_connections=1024, max_per_client=None)
"""serve-hub's limits: 1,024 connections (a thread each), no cap per address (a bench's nodes all come from
127.0.0.1), a 16 KiB head within 10 s of its first byte."""


class HeadTooLarge(http.client.LineTooLong):
    """A request's head went past its bytes (a LineTooLong: the stdlib's parser answers it 431)."""

    def __init__(self, limit: int) -> None:
        http.client.HTTPException.__init__(self, f"request head over {limit} bytes")


class Slots:
    """Counts one listener's connections, in total and per client address; thread-safe."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open = 0
        self._by_client: dict[str, int] = {}

    def admit(self, client: str) -> bool:
        cap = self.limits.max_per_client
        with self._lock:
            held = self._by_client.get(client, 0)
            if self._open >= self.limits.max_connections or (cap is not None and held >= cap):
                return False
            self._open += 1
            self._by_client[client] = held + 1
            return True

    def release(self, client: str) -> None:
        with self._lock:
            self._open -= 1
            left = self._by_client.get(client, 1) - 1
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)


class HeadReader(io.RawIOBase):
    """A connection's socket as the handler's raw input: while a head is read (`begin_head` to `end_head`)
    each read waits no later than the head's deadline and the bytes are counted against its limit."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits, idle: float) -> None:
        self._sock = sock
        self._limits = limits
        self._idle = idle
        self._deadline: float | None = None
        self._first = True
        self._got = 0

    def readable(self) -> bool:
        return True

    def begin_head(self) -> None:
        """A request's head comes next: its first byte within the idle timeout, the rest within
        `header_timeout` of it."""
        self._deadline, self._first, self._got = time.monotonic() + self._idle, True, 0

    def end_head(self) -> None:
        self._deadline = None
        self._sock.settimeout(self._idle)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        deadline = self._deadline
        if deadline is None:
            return self._sock.recv_into(buffer)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's head did not arrive in time")
        self._sock.settimeout(left)
        n = self._sock.recv_into(buffer)
        if self._first and n:
            self._first = False
            self._deadline = time.monotonic() + self._limits.header_timeout
        self._got += n
        # The buffered reader above reads ahead (8 KiB): what it holds beyond the head is not the head's.
        if self._got > self._limits.max_head_bytes + io.DEFAULT_BUFFER_SIZE:
            raise HeadTooLarge(self._limits.max_head_bytes)
        return n
