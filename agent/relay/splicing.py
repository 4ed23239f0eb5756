"""A relayed blob's bytes from the socket into its file inside the kernel: `os.splice` through a pipe, so
they are never copied into the receiver's memory and out again (the receiver hashes them from a
read-only map of the file).

What it saves depends on the memory and the file system (benchmarks.md, "The relay: seed and
receiver" and "The receiver's way with the bytes"). Into ext4, written from a buffer, the receiver
cost far more into memory as this VM leaves it after other work, and the same into pages freed a
moment before; spliced, it cost about the same either way. On tmpfs splicing saved less than the
hash's read of the pages from the page cache then cost, so a file on tmpfs is written from a buffer
(`worth_splicing`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import sys
import termios
import time
from pathlib import Path

_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032
_TMPFS = {"tmpfs", "ramfs"}


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
    """Up to `capacity` bytes on their way from the socket `sock` to a file (one stream's; `close` it);
    `stall` seconds without a byte from the socket is a TimeoutError."""

    def __init__(self, sock: socket.socket, want: int, stall: float) -> None:
        self.source, self.sock, self.stall = sock, sock.fileno(), stall
        self.r, self.w = os.pipe()
        try:
            fcntl.fcntl(self.w, _F_SETPIPE_SZ, want)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the pipe's own size, a batch is smaller
        self.capacity: int = fcntl.fcntl(self.w, _F_GETPIPE_SZ)
        self.held = 0
        self.heard = time.monotonic()
        self._room = select.poll()
        self._room.register(self.sock, select.POLLIN)
        self._low = 1  # the kernel's SO_RCVLOWAT until a fill waits

    def fill(self, most: int, wait: float) -> int | None:
        """Of the `most` bytes the stream has left to send, what the socket has and the pipe takes: their
        count, 0 at the stream's end, None when the pipe takes no more or no byte came within `wait`
        seconds (`drain` it, if it holds any). A pipe holds `capacity` bytes at most, and fewer when the
        socket hands it pieces smaller than a page (each takes a page's slot).

        When the socket has nothing, the call waits for a pipe's worth of bytes (or the rest of the
        stream, if less), `wait` seconds at most (SO_RCVLOWAT: the kernel wakes the poll only then): a
        receiver that keeps up with a paced source otherwise turns its loop for every few segments."""
        take = min(most, self.capacity - self.held)
        if take <= 0:
            return None  # a splice of nothing would read as the stream's end
        n = self._splice(take)
        if n is None:
            if self.held and self._queued():
                return None  # the socket has bytes and the pipe no slot for them
            # A whole pipe's worth, or the rest of the stream when it is less: the same value from wait to
            # wait until the stream's last pipe's worth, so the option is set about once a stream.
            low = min(self.capacity, most)
            if low != self._low:
                self.source.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, low)
                self._low = low
            ready = bool(self._room.poll(max(0.0, wait) * 1000))
            n = self._splice(take)
            if n is None:
                if ready and not self.held:
                    raise OSError(errno.EIO, "an empty pipe takes nothing from a socket that has bytes")
                if not ready and time.monotonic() - self.heard > self.stall:
                    raise TimeoutError(f"no byte for {self.stall:.0f}s")
                return None  # the socket has bytes and the pipe no room, or the wait ran out
        self.held += n
        self.heard = time.monotonic()
        return n

    def _queued(self) -> int:
        """Bytes waiting in the socket (whatever its SO_RCVLOWAT)."""
        return int.from_bytes(fcntl.ioctl(self.sock, termios.FIONREAD, bytes(4)), sys.byteorder, signed=True)

    def _splice(self, take: int) -> int | None:
        try:
            return os.splice(self.sock, self.w, take, flags=os.SPLICE_F_NONBLOCK)
        except BlockingIOError:
            return None

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
