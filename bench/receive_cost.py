"""What taking a blob off a socket costs this machine, by the way the bytes go: the floor under the relay
receiver's CPU per GiB (`bench.relay_cpu`), and the ways around its copy that were measured.

One process, loopback: a thread sends a file of --size MiB (in the page cache) with `sendfile`; the
receiving thread takes it one of these ways, and its CPU seconds (`time.thread_time`: user + system) are
what a row counts. Each way, every round, in an order that alternates; each hashed result is checked
against the file's sha256.

  recv                  into one 1-MiB buffer, nothing else (the socket's copy)
  recv+sha256           the same, each buffer hashed
  recv+write+sha256     each buffer written into a new file and hashed, a `recv` for what the socket has
  polled+write+sha256   the same from a socket with a timeout, polled before each `recv`: how the relay
                        receiver read into its buffer before
  batch+write+sha256    the same, a buffer per `recv` (MSG_WAITALL): the relay receiver's way into a file
                        on tmpfs (agent.relay.batches)
  mmap+sha256           received straight into a shared map of the new file (64-MiB windows, populated
                        up front, the file reserved with posix_fallocate), hashed from the map
  splice+sha256         socket -> pipe -> file in the kernel, a pipe's worth a wait (SO_RCVLOWAT), hashed
                        from a read-only map: the relay receiver's way into a file that is not on tmpfs
                        (agent.relay.splicing)

--rate paces the sender, as a shaped link or a source that relays as it receives does: then a `recv` for
what the socket has brings a few segments, and the receiver's loop turns many times a MiB.

Where the file lives matters: --dir is a tmpfs by default (bench.swarm's caches), where a write is the
copy into fresh pages, dear on this VM (`bench.page_cost`).

Usage:
  .venv/bin/python -m bench.receive_cost
  .venv/bin/python -m bench.receive_cost --size 1024 --runs 5 --dir /dev/shm
  .venv/bin/python -m bench.receive_cost --size 512 --runs 5 --rate 120
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.relay.batches import BatchReader
from agent.relay.splicing import Pipe

_BUF = 1 << 20
_WITHIN = 0.02
"""Seconds the relay receiver lets received bytes wait before it writes them (agent.relay.receiver)."""
_WINDOW = 64 << 20
_PACE = 64 << 10
"""Bytes a paced sender sends at once (--rate)."""


def _recv(
    sock: socket.socket, size: int, dst: Path, hasher: hashlib._Hash | None, write: bool, polled: bool = False
) -> int:
    view = memoryview(bytearray(_BUF))
    if polled:
        sock.settimeout(60)  # Python then polls the socket before each recv
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if write else -1
    got = 0
    try:
        while got < size:
            held = 0
            while held < _BUF and got + held < size:
                n = sock.recv_into(view[held : min(_BUF, size - got)])
                if not n:
                    return got + held
                held += n
            if write:
                os.pwrite(fd, view[:held], got)
            if hasher is not None:
                hasher.update(view[:held])
            got += held
    finally:
        if write:
            os.close(fd)
    return got


def _batches(sock: socket.socket, size: int, dst: Path, hasher: hashlib._Hash) -> int:
    """The relay receiver's way into a file on tmpfs (agent.relay.batches): a buffer a `recv`."""
    view = memoryview(bytearray(_BUF))
    reader = BatchReader(sock, within=_WITHIN, stall=60)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    got = 0
    try:
        while got < size:
            n = reader.read_into(view[: min(_BUF, size - got)])
            if n == 0:
                break
            if n:
                os.pwrite(fd, view[:n], got)
                hasher.update(view[:n])
                got += n
    finally:
        os.close(fd)
    return got


def _mmap(sock: socket.socket, size: int, dst: Path, hasher: hashlib._Hash) -> int:
    fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    got = 0
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)  # a page of a map past the disk's room would be a SIGBUS
        while got < size:
            span = min(_WINDOW, size - got)
            flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
            with mmap.mmap(fd, span, flags=flags, offset=got) as window:
                view = memoryview(window)
                try:
                    held = 0
                    while held < span:
                        n = sock.recv_into(view[held : min(span, held + _BUF)])
                        if not n:
                            return got + held
                        hasher.update(view[held : held + n])
                        held += n
                finally:
                    view.release()
            got += span
    finally:
        os.close(fd)
    return got


def _splice(sock: socket.socket, size: int, dst: Path, hasher: hashlib._Hash) -> int:
    """The relay receiver's way into a file off tmpfs (agent.relay.splicing): a pipe that waits for a
    pipe's worth (or `_WITHIN`), a map to hash from; the socket non-blocking, as the receiver's is."""
    sock.settimeout(60)
    fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    pipe = Pipe(sock, _BUF, stall=60)
    got = 0
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as whole:
            view = memoryview(whole)
            try:
                while got < size:
                    n = pipe.fill(size - got - pipe.held, wait=_WITHIN)
                    if n == 0:
                        break
                    if pipe.held and (n is None or pipe.held >= pipe.capacity or got + pipe.held == size):
                        moved = pipe.drain(fd, got)
                        hasher.update(view[got : got + moved])
                        got += moved
            finally:
                view.release()
    finally:
        pipe.close()
        os.close(fd)
    return got


Way = Callable[[socket.socket, int, Path], tuple[int, str | None]]


