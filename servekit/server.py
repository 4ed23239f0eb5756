"""uvicorn's server loop, woken once a second instead of ten times.

`uvicorn.Server` sleeps 0.1 s between looks at its exit flag, and refreshes the Date header it sends on
every tenth look. An idle daemon has two of them (its admin socket and its network API): their twenty
wake-ups a second were half of what an idle agent cost (benchmarks.md, "Other scripts": idle), on every
GPU node, all the time. `QuietServer` looks once a second, when the Date header changes, and at once
when told to stop (`exit_now`, or a signal while it runs the loop in the main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import FrameType

import uvicorn

TICK = 1.0
"""Seconds between the server's looks at its exit flag and its Date header (uvicorn's resolution)."""


class QuietServer(uvicorn.Server):
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        # uvicorn refreshes the Date header on the ticks it numbers 0 mod 10: every one of these.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK)

    def exit_now(self) -> None:
        """Stop serving (from any thread): the loop sees it now, not at its next tick."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: it has stopped already
                loop.call_soon_threadsafe(wake.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.should_exit:
            self.exit_now()


class BindError(OSError):
    """A listening socket could not be had; the message names the address and why."""


def bind_tcp(host: str, port: int, backlog: int, what: str) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host has a colon); BindError naming `what`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {what}: {exc.strerror}") from None
    sock.listen(backlog)
    return sock
