"""Streaming a blob while it arrives: the body of a GET for a file the node is still fetching.

The response starts as soon as the first servable bytes exist, with the whole file's `Content-Length`
(or the range's), and goes on in order as `agent.cache.arrivals` says more is servable: a client's
progress bar and read timeout behave as against the Hub, however long the blob takes, as long as
bytes keep coming. The last byte waits for the blob's end-to-end check; when that fails the response
is cut short (`StreamCut`: the connection closes before the declared length), never completed with
wrong bytes.

Waiting polls on the event loop (no thread held per waiting client); reads go to a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import anyio
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from agent.cache.arrivals import Arrival

CHUNK = 1 << 20
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
) -> StreamingResponse:
    """The response streaming `wanted` ([start, end); None: the whole blob, 200) of an arrival; `release`
    runs once when it ends, however it ends. `checked`: the client checks the whole blob itself (another
    agent), so the last byte goes as soon as it is written (agent.cache.arrivals)."""
    start, end = wanted if wanted is not None else (0, arrival.size)
    headers = {**headers, "Content-Length": str(end - start)}
    if wanted is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{arrival.size}"
    return StreamingResponse(
        stream_arrival(arrival, start, end, stall, release, checked),
        status_code=206 if wanted is not None else 200,
        headers=headers,
        media_type="application/octet-stream",
        background=BackgroundTask(release),
    )


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
            if arrival.state == "failed":
                raise StreamCut(f"blob {arrival.blob_id[:16]}… failed after {pos} bytes: {arrival.error}")
            if time.monotonic() - last_progress > stall:
                raise StreamCut(f"blob {arrival.blob_id[:16]}…: nothing new for {stall:.0f}s at byte {pos}")
            arrival.want(reader, pos)
            await asyncio.sleep(POLL)
    finally:
        arrival.want(reader, None)
        on_done()