def _hashed(take: Callable[[socket.socket, int, Path, hashlib._Hash], int]) -> Way:
    def way(sock: socket.socket, size: int, dst: Path) -> tuple[int, str | None]:
        hasher = hashlib.sha256()
        return take(sock, size, dst, hasher), hasher.hexdigest()

    return way


WAYS: dict[str, Way] = {
    "recv": lambda s, n, p: (_recv(s, n, p, None, write=False), None),
    "recv+sha256": _hashed(lambda s, n, p, h: _recv(s, n, p, h, write=False)),
    "recv+write+sha256": _hashed(lambda s, n, p, h: _recv(s, n, p, h, write=True)),
    "polled+write+sha256": _hashed(lambda s, n, p, h: _recv(s, n, p, h, write=True, polled=True)),
    "batch+write+sha256": _hashed(_batches),
    "mmap+sha256": _hashed(_mmap),
    "splice+sha256": _hashed(_splice),
}


def one_transfer(src: Path, dst: Path, way: Way, rate: float = 0) -> tuple[float, int, str | None]:
    """(CPU seconds of the receiving thread, bytes taken, their sha256) of `src` sent over loopback (at
    `rate` bytes a second, in `_PACE` pieces; 0: as fast as loopback takes it)."""
    size = src.stat().st_size
    with socket.create_server(("127.0.0.1", 0)) as server:
        failure: list[BaseException] = []

        def send() -> None:
            try:
                conn, _ = server.accept()
                with conn, src.open("rb") as f:
                    if not rate:
                        conn.sendfile(f)
                        return
                    start, sent = time.monotonic(), 0
                    while sent < size:
                        n = os.sendfile(conn.fileno(), f.fileno(), sent, min(_PACE, size - sent))
                        if not n:
                            return  # the file ended early: the receiver reports the bytes short
                        sent += n
                        time.sleep(max(0.0, start + sent / rate - time.monotonic()))
            except OSError as exc:
                failure.append(exc)

        sender = threading.Thread(target=send, name="sender", daemon=True)
        sender.start()
        with socket.create_connection(server.getsockname()) as sock:
            # Blocking, as splice needs, with the kernel's own timeout on each read.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 60, 0))
            before = time.thread_time()
            got, digest = way(sock, size, dst)
            spent = time.thread_time() - before
        sender.join(60)
    dst.unlink(missing_ok=True)
    if failure:
        raise SystemExit(f"the sender failed: {failure[0]}")
    return spent, got, digest


def make_source(path: Path, size: int) -> str:
    """A file of `size` bytes (not one repeated block: the hash and the copies see real data); its sha256."""
    hasher = hashlib.sha256()
    with path.open("wb") as f:
        for i in range(0, size, _BUF):
            block = hashlib.shake_256(i.to_bytes(8, "big")).digest(min(_BUF, size - i))
            f.write(block)
            hasher.update(block)
    return hasher.hexdigest()


def measure(
    directory: Path, size: int, runs: int, ways: list[str], rate: float = 0
) -> dict[str, list[float]]:
    """CPU seconds per GiB of each way, one figure per run; every result checked against the source."""
    spent: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="ws-receive-cost-", dir=directory) as d:
        src, dst = Path(d) / "source", Path(d) / "received"
        digest = make_source(src, size)
        for i in range(runs):
            for name in ways[:: 1 if i % 2 == 0 else -1]:
                cpu, got, hashed = one_transfer(src, dst, WAYS[name], rate)
                if got != size or hashed not in (None, digest):
                    raise SystemExit(f"{name}: took {got} of {size} bytes, sha256 {hashed} against {digest}")
                spent[name].append(cpu / (size / 2**30))
    return spent


def print_table(spent: dict[str, list[float]], size: int, directory: Path, rate: float = 0) -> None:
    runs = len(next(iter(spent.values())))
    paced = f" at {rate / 1e6:g} MB/s" if rate else ""
    where = f"{size >> 20} MiB over loopback{paced} into {directory}"
    print(f"{where}; CPU-s per GiB of the receiving thread, {runs} runs")
    base = statistics.median(spent["recv+write+sha256"]) if "recv+write+sha256" in spent else None
    print("| way | median | min–max | ÷ recv+write+sha256 |")
    print("|---|---|---|---|")
    for name, figures in spent.items():
        m = statistics.median(figures)
        ratio = f"{m / base:.2f}" if base else "–"
        print(f"| {name} | {m:.2f} | {min(figures):.2f}–{max(figures):.2f} | {ratio} |")
    print("the relay receiver's target: <= 1.0 CPU-s per GiB (bench.relay_cpu)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="for the files (default /dev/shm)")
    ap.add_argument("--size", type=int, default=1024, help="MiB per transfer (default 1024)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each way (default 3)")
    ap.add_argument("--rate", type=float, default=0, help="MB/s the sender keeps to (default: unpaced)")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of: {', '.join(WAYS)}")
    args = ap.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown or not ways:
        raise SystemExit(f"unknown ways {unknown}; choose from {', '.join(WAYS)}")
    size = args.size << 20
    free = os.statvfs(args.dir).f_bavail * os.statvfs(args.dir).f_frsize
    if free < 3 * size:
        raise SystemExit(f"{args.dir} has {free >> 20} MiB free; --size {args.size} needs {3 * args.size}")
    rate = args.rate * 1e6
    print_table(measure(args.dir, size, args.runs, ways, rate), size, args.dir, rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
