"""agent.relay.batches on real loopback TCP: a batch a read, what came when the wait runs out, a quiet
source given up after the stall, the stream's end, and a source that sends more or in dribbles."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent.relay.batches import BatchReader

MiB = 1 << 20


@contextlib.contextmanager
def connected(send: Callable[[socket.socket], None]) -> Iterator[socket.socket]:
    """The receiving end of a loopback connection whose other end `send` writes to on a thread (and
    closes when `send` returns)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        done = threading.Event()

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with contextlib.suppress(OSError):  # a receiver that takes less closes on the rest
                    send(conn)
                done.wait(30)  # the receiver says when the connection may go

        sender = threading.Thread(target=serve, daemon=True)
        sender.start()
        try:
            with socket.create_connection(server.getsockname()) as sock:
                yield sock
        finally:
            done.set()
            sender.join(30)


def data(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


def test_a_batch_sent_in_pieces_comes_in_one_read():
    payload = data(MiB)

    def send(conn):
        for i in range(0, MiB, 64 << 10):
            conn.sendall(payload[i : i + (64 << 10)])
            time.sleep(0.005)

    with connected(send) as sock:
        view = memoryview(bytearray(MiB))
        assert BatchReader(sock, within=10, stall=30).read_into(view) == MiB
        assert view == payload


def test_a_wait_that_runs_out_returns_what_came_then_none():
    with connected(lambda conn: conn.sendall(b"x" * 1000)) as sock:
        reader = BatchReader(sock, within=0.05, stall=30)
        view = memoryview(bytearray(MiB))
        first = None
        for _ in range(600):  # a loaded machine may send them after a wait or two
            first = reader.read_into(view)
            if first is not None:
                break
        assert first == 1000
        assert reader.read_into(view) is None  # nothing more came within the wait; not the end


def test_a_quiet_source_is_given_up_after_the_stall():
    with connected(lambda conn: None) as sock:
        reader = BatchReader(sock, within=0.05, stall=0.3)
        view = memoryview(bytearray(1024))
        with pytest.raises(TimeoutError, match="no byte"):
            for _ in range(1000):  # about 6 waits run out first
                assert reader.read_into(view) is None


def test_the_end_of_the_stream_reads_zero():
    def send(conn):
        conn.sendall(b"0123456789")
        conn.shutdown(socket.SHUT_WR)

    with connected(send) as sock:
        reader = BatchReader(sock, within=10, stall=30)
        view = memoryview(bytearray(MiB))
        assert reader.read_into(view) == 10  # the end comes before the batch is full or the wait is up
        assert bytes(view[:10]) == b"0123456789"
        assert reader.read_into(view) == 0


def test_a_source_sending_more_than_asked_gives_no_more_than_the_view_holds():
    payload = data(2 * MiB)
    with connected(lambda conn: conn.sendall(payload)) as sock:
        reader = BatchReader(sock, within=10, stall=30)
        first, rest = memoryview(bytearray(100_000)), memoryview(bytearray(MiB))
        assert reader.read_into(first) == 100_000
        assert reader.read_into(rest) == MiB
        assert bytes(first) + bytes(rest) == payload[: 100_000 + MiB]


def test_a_dribbling_source_costs_a_read_a_wait_not_a_read_a_segment():
    segments = 200

    def send(conn):
        for _ in range(segments):
            conn.sendall(b"y" * 100)
            time.sleep(0.001)
        conn.shutdown(socket.SHUT_WR)

    with connected(send) as sock:
        within = 0.05
        reader = BatchReader(sock, within=within, stall=30)
        view = memoryview(bytearray(MiB))
        got, reads, started = 0, 0, time.monotonic()
        while reads < 10 * segments:
            n = reader.read_into(view[got:])
            reads += 1
            if n == 0:
                break
            got += n or 0
        took = time.monotonic() - started
    assert got == segments * 100
    # Each read returns when its wait runs out (or at the end): a segment a read would be 200 reads.
    assert reads <= 2 + took / within, f"{reads} reads in {took:.2f}s"
