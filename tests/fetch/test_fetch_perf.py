"""The fetch engine's fast paths keep their contracts.

- a standalone fetch hashes no BitTorrent pieces; the daemon's source (OriginSource's default)
  still does, and a later `agent publish` of the same content still yields the right torrent;
- bodies are read straight into worker buffers and the connections are still reused;
- the test hub's capped path (big sendfile steps) keeps its rate; a client dropping a
  keep-alive connection leaves no traceback on the hub's stderr.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import struct
import time

import httpx

from agent.cache.layout import RepoCache
from agent.core.hashing import BlobHasher
from agent.core.metainfo import PieceHasher, info_dict, infohash
from agent.core.progress import Progress
from agent.fetch.engine import FetchEngine, fetch_snapshot, plan_from_origin
from agent.fetch.publish import publish_directory
from agent.hub.server import HubServer
from agent.origin.kinds import open_origin
from agent.origin.ranges import OriginSource
from tests.support.fetchkit import REPO, MiB, model, settings_for, snapshot_contents
from tests.support.procs import loop_until


def _pieces(data: bytes, piece_length: int) -> bytes:
    ph = PieceHasher(piece_length)
    ph.update(data)
    return ph.digest()


def test_blob_hasher_without_pieces_gives_the_same_ids():
    data = hashlib.sha256(b"seed").digest() * (3 * MiB // 32) + b"tail"
    full, lean = BlobHasher(len(data), True), BlobHasher(len(data), True, pieces=False)
    for start in range(0, len(data), 777_777):  # block edges that do not align with pieces
        full.update(data[start : start + 777_777])
        lean.update(memoryview(data)[start : start + 777_777])
    a, b = full.finish(), lean.finish()
    assert a.content_id == b.content_id == hashlib.sha256(data).hexdigest()
    assert (a.xxh3, a.size, a.piece_length) == (b.xxh3, b.size, b.piece_length)
    assert a.pieces == _pieces(data, a.piece_length) and b.pieces == b""


def test_standalone_fetch_skips_pieces_daemon_source_keeps_them_publish_still_works(tmp_path):
    root = tmp_path / "origin"
    files = model(root, total=6 * MiB, shards=3)
    with HubServer(root) as srv:
        lean = settings_for(tmp_path / "standalone", srv.url)
        result = fetch_snapshot(lean, REPO)
        cache = RepoCache(lean.cache_dir, lean.state_dir, REPO)
        shards = [e for e in result.files if e.is_lfs]
        assert shards
        for e in shards:
            sidecar = cache.read_sidecar(e.blob_id)
            assert sidecar is not None and sidecar.pieces == b"" and sidecar.size == e.size

        # The daemon's path builds OriginSource with its default: piece hashes computed in the one pass.
        full = settings_for(tmp_path / "daemon", srv.url)
        client = open_origin(full.origin)
        try:
            plan = plan_from_origin(client, REPO, "main")
            FetchEngine(full, OriginSource(client, full.fetch), Progress(quiet=True)).run(plan)
        finally:
            client.close()
    full_cache = RepoCache(full.cache_dir, full.state_dir, REPO)
    expected: dict[str, str] = {}
    for e in shards:
        d = full_cache.read_sidecar(e.blob_id)
        assert d is not None and d.pieces == _pieces(files[e.path], d.piece_length)
        expected[e.path] = infohash(info_dict(e.blob_id, d.size, d.piece_length, d.pieces))

    # Publishing the standalone snapshot under the same repo id: the sidecars there have no
    # pieces, so publish must hash them itself and reach the very same torrents.
    # (A snapshot's entries link into the repo's blobs/: the cache is where they may point.)
    published = publish_directory(lean, result.snapshot_path, REPO, boundary=lean.cache_dir)
    got = {f["path"]: f["infohash"] for f in published.files if f["path"] in expected}
    assert got == expected


def test_fetch_reuses_connections_across_ranges(tmp_path):
    root = tmp_path / "origin"
    files = model(root, total=16 * MiB, shards=2)
    with HubServer(root) as srv:
        settings = settings_for(tmp_path, srv.url, chunk_size=1 * MiB, connections=2, files_at_once=2)
        result = fetch_snapshot(settings, REPO)
        ranged = [r for r in srv.requests if r.method == "GET" and r.range]
        accepted = srv.connections_accepted
    assert result.bytes_from_origin == sum(len(b) for b in files.values())
    assert len(ranged) >= 16
    # 2 files x 2 workers plus the API/metadata requests' connections; a client that dropped the
    # connection after each range would need one per range.
    assert accepted <= 2 * 2 + 4 < len(ranged), (accepted, len(ranged))


def test_small_files_do_not_wait_for_the_large_ones(tmp_path):
    """Every large-file slot taken (files_at_once=1, one shard that takes a while): the configs and
    tokenizer still come beside the shard, not after it. Behind the shards, 7 small files went one
    after another at the end of a swarm's cold start (bench.swarm: 4-7 s of 20)."""
    root = tmp_path / "origin"
    files = model(root, total=20 * MiB, shards=1)
    small = [p for p in files if len(files[p]) < MiB]
    assert len(small) >= 5, sorted(files)
    with HubServer(root, rate_per_connection=8 * MiB) as srv:
        result = fetch_snapshot(settings_for(tmp_path, srv.url, connections=1, files_at_once=1), REPO)
        gets = [r for r in srv.requests if r.method == "GET" and r.bucket != "api"]
    assert snapshot_contents(result.snapshot_path) == files
    # Requests are recorded as answered: the shard's twenty 1-MiB ranges at 8 MiB/s take 2.5 s.
    last_small = max(i for i, r in enumerate(gets) if r.path.endswith(tuple(small)))
    last_range = max(i for i, r in enumerate(gets) if r.bucket == "cdn")  # the shard's CDN URL
    assert last_small < last_range, gets


