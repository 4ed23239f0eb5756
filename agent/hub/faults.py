"""Injected faults and bandwidth caps for the test hub.

`Faults` is a plain mutable object that tests set between requests; the server takes
from it under its lock, so the one-shot faults (status_queue, truncate_times, ...) are
consumed exactly once each even with parallel connections.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Faults:
    """Faults for file requests (`/resolve/...`, `/api/resolve-cache/...` and the CDN's, GET and HEAD),
    and for any route by path."""

    status_queue: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    """Answer the next N file requests with these (status, headers) and a JSON error body, then normal."""

    status_methods: frozenset[str] = frozenset({"GET", "HEAD"})
    """Which methods take from status_queue (e.g. {"GET"} to let metadata HEADs through)."""

    ignore_range: bool = False
    """Answer 200 with the whole body even when a Range was asked (as some proxies do)."""

    head_without_length: bool = False
    """Answer a file's HEAD (resolve, resolve-cache, CDN) with no Content-Length, as some mirrors and
    proxies do: a client must then learn the size from the GET (or the listing), not fail."""

    truncate_after: int | None = None
    """Declare the full Content-Length but drop the connection after this many body bytes."""

    truncate_times: int = 1
    """How many responses truncate_after applies to; each truncated body consumes one."""

    corrupt: bool = False
    """Flip the first byte of every file body (so any hash of what was served mismatches)."""

    corrupt_paths: set[str] = field(default_factory=set)
    """Like corrupt, only for these repo file paths or sha256 blob ids."""

    corrupt_times: int | None = None
    """How many bodies to corrupt; None = every one."""

    stall_seconds: float = 0.0
    """Pause this long mid-body (after stall_after bytes) to trigger a client's read timeout."""

    stall_after: int = 0
    """Body bytes sent before the stall."""

    stall_times: int = 1
    """How many responses stall."""

    range_stalls: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Bodies that end at this byte (each request for the rest of one chunk: the first, a hedge) stall in
    turn, one (bytes sent first, seconds) each in the order they are asked for; later ones run."""

    slow_rate: float = 0.0
    """Send the next file bodies at this many bytes/s: one flow slow beside fast ones (a connection
    that got a small share of a shaped, shared link)."""

    slow_times: int = 1
    """How many bodies go at slow_rate."""

    range_slow: dict[int, float] = field(default_factory=dict)
    """The next body that ends at this byte (the first request for a chunk, or one for its rest) goes at
    this many bytes/s: a slow flow on a chunk other than the first."""

    path_status: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    """Answer every request for these paths (exact, without the query string) with (status, headers)
    and a JSON error body until removed: e.g. a 307 with a `Location`, as a hub behind a proxy may."""

    model_info_omit: set[str] = field(default_factory=set)
    """Fields left out of every model info document (a hub, mirror or proxy that does not send them)."""

    claimed_sizes: dict[str, int] = field(default_factory=dict)
    """Files (by repo path) whose size the hub states as this everywhere (listings, X-Linked-Size,
    Content-Length, Content-Range) while it sends only the bytes it has and then closes the connection:
    an origin that lies about a length."""

    answer_bytes: int | None = None
    """Every body of a file in `claimed_sizes` carries at most this many bytes (from wherever its range
    starts), then the connection closes: an origin that lists a large file and sends a little more on
    every answer, so that no two answers end at the same byte."""

    streams_per_file: int = 0
    """The CDN's streams of one file to one client address at once (0: any number). One more is refused
    with `streams_answer`, as the Hub's download host was reported (2026) to refuse "multi-threaded download
    acceleration": a second concurrent range of one file from one address gets a 403, while
    huggingface_hub, one stream per file, is served (huggingface/huggingface_hub#2658: "there will still be
    1 connection per file"). Similar hosts answer aria2c's `-x 16` with 403s (caru-ini/modal-comfyui#11, a
    CDN in 2026; alexhua/Aria2-Explorer#186, a host allowing one connection) or, as mirrors do, 429s
    (huggingface/huggingface_hub#2936)."""

    streams_answer: str = "403"
    """How a stream past `streams_per_file` is refused: "403" (CloudFront's "Request blocked" page), "429",
    or "reset" (the connection closed without an answer)."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reset(self) -> None:
        """Back to no faults at all."""
        with self._lock:
            fresh = Faults()
            for name in self.__dataclass_fields__:
                if name != "_lock":
                    setattr(self, name, getattr(fresh, name))

    def take_status(self, method: str) -> tuple[int, dict[str, str]] | None:
        with self._lock:
            if self.status_queue and method in self.status_methods:
                return self.status_queue.pop(0)
            return None

    def path_fault(self, path: str) -> tuple[int, dict[str, str]] | None:
        with self._lock:
            fault = self.path_status.get(path)
            return (fault[0], dict(fault[1])) if fault is not None else None

    def take_truncate(self) -> int | None:
        with self._lock:
            if self.truncate_after is None or self.truncate_times <= 0:
                return None
            self.truncate_times -= 1
            return self.truncate_after

    def take_corrupt(self, names: tuple[str, ...]) -> bool:
        with self._lock:
            hit = self.corrupt or any(n in self.corrupt_paths for n in names)
            if not hit or (self.corrupt_times is not None and self.corrupt_times <= 0):
                return False
            if self.corrupt_times is not None:
                self.corrupt_times -= 1
            return True

    def take_stall(self, last: int) -> tuple[int, float] | None:
        """The stall of a body whose last byte is `last`, if any."""
        with self._lock:
            queued = self.range_stalls.get(last)
            if queued:
                return queued.pop(0)
            if self.stall_seconds <= 0 or self.stall_times <= 0:
                return None
            self.stall_times -= 1
            return self.stall_after, self.stall_seconds

    def take_slow(self, last: int) -> TokenBucket | None:
        """The bucket of a body whose last byte is `last`, if it goes slow."""
        with self._lock:
            rate = self.range_slow.pop(last, 0.0)
            if rate > 0:
                return TokenBucket(rate)
            if self.slow_rate <= 0 or self.slow_times <= 0:
                return None
            self.slow_times -= 1
            return TokenBucket(self.slow_rate)


class TokenBucket:
    """Bytes per second with a small burst, shared by any number of threads.

    A sender reserves what it is about to send and sleeps off the debt, so the long-run
    rate is exact regardless of how many threads share the bucket; the burst (1/50 s of
    rate, at least one chunk) bounds the error at the start of a transfer.
    """

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive bytes/s: {rate}")
        self.rate = rate
        self.capacity = burst if burst is not None else max(rate / 50, 16 * 1024)
        self._tokens = self.capacity
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            debt = -self._tokens
        if debt > 0:
            time.sleep(debt / self.rate)


def chunk_for(rate: float | None) -> int:
    """Write size for a throttled body: 1/100 s of the cap (smooth), at most 256 KiB (cheap).

    At 40 MB/s per connection that is 160 sendfile + sleep rounds per second per connection
    rather than ~600 with 64 KiB steps: the test origin, shared by every tool in the benchmark,
    takes less of a 2-core machine. The bucket's burst (1/50 s of rate) stays above one step.
    """
    if rate is None:
        return 256 * 1024
    return int(min(256 * 1024, max(1024, rate / 100)))
