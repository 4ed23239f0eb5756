"""Streaming a blob while it arrives: the body of a GET for a file the node is still fetching.

The response starts as soon as the first servable bytes exist, with the whole file's `Content-Length`
(or the range's), and goes on in order as `agent.cache.arrivals` says more is servable: a client's
progress bar and read timeout behave as against the Hub, however long the blob takes, as long as
bytes keep coming. The last byte waits for the blob's end-to-end check; when that fails the response
is cut short (`StreamCut`: the connection closes before the declared length), never completed with
wrong bytes.

Waiting polls on the event loop (no thread held per waiting client); reads go to a worker thread. To a
client that checks the blob itself (another agent, over the relay), on a server that offers the ASGI
zero-copy send extension (servekit.protocol), the bytes go from the file to the socket in the kernel
instead (`ZeroCopyArrival`): a relay seed's CPU per byte was mostly the Python loop of reads and writes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from agent.cache.arrivals import Arrival

CHUNK = 1 << 20
ZEROCOPY = "http.response.zerocopysend"
"""The ASGI zero-copy send extension (servekit.protocol offers it)."""
SPAN = 16 << 20
"""Most bytes one zero-copy send takes: the reader's position (`Arrival.want`) moves at least this often."""
POLL = 0.02
"""Seconds between looks at an arrival that has nothing new to serve (a look is a lock and a compare;
each relay hop waits up to this long, and a chain of relays has as many hops as nodes)."""


def arrival_response(
    arrival: Arrival,
    wanted: tuple[int, int] | None,
    headers: dict[str, str],
    stall: float,
    release: Callable[[], None],
    checked: bool = False,
) -> Response:
    """The response streaming `wanted` ([start, end); None: the whole blob, 200) of an arrival; `release`
    runs once when it ends, however it ends. `checked`: the client checks the whole blob itself (another
    agent), so the last byte goes as soon as it is written (agent.cache.arrivals)."""
    start, end = wanted if wanted is not None else (0, arrival.size)
    headers = {**headers, "Content-Length": str(end - start)}
    if wanted is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{arrival.size}"
    status = 206 if wanted is not None else 200
    copying = StreamingResponse(
        stream_arrival(arrival, start, end, stall, release, checked),
        status_code=status,
        headers=headers,
        media_type="application/octet-stream",
        background=BackgroundTask(release),
    )
    if not checked:
        return copying
    return ZeroCopyArrival(arrival, start, end, stall, release, copying)


class ZeroCopyArrival(Response):
    """`copying`'s response, its body sent from the file by the server (`ZEROCOPY`) where it can; for a
    client that checks the blob itself: a `restart` during a send cuts the stream after the fact."""

    def __init__(
        self,
        arrival: Arrival,
        start: int,
        end: int,
        stall: float,
        release: Callable[[], None],
        copying: StreamingResponse,
    ) -> None:
        super().__init__(status_code=copying.status_code)
        self.raw_headers = copying.raw_headers
        self.arrival, self.start, self.end, self.stall = arrival, start, end, stall
        self.release, self.copying = release, copying

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if ZEROCOPY not in scope.get("extensions", {}):
            await self.copying(scope, receive, send)
            return
        try:
            head = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(head)
            async with anyio.create_task_group() as tg:

                async def gone() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()  # the receiver went away: its relay slot is free again

                tg.start_soon(gone)
                await self._body(send)
                tg.cancel_scope.cancel()
        finally:
            self.release()

    async def _body(self, send: Any) -> None:
        arrival, pos, end = self.arrival, self.start, self.end
        reader = id(self)
        last_progress = time.monotonic()
        try:
            while pos < end:
                opened = arrival.open_at(pos, min(SPAN, end - pos), checked=True)
                if opened is not None:
                    fd, n, generation = opened
                    # more_body always: the end is an empty body, once the stream's slot is released.
                    span = {"type": ZEROCOPY, "file": fd, "offset": pos, "count": n, "more_body": True}
                    try:
                        await send(span)
                    finally:
                        os.close(fd)
                    if not arrival.unchanged(generation):
                        raise StreamCut(f"blob {arrival.blob_id[:16]}… started over while it was sent")
                    pos += n
                    arrival.want(reader, pos)
                    last_progress = time.monotonic()
                    continue
                _check_going(arrival, pos, last_progress, self.stall)
                arrival.want(reader, pos)
                await asyncio.sleep(POLL)
        finally:
            arrival.want(reader, None)
        # Released before the response completes, as the copying stream's end does: the client may ask
        # again the moment it has the last byte, and its slot must be free by then.
        self.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _check_going(arrival: Arrival, pos: int, last_progress: float, stall: float) -> None:
    """Raise `StreamCut` for a blob that failed, or brought nothing new at `pos` for `stall` seconds."""
    if arrival.state == "failed":
        raise StreamCut(f"blob {arrival.blob_id[:16]}… failed after {pos} bytes: {arrival.error}")
    if time.monotonic() - last_progress > stall:
        raise StreamCut(f"blob {arrival.blob_id[:16]}…: nothing new for {stall:.0f}s at byte {pos}")


class StreamCut(Exception):
    """The blob a response was streaming failed (or stalled): the response must not complete."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """A single `bytes=` range as [start, end); None: serve the whole file (no header, or one this
    server may ignore: several ranges, another unit); "unsatisfiable" for a 416."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if not first:  # suffix: the last N bytes
            n = int(last)
            return (max(0, size - n), size) if n > 0 and size else "unsatisfiable"
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, min(end, size)


async def stream_arrival(
    arrival: Arrival,
    start: int,
    end: int,
    stall: float,
    on_done: Callable[[], None],
    checked: bool = False,
) -> AsyncIterator[bytes]:
    """Bytes [start, end) of the arriving blob, in order, as they become servable. Raises `StreamCut`
    when the blob fails, or when no byte becomes servable for `stall` seconds. `on_done` runs once,
    however the stream ends (the client gone included)."""
    reader = id(object())
    pos = start
    last_progress = time.monotonic()
    try:
        while pos < end:
            data = b""
            if arrival.available(pos, checked) > pos:  # a look under a lock: no thread for nothing new
                data = await anyio.to_thread.run_sync(arrival.read, pos, min(CHUNK, end - pos), checked)
            if data:
                arrival.want(reader, pos + len(data))
                yield data
                pos += len(data)
                last_progress = time.monotonic()
                continue
            _check_going(arrival, pos, last_progress, stall)
            arrival.want(reader, pos)
            await asyncio.sleep(POLL)
    finally:
        arrival.want(reader, None)
        on_done()