def test_capped_sends_keep_the_rate_with_big_steps(tmp_path):
    root = tmp_path / "origin"
    files = model(root, total=24 * MiB, shards=1)
    shard = next(p for p in files if p.endswith(".safetensors"))
    rate = 16 * MiB  # steps are 1/100 s of the rate, at most 256 KiB: the largest step size
    with HubServer(root, rate_per_connection=rate) as srv, httpx.Client() as client:
        with client.stream("GET", f"{srv.url}/{REPO}/resolve/main/{shard}", follow_redirects=True) as resp:
            assert resp.status_code == 200
            got = 0
            started = time.monotonic()
            for chunk in resp.iter_raw(1 << 20):
                got += len(chunk)
            elapsed = time.monotonic() - started
    body = len(files[shard])
    assert got == body
    measured = body / elapsed
    # Never above the cap (a busy machine only slows the reader), and not far below it: the lower
    # bound leaves room for a loaded 2-core machine yet catches a sender that sleeps too long per step.
    assert 0.5 * rate <= measured <= 1.15 * rate, f"{measured / MiB:.1f} MiB/s vs cap {rate / MiB:.0f}"


def test_client_reset_on_keepalive_connection_logs_no_traceback(tmp_path, capfd, caplog):
    root = tmp_path / "origin"
    model(root, total=1 * MiB, shards=1)
    caplog.set_level(logging.DEBUG, logger="agent.hub.server")
    with HubServer(root) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(f"GET /api/models/{REPO}/revision/main HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        _read_whole_response(sock)
        # The server now waits in its keep-alive read of the next request. RST instead of FIN:
        # that read fails with ECONNRESET, as when a download client is killed.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        loop_until(
            lambda: any("went away" in r.getMessage() for r in caplog.records), 10, what="the debug line"
        )
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err


def _read_whole_response(sock: socket.socket) -> None:
    """Read one response to its last body byte, so a reset cannot land while the server still writes."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the response headers"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(int(ln.split(b":", 1)[1]) for ln in lines if ln.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the end of the body"
        body += chunk
