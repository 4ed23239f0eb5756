"""agent.relay.splicing: bytes from a real loopback TCP socket into a file through a pipe (a pipe's worth a
wait when the source is slower than the receiver), and the file system probe that decides whether a
receiver splices."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.relay.splicing import Pipe, mount_type, worth_splicing

MiB = 2**20


@pytest.fixture
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(sender, receiver): a loopback TCP connection, the receiver non-blocking as a timed socket is."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
    receiver.settimeout(5)
    with sender, receiver:
        yield sender, receiver


def df_type(path: Path) -> str:
    """The file system type `df` reports for `path`: a check independent of /proc/self/mounts parsing."""
    out = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def test_the_probe_names_the_file_system_as_df_does(tmp_path):
    nested = tmp_path / "a dir" / "deeper"
    nested.mkdir(parents=True)
    assert mount_type(nested) == df_type(tmp_path)
    assert worth_splicing(nested) == (df_type(tmp_path) not in ("tmpfs", "ramfs"))
    shm = Path("/dev/shm")
    if not shm.is_dir() or df_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    assert mount_type(shm) == "tmpfs"
    assert not worth_splicing(shm)


def test_a_pipe_moves_a_stream_into_the_file_at_its_offset_and_sees_its_end(tmp_path, connected):
    sender, receiver = connected
    data = hashlib.shake_256(b"spliced").digest(3 * MiB + 12345)

    def send() -> None:
        sender.sendall(data)
        sender.shutdown(socket.SHUT_WR)

    threading.Thread(target=send, daemon=True).start()
    path = tmp_path / "blob"
    head = b"already here"  # an earlier stream's bytes: the pipe writes after them, not over them
    path.write_bytes(head)
    fd = os.open(path, os.O_RDWR)
    pipe = Pipe(receiver, MiB, stall=5)
    try:
        assert pipe.capacity >= 64 * 1024
        pos = len(head)
        while True:
            got = pipe.fill(pipe.capacity, wait=5)
            if not got:
                break
            assert pipe.held == got <= pipe.capacity
            assert pipe.drain(fd, pos) == got and pipe.held == 0
            pos += got
    finally:
        pipe.close()
        os.close(fd)
    assert path.read_bytes() == head + data


def test_a_pipe_takes_no_more_than_asked_and_gives_up_on_a_quiet_socket(tmp_path, connected):
    sender, receiver = connected
    sender.sendall(b"x" * 10_000)  # more than asked for: the rest stays in the socket
    fd = os.open(tmp_path / "blob", os.O_RDWR | os.O_CREAT, 0o600)
    pipe = Pipe(receiver, MiB, stall=0.3)
    try:
        taken = 0
        while taken < 4096:
            taken += pipe.fill(4096 - taken, wait=5) or 0
        assert taken == pipe.held == 4096
        assert pipe.drain(fd, 0) == 4096
        assert receiver.recv(20_000) == b"x" * (10_000 - 4096)
        assert pipe.fill(0, wait=5) is None  # no room asked for: not the stream's end
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            for _ in range(100):  # connected, sending nothing: each wait runs out, then the stall
                assert pipe.fill(4096, wait=0.05) is None
        assert 0.25 < time.monotonic() - started < 5
    finally:
        pipe.close()
        os.close(fd)
    assert (tmp_path / "blob").read_bytes() == b"x" * 4096


def test_a_pipe_full_of_small_pieces_says_so_and_takes_the_rest_once_drained(tmp_path, connected):
    """Each piece the socket hands over takes a page's slot in the pipe: small ones fill it long before its
    byte capacity, and a socket with bytes must then not be polled in a loop (a receiver hung that way)."""
    sender, receiver = connected
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(200):
        sender.send(bytes([i]) * 100)
        time.sleep(0.0005)  # one segment each
    fd = os.open(tmp_path / "blob", os.O_RDWR | os.O_CREAT, 0o600)
    pipe = Pipe(receiver, 64 * 1024, stall=5)
    answers: list[int | None] = []
    pos = 0
    started = time.monotonic()
    try:
        while len(answers) < 1000 and (not answers or answers[-1] != 0):
            answers.append(pipe.fill(pipe.capacity, wait=2))
            if answers[-1] is None or answers[-1] == 0:
                pos += pipe.drain(fd, pos)
            if pos + pipe.held == 20_000:
                sender.shutdown(socket.SHUT_WR)  # the end, once all of it is taken: no earlier wake-up
        took = time.monotonic() - started
    finally:
        pipe.close()
        os.close(fd)
    assert None in answers, f"the pipe never filled up: {answers}"
    assert answers[-1] == 0 and pos == 20_000
    assert took < 1.5, "a full pipe is to be drained at once, not after a wait"
    assert (tmp_path / "blob").read_bytes() == b"".join(bytes([i]) * 100 for i in range(200))


def test_a_source_slower_than_the_receiver_fills_the_pipe_in_a_wait_or_two(tmp_path, connected):
    """A paced source: the stream's 1 MiB in 16 sends 5 ms apart, the first already there. Each fill that
    finds the socket empty waits for a pipe's worth or, holding some, for the rest of the stream, so the
    MiB comes in a few fills, not one per send, and as soon as its last send."""
    sender, receiver = connected
    data = hashlib.shake_256(b"paced").digest(MiB)
    piece = 64 * 1024
    sender.sendall(data[:piece])
    pipe = Pipe(receiver, MiB, stall=5)
    while not pipe._queued():
        time.sleep(0.001)

    def send() -> None:
        for i in range(piece, MiB, piece):
            time.sleep(0.005)
            sender.sendall(data[i : i + piece])

    threading.Thread(target=send, daemon=True).start()
    fd = os.open(tmp_path / "blob", os.O_RDWR | os.O_CREAT, 0o600)
    fills = pos = 0
    started = time.monotonic()
    try:
        while pos + pipe.held < MiB and fills < 100:
            fills += 1
            if pipe.fill(MiB - pos - pipe.held, wait=5) is None or pipe.held >= pipe.capacity:
                pos += pipe.drain(fd, pos)
        pos += pipe.drain(fd, pos)
        took = time.monotonic() - started
    finally:
        pipe.close()
        os.close(fd)
    assert (tmp_path / "blob").read_bytes() == data
    assert fills <= 4, f"{fills} fills for 16 sends"
    assert took < 2.5, "the rest of the stream wakes the fill; it does not wait for a pipe's worth"


@pytest.mark.parametrize(("most", "wait", "woken"), [(MiB, 1.5, False), (100, 5.0, True)])
def test_a_fill_waits_for_what_it_would_take_and_at_most_its_wait(connected, most, wait, woken):
    """100 bytes come 0.3 s into the fill. Fewer bytes than a pipe's worth wake no poll: the fill takes them
    when its wait runs out. At a stream's end (`most`, what is left, is 100) the fill is woken by them."""
    sender, receiver = connected
    pipe = Pipe(receiver, MiB, stall=30)
    try:
        threading.Timer(0.3, sender.sendall, (b"y" * 100,)).start()
        started = time.monotonic()
        got = None
        for _ in range(50):  # a loaded machine may send them late
            got = pipe.fill(most, wait=wait)
            if got is not None:
                break
        took = time.monotonic() - started
        assert got == 100
        assert took < wait - 1 if woken else took >= wait - 0.1
    finally:
        pipe.close()
