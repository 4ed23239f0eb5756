"""Blobs on their way into the cache, readable while they arrive.

A blob being fetched is written into `blobs/<id>.incomplete` by one producer at a time: the origin
engine (parallel ranges, in-order hashing) or libtorrent (rarest-first pieces). Readers (the HF
endpoint, which streams a cold file to an unmodified client) need to know how far from the start
the file may be served *now*. That is the `Arrival`'s `ready` prefix:

- from the origin engine: the contiguous written prefix, the same trust as a direct origin download
  (the final sha256 still decides whether the blob is ever installed);
- from libtorrent: the contiguous prefix of pieces that passed their hash check and read back from
  the file as they hashed (`Swarm.verified_prefix`), never more.

The last byte is never servable before the blob is whole, verified end to end and installed
(`finish`) to a reader that does not check the blob itself (an HF client): a response that cannot be
completed with the right bytes is cut short instead, and the blob is remembered as `failed` for a while
so that a client's resumed ranged request is answered with the whole file (200), which makes it start
over (huggingface_hub truncates its partial file then) instead of appending good bytes to bad ones.
A reader that checks the blob end to end itself (another agent, over the relay: agent.relay.directory) is
served the last byte as soon as it is written (`available(pos, checked=True)`): held back, it waited
for this node's check and install, and the nodes of a relay chain took their last bytes one after the
other, a wait per hop (benchmarks.md, "Warm starts over the relay").

A producer that starts the file over (libtorrent given up for the origin engine, a blob discarded
after a failed check) calls `restart` first: `ready` drops to 0 and readers wait again, so a reader
never sees the zeros of a fresh preallocated file. Readers open the file by path for each read, so
a rename (`.incomplete` -> final name) or a new file is followed.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

FAILED_MEMORY = 600.0
"""Seconds a failed arrival is remembered (see `Arrivals.failed_recently`)."""


@dataclass
class Arrival:
    """One blob arriving (shared by its producer and any number of readers)."""

    blob_id: str
    size: int
    path: Path
    """Where the bytes are being written (`blobs/<id>.incomplete`)."""
    final_path: Path | None = None
    """Set by `finish`: the installed blob."""
    written: int = 0
    """Bytes from the start the producer has in place."""
    state: str = "arriving"
    """"arriving", "finished" (verified and installed) or "failed"."""
    error: str | None = None
    extent: Callable[[int], int] | None = None
    """Set by a producer that writes the blob in parts (agent.core.parts `Shares`): how far from a
    position past `ready` the file is written, so the relay serves every part as it grows."""
    chain: bool = False
    """Received from a stream rooted at a seed (a warm start): relayed on to one node at a time."""
    _generation: int = 0
    """Counts `restart`s."""
    _readers: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def whole(cls, blob_id: str, size: int, path: Path) -> Arrival:
        """A blob already complete, read through the same interface."""
        return cls(blob_id, size, path, final_path=path, written=size, state="finished")

    @property
    def ready(self) -> int:
        """Bytes from the start that may be served now to any reader: `written`, but never the last byte
        before `finish`."""
        return self.written if self.state == "finished" else min(self.written, self.size - 1)

    # -- producer side ------------------------------------------------------------------

    def advance(self, end: int) -> None:
        """The producer has the bytes [0, end) in place (monotonic per producer run)."""
        with self._lock:
            if self.state == "arriving":
                self.written = max(self.written, min(end, self.size))

    def restart(self) -> None:
        """The file is about to be started over: nothing of it may be served until `advance` again."""
        with self._lock:
            if self.state == "arriving":
                self.written = 0
                self.extent = None
                self.chain = False  # the next producer says again (agent.fetch.sources.transports `Relay`)
                self._generation += 1

    def finish(self, final_path: Path) -> None:
        with self._lock:
            self.final_path = final_path
            self.written = self.size
            self.state = "finished"

    def moved(self, final_path: Path) -> None:
        """The whole blob is installed at `final_path`, but the arrival goes on (not `finish`ed): readers that
        check the blob themselves read it there. A bucket's first read keeps each object relayed until
        the read ends (agent.fetch.bucket), for nodes that ask after its last byte."""
        with self._lock:
            if self.state == "arriving":
                self.final_path = final_path
                self.written = self.size

    def fail(self, error: str) -> None:
        with self._lock:
            if self.state == "arriving":
                self.state, self.error = "failed", error

    # -- reader side --------------------------------------------------------------------

    def want(self, reader: int, pos: int | None) -> None:
        """Reader `reader` waits for `pos` (None: it is gone)."""
        with self._lock:
            if pos is None:
                self._readers.pop(reader, None)
            else:
                self._readers[reader] = pos

    @property
    def wanted(self) -> int | None:
        """Lowest offset a reader is waiting for (producers that can choose piece order start there)."""
        with self._lock:
            return min(self._readers.values(), default=None)

    def available(self, pos: int, checked: bool = False) -> int:
        """How far from `pos` the blob may be served now (`pos` itself when nothing is). `checked`: to a
        reader that checks the whole blob itself, which may have the last byte before `finish`."""
        with self._lock:
            ready = self.written if checked else self.ready
            extent, state = self.extent, self.state
            last = self.size if checked else self.size - 1
        if pos < ready or extent is None or state != "arriving":
            return max(pos, ready)
        return max(pos, min(extent(pos), last))  # the last byte waits as `ready` does

    def read(self, pos: int, n: int, checked: bool = False) -> bytes:
        """Up to `n` servable bytes at `pos` (`checked`: as `available`); b"" when none are servable now
        (look at `state`).

        The bytes are returned only if no `restart` happened while they were read: producers restart
        before they touch the file, so what was read then is what was servable."""
        opened = self.open_at(pos, n, checked)
        if opened is None:
            return b""
        fd, n, generation = opened
        try:
            data = os.pread(fd, n, pos)
        finally:
            os.close(fd)
        return data if self.unchanged(generation) else b""

    def open_at(self, pos: int, n: int, checked: bool = False) -> tuple[int, int, int] | None:
        """The file open for reading, how many of its bytes from `pos` (at most `n`) are servable now, and
        the generation to check with `unchanged` once they are read; None when none are servable now.
        The caller closes the descriptor."""
        with self._lock:
            generation = self._generation
        end = self.available(pos, checked)
        with self._lock:
            n = min(n, end - pos)
            paths = [self.final_path] if self.final_path is not None else [self.path]
        if n <= 0:
            return None
        for path in paths:
            try:
                return os.open(path, os.O_RDONLY), n, generation
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # renamed as it finished, or discarded: ask again
                    raise
        return None

    def unchanged(self, generation: int) -> bool:
        """No `restart` since `open_at` said `generation`: what was read meanwhile was servable."""
        with self._lock:
            return generation == self._generation


class Arrivals:
    """The node's arriving blobs, by blob id; one per daemon (its fetcher produces, its HF endpoint reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[str, Arrival] = {}
        self._failed: dict[str, float] = {}
        self.closed = False
        """The agent is stopping: no reader waits any more."""

    def close(self) -> None:
        """End every stream now (the agent stops): a reader waiting on an arrival would otherwise hold its
        connection, and the server's shutdown, until the arrival's stall timeout."""
        with self._lock:
            self.closed = True
            current = list(self._current.values())
        for arrival in current:
            arrival.fail("the agent is stopping")

    def begin(self, blob_id: str, size: int, path: Path) -> Arrival:
        """A fresh arrival for a blob one producer starts fetching (its fetcher lock held)."""
        arrival = Arrival(blob_id, size, path)
        with self._lock:
            self._current[blob_id] = arrival
        return arrival

    def end(self, arrival: Arrival) -> None:
        """The producer is done with it (finished or failed); readers holding it keep it."""
        with self._lock:
            if self._current.get(arrival.blob_id) is arrival:
                del self._current[arrival.blob_id]
            now = time.monotonic()
            if arrival.state == "failed":
                self._failed[arrival.blob_id] = now
            for blob_id in [b for b, t in self._failed.items() if now - t > FAILED_MEMORY]:
                del self._failed[blob_id]

    def get(self, blob_id: str) -> Arrival | None:
        with self._lock:
            return self._current.get(blob_id)

    def failed_recently(self, blob_id: str) -> bool:
        """A stream of this blob was cut after a failed check not long ago (so a ranged request may be
        a client resuming after bad bytes)."""
        with self._lock:
            t = self._failed.get(blob_id)
            return t is not None and time.monotonic() - t <= FAILED_MEMORY
