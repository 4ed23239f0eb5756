"""agent.cache.arrivals: what a reader of a blob still arriving may be served, on real files."""

from __future__ import annotations

import os
from pathlib import Path

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.stream import parse_range


def arriving(tmp_path: Path, data: bytes) -> Arrival:
    path = tmp_path / "blob.incomplete"
    path.write_bytes(data)
    return Arrivals().begin("ab" * 32, len(data), path)


def test_only_the_announced_prefix_is_served_and_never_the_last_byte_before_the_blob_is_installed(tmp_path):
    data = os.urandom(1000)
    a = arriving(tmp_path, data)
    assert a.read(0, 100) == b""  # nothing announced yet, though the file has bytes
    a.advance(400)
    assert a.read(0, 1000) == data[:400]
    assert a.read(400, 10) == b""
    a.advance(1000)
    assert a.read(0, 1000) == data[:999]  # the last byte waits for the end-to-end check
    final = tmp_path / "blob"
    os.replace(a.path, final)
    assert a.read(990, 10) == b""  # renamed while finishing: asked again
    a.finish(final)
    assert a.read(990, 10) == data[990:]


def test_a_reader_that_checks_the_blob_itself_gets_the_last_byte_once_it_is_written(tmp_path):
    """Another agent over the relay hashes the whole blob itself: it need not wait for this node's check
    and install (a chain of relays waited for each node's in turn), and a restart still hides everything."""
    data = os.urandom(1000)
    a = arriving(tmp_path, data)
    a.advance(999)
    assert a.read(0, 1000, checked=True) == data[:999]  # not written yet
    a.advance(1000)
    assert a.read(0, 1000) == data[:999] and a.available(0) == 999  # an HF client still waits
    assert a.read(0, 1000, checked=True) == data and a.available(0, checked=True) == 1000
    a.restart()
    assert a.read(0, 1000, checked=True) == b"" and a.available(0, checked=True) == 0
    written = {0: 400, 600: 1000}  # in parts: the last part's end is the blob's
    a.extent = lambda pos: next((end for start, end in written.items() if start <= pos < end), pos)
    assert a.read(600, 1000) == data[600:999]
    assert a.read(600, 1000, checked=True) == data[600:]


def test_a_restart_hides_what_was_announced_until_the_new_producer_announces_it(tmp_path):
    old = os.urandom(500)
    a = arriving(tmp_path, old)
    a.advance(500)
    a.restart()  # e.g. libtorrent given up for the origin engine, which preallocates a fresh file
    a.path.write_bytes(b"\0" * 500)
    assert a.read(0, 500) == b""  # never the zeros of the new file
    new = os.urandom(500)
    a.path.write_bytes(new)
    a.advance(200)
    assert a.read(0, 500) == new[:200]


def test_a_failed_blob_is_remembered_and_serves_nothing_more(tmp_path):
    arrivals = Arrivals()
    path = tmp_path / "blob.incomplete"
    path.write_bytes(b"x" * 10)
    a = arrivals.begin("cd" * 32, 10, path)
    a.advance(5)
    a.fail("sha256 mismatch")
    a.advance(9)
    assert a.state == "failed" and a.read(0, 10) == b"xxxxx"
    assert not arrivals.failed_recently("cd" * 32)
    arrivals.end(a)
    assert arrivals.get("cd" * 32) is None
    assert arrivals.failed_recently("cd" * 32)


def test_ranges_as_a_server_may_read_them():
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=90-", 100) == (90, 100)
    assert parse_range("bytes=-10", 100) == (90, 100)
    assert parse_range("bytes=50-500", 100) == (50, 100)
    assert parse_range("bytes=100-", 100) == "unsatisfiable"
    assert parse_range("bytes=0-1,5-6", 100) is None  # several ranges: the whole file
    assert parse_range("items=0-1", 100) is None
    assert parse_range("bytes=x-", 100) is None


def test_a_blob_written_in_parts_serves_each_part_as_far_as_it_is_written_and_a_restart_forgets(tmp_path):
    """A producer that writes parts at once (agent.origin.ranges `Shares`) says how far from a position
    the file is written: past the prefix only that is served, still never the last byte before `finish`."""
    data = os.urandom(1000)
    a = arriving(tmp_path, data)
    written = {0: 100, 500: 700, 800: 1000}  # part start -> how far it is written
    a.extent = lambda pos: next((end for start, end in written.items() if start <= pos < end), pos)
    a.advance(100)
    assert a.read(0, 1000) == data[:100]
    assert a.read(100, 10) == b""  # the gap before the second part
    assert a.read(500, 1000) == data[500:700]
    assert a.read(650, 1000) == data[650:700]
    assert a.available(800) == 999 and a.read(800, 1000) == data[800:999]
    a.restart()
    assert a.read(500, 10) == b"" and a.extent is None
