"""A relayed blob's bytes from the socket into its file inside the kernel: `os.splice` through a pipe, so
they are never copied into the receiver's memory and out again (the receiver hashes them from a
read-only map of the file).

What it saves depends on the memory and the file system. A 1-GiB shard relayed between two agents on
loopback into ext4 (`bench.relay_cpu --no-prime`): the receiver 1.19 CPU-s against 3.86 written from a
buffer, into memory as this VM leaves it after other work; into pages freed a moment before (primed)
the two ways cost the same (1.26-1.41 against 1.36-1.37). Its receiving thread alone
(`bench.receive_cost`, with the sha256): spliced 0.94-1.27 a GiB in every run on ext4, written from a
buffer 1.02 at best and up to 3.6. On tmpfs splicing saved less than the hash's read of the pages from
the page cache then cost (1.35-1.39 against 1.25-1.26), so a file on tmpfs is written from a buffer
(`worth_splicing`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
from pathlib import Path

_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032
_TMPFS = {"tmpfs", "ramfs"}
_RETRIES = 10_000
"""Splices a `fill` tries: each after the socket said it has bytes (a bound, not a wait)."""


def worth_splicing(path: Path) -> bool:
    """Whether a file at `path` takes spliced bytes for less CPU than buffered writes (not on tmpfs)."""
    return hasattr(os, "splice") and mount_type(path) not in _TMPFS


def mount_type(path: Path) -> str:
    """The type of the file system holding `path` (the longest mount point above it); "" if unknown."""
    target = os.path.realpath(path)
    best, kind = -1, ""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best:
                    best, kind = len(point), fields[2]
    except OSError:
        return ""
    return kind


class Pipe:
    """Up to `capacity` bytes on their way from a socket to a file (one stream's; `close` it)."""

    def __init__(self, want: int) -> None:
        self.r, self.w = os.pipe()
        try:
            fcntl.fcntl(self.w, _F_SETPIPE_SZ, want)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the pipe's own size, a batch is smaller
        self.capacity: int = fcntl.fcntl(self.w, _F_GETPIPE_SZ)
        self.held = 0

    def fill(self, sock: int, most: int, stall: float) -> int | None:
        """Up to `most` bytes of what the non-blocking socket `sock` has (waiting for some up to `stall`
        seconds) into the pipe: their count, 0 at the stream's end, None when the pipe takes no more
        (`drain` it). A pipe holds `capacity` bytes at most, and fewer when the socket hands it pieces
        smaller than a page (each takes a page's slot). TimeoutError when no byte came."""
        take = min(most, self.capacity - self.held)
        if take <= 0:
            return None  # a splice of nothing would read as the stream's end
        room = select.poll()
        room.register(sock, select.POLLIN)
        for _ in range(_RETRIES):
            try:
                n = os.splice(sock, self.w, take, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                if self.held and room.poll(0):
                    return None  # the socket has bytes and the pipe no room (or they came just now)
                if not room.poll(stall * 1000):
                    raise TimeoutError(f"no byte for {stall:.0f}s") from None
                continue  # bytes came after the splice looked
            self.held += n
            return n
        raise OSError(errno.EIO, "an empty pipe takes nothing from a socket that has bytes")

    def drain(self, fd: int, offset: int) -> int:
        """All the pipe holds into `fd` from `offset` on (a blocking write): the count."""
        done = 0
        while self.held:
            n = os.splice(self.r, fd, self.held, offset_dst=offset + done)
            if not n:
                raise OSError(errno.EIO, "the pipe gave nothing to write")
            done += n
            self.held -= n
        return done

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)
