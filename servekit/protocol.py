"""uvicorn's HTTP protocol under a listener's `Gate` (servekit.limits: connection caps, header timeout)."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from servekit.limits import Gate

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 27\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections; retry"
)
"""What a connection over a cap is told before it is closed (no request of it is read)."""


def guarded_protocol(gate: Gate) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under `gate` and its header timeout (servekit.limits): pass it as
    `uvicorn.Config(http=...)`."""
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
            super().on_headers_complete()

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


def uvicorn_options(gate: Gate) -> dict[str, Any]:
    """The `uvicorn.Config` options that put a listener under `gate`."""
    return {"http": guarded_protocol(gate), "timeout_keep_alive": gate.limits.keepalive_timeout}
