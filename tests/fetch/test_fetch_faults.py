"""Bad input and a misbehaving origin: one clear error, nothing corrupt visible, only the failed file lost."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cache.layout import RepoCache
from agent.cli.main import main
from agent.core.errors import (
    EXIT_AUTH,
    EXIT_DISK,
    EXIT_INTEGRITY,
    EXIT_NOT_FOUND,
    AuthError,
    CacheError,
    IntegrityError,
    NotFoundError,
    OriginError,
    RateLimitedError,
    UnsafePathError,
)
from agent.core.progress import Progress
from agent.fetch.engine import fetch_snapshot
from agent.hub import server as hub_server
from agent.hub.server import HubServer
from agent.origin import hedging as origin_hedging
from agent.origin.hedging import SLOWER, WINDOW
from tests.support.fetchkit import (
    REPO,
    MiB,
    assert_one_line_error,
    fetch_args,
    file_requests,
    leftovers,
    model,
    repo_dir,
    served_model,
    settings_for,
    shards,
    snapshot_contents,
)
from tests.support.procs import loop_until

TOKEN = "hf_sekrit_TOKEN_0123456789"


@pytest.fixture
def origin(tmp_path):
    yield from ((srv, files) for srv, _, files in served_model(tmp_path))


def total(files: dict[str, bytes]) -> int:
    return sum(len(b) for b in files.values())


def cli(srv, tmp_path, *extra: str):
    return CliRunner().invoke(main, ["--log-level", "DEBUG", *fetch_args(srv.url, tmp_path, *extra)])


def test_unknown_repo_revision_and_file(tmp_path, origin):
    srv, _ = origin
    unknown = CliRunner().invoke(
        main, ["fetch", "org/nope", "--origin", srv.url, "--cache-dir", str(tmp_path / "h")]
    )
    assert_one_line_error(unknown, EXIT_NOT_FOUND, "org/nope", "not found")
    assert_one_line_error(
        cli(srv, tmp_path, "--revision", "no-such-branch"), EXIT_NOT_FOUND, "revision not found"
    )
    assert_one_line_error(cli(srv, tmp_path, "--include", "*.gguf"), EXIT_NOT_FOUND, "no file matches")
    assert not (tmp_path / "hub" / "models--org--tiny" / "snapshots").exists() or not any(
        (tmp_path / "hub" / "models--org--tiny" / "snapshots").iterdir()
    )


def test_invalid_repo_id_is_a_usage_error(tmp_path, origin):
    srv, _ = origin
    result = CliRunner().invoke(
        main, ["fetch", "../etc", "--origin", srv.url, "--cache-dir", str(tmp_path / "h")]
    )
    assert_one_line_error(result, 2, "invalid repo id")


def test_gated_repo_needs_a_valid_token_which_is_never_printed(tmp_path, caplog):
    root = tmp_path / "origin"
    files = model(root)
    caplog.set_level(logging.DEBUG)
    with HubServer(root, tokens=(TOKEN,), gated=(REPO,)) as srv:
        no_token = cli(srv, tmp_path)
        assert_one_line_error(no_token, EXIT_AUTH, "access refused", "--token")
        wrong = cli(srv, tmp_path, "--token", TOKEN[::-1])
        assert_one_line_error(wrong, EXIT_AUTH, "refused the token")
        ok = cli(srv, tmp_path, "--token", TOKEN)
        assert ok.exit_code == 0, ok.output
        assert snapshot_contents(Path(ok.stdout.strip().splitlines()[-1])) == files
        for result in (no_token, wrong, ok):
            assert TOKEN not in result.output and TOKEN[::-1] not in result.output
        assert TOKEN not in caplog.text and TOKEN[::-1] not in caplog.text
        with pytest.raises(AuthError):
            fetch_snapshot(settings_for(tmp_path / "x", srv.url), REPO)
        settings = settings_for(tmp_path / "y", srv.url, token=TOKEN, max_retries=1)
        assert TOKEN not in repr(settings)
        # A run that fails partway keeps its resume records (and the digests of the files it finished).
        srv.faults.status_methods = frozenset({"GET"})
        srv.faults.truncate_after = 300_000
        srv.faults.truncate_times = 100
        with pytest.raises(OriginError):
            fetch_snapshot(settings, REPO)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents]
    # Every kind of file a fetch leaves is looked at: blobs, resume records, digests, refs.
    for kind in ("blobs", "partials", "digests", "refs"):
        assert any(p.parent.name == kind or p.parent.parent.name == kind for p in written), (kind, written)
    for p in written:
        assert TOKEN.encode() not in p.read_bytes(), p


def test_429_retry_after_is_honoured_and_bounded(tmp_path, origin):
    srv, files = origin
    srv.faults.status_queue = [(429, {"Retry-After": "0.4"})] * 2
    t0 = time.monotonic()
    result = fetch_snapshot(settings_for(tmp_path, srv.url, files_at_once=1, connections=1), REPO)
    assert time.monotonic() - t0 >= 0.8  # one request at a time: both waits are in series
    assert snapshot_contents(result.snapshot_path) == files
    assert [r.status for r in srv.requests].count(429) == 2

    srv.faults.status_queue = [(429, {"Retry-After": "0"})] * 50
    t0 = time.monotonic()
    with pytest.raises(RateLimitedError, match="429"):
        fetch_snapshot(settings_for(tmp_path / "b", srv.url, max_retries=3, files_at_once=1), REPO)
    assert time.monotonic() - t0 < 30


def test_5xx_and_dropped_connections_retry_only_that_range(tmp_path, origin):
    srv, files = origin
    srv.faults.status_methods = frozenset({"GET"})
    srv.faults.status_queue = [(503, {}), (500, {}), (502, {})]
    srv.faults.truncate_after = 300_000
    srv.faults.truncate_times = 3
    result = fetch_snapshot(settings_for(tmp_path, srv.url, chunk_size=1 << 20), REPO)
    assert snapshot_contents(result.snapshot_path) == files
    statuses = [r.status for r in srv.requests]
    assert statuses.count(503) == statuses.count(500) == statuses.count(502) == 1
    # Retried ranges restart where their bytes stopped: nothing is fetched twice.
    assert srv.egress_bytes - total(files) < 64 * 1024


def test_stalled_body_times_out_and_retries_the_rest_of_that_range(tmp_path, origin):
    srv, files = origin
    shard = shards(files)[0]
    chunk, stall = 2 * MiB, 30.0
    assert len(files[shard]) > chunk
    # The first range stalls after 1.5 MiB; the client reads 1 MiB blocks, so it holds one whole block.
    srv.faults.stall_seconds = stall
    srv.faults.stall_after = 3 * MiB // 2
    settings = settings_for(tmp_path, srv.url, read_timeout=0.5, chunk_size=chunk, connections=1)
    t0 = time.monotonic()
    result = fetch_snapshot(settings, REPO, include=[shard])
    elapsed = time.monotonic() - t0
    assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
    # A 0.5 s read timeout, not the 30 s stall: the stalled response was given up on.
    assert elapsed < stall / 3, elapsed
    # Then only the rest of the stalled range was asked for again, from the byte where it stopped (the
    # stalled request itself is recorded only when its handler wakes up, after this test).
    starts = {}
    for r in srv.requests:
        if r.method == "GET" and r.range:
            first, _, last = r.range.removeprefix("bytes=").partition("-")
            starts[int(first)] = int(last)
    retried = [s for s in starts if 0 < s < chunk]
    assert len(retried) == 1 and MiB <= retried[0] <= 3 * MiB // 2, starts
    assert starts[retried[0]] == chunk - 1, starts


def test_server_ignoring_range_gets_one_stream_per_file(tmp_path, origin):
    srv, files = origin
    srv.faults.ignore_range = True
    result = fetch_snapshot(settings_for(tmp_path, srv.url, chunk_size=256 * 1024, connections=8), REPO)
    assert snapshot_contents(result.snapshot_path) == files
    # A file's bytes come from one GET: the CDN's for a shard, the resolve-cache's for a small file (its
    # resolve is a 307 to that).
    gets = [r for r in srv.requests if r.method == "GET" and r.bucket in ("resolvers", "cdn")]
    gets = [r for r in gets if r.status < 300]
    assert len(gets) == len(files)  # one stream per file, not one per range
    assert srv.egress_bytes < total(files) + 64 * 1024


def test_hash_mismatch_discards_only_that_file(tmp_path, origin):
    srv, files = origin
    bad = shards(files)[1]
    srv.faults.corrupt_paths = {bad}
    settings = settings_for(tmp_path, srv.url)
    with pytest.raises(IntegrityError, match=bad):
        fetch_snapshot(settings, REPO)
    cache = RepoCache(settings.cache_dir, settings.state_dir, REPO)
    snapshot = cache.snapshot_dir(srv.commit_for(REPO))
    assert not (snapshot / bad).exists() and not (snapshot / bad).is_symlink()
    assert leftovers(settings.cache_dir, settings.state_dir) == []
    assert cache.read_ref("main") is None  # refs move only when everything is in place
    good = [p for p in files if p != bad]
    assert snapshot_contents(snapshot) == {p: files[p] for p in good}  # completed files are kept

    srv.faults.reset()
    srv.reset_counters()
    result = fetch_snapshot(settings, REPO)
    assert result.downloaded == (bad,)
    assert snapshot_contents(result.snapshot_path) == files
    assert srv.egress_bytes < len(files[bad]) + 64 * 1024

    srv.faults.corrupt_paths = {bad}
    assert_one_line_error(cli(srv, tmp_path / "d"), EXIT_INTEGRITY, bad, "does not match")


class _EvilListing(hub_server._Handler):
    """A hub whose file list (the revision's siblings, or the tree listing where a mirror lists none there)
    smuggles in paths that would escape the snapshot."""

    evil_path = "../../escape.json"

    def _model_info(self, repo_id, revision, query):
        snapshot = self._snapshot(repo_id, revision, False)
        info = hub_server.listing.model_info(snapshot, private=False, gated=False, blobs=True)
        info["siblings"].append({"rfilename": self.evil_path, "size": 3, "blobId": "1" * 40})
        for name in self.hub.faults.model_info_omit:
            info.pop(name, None)
        self._send_json(200, info)

    def _tree(self, repo_id, revision, prefix, query):
        entry = {"type": "file", "oid": "1" * 40, "size": 3, "path": self.evil_path}
        real = json.loads(
            json.dumps(
                hub_server.listing.tree_entries(self._snapshot(repo_id, revision, False), "", recursive=True)
            )
        )
        self._send_json(200, [*real, entry])


@pytest.mark.parametrize("listed_in", ["revision", "tree"])
@pytest.mark.parametrize("evil", ["../../escape.json", "/etc/cron.d/x", "a/../../b"])
def test_unsafe_paths_in_listing_are_refused(tmp_path, origin, evil, listed_in):
    srv, _ = origin
    handler = type("Evil", (_EvilListing,), {"evil_path": evil})
    srv._server.RequestHandlerClass = handler
    if listed_in == "tree":
        srv.faults.model_info_omit.add("siblings")
    settings = settings_for(tmp_path, srv.url)
    with pytest.raises(UnsafePathError):
        fetch_snapshot(settings, REPO)
    if listed_in == "tree":
        assert any("/tree/" in r.path for r in srv.requests)
    assert file_requests(srv) == []
    assert not repo_dir(settings.cache_dir).exists() or not any(
        (repo_dir(settings.cache_dir) / "blobs").iterdir()
    )
    assert not (tmp_path / "escape.json").exists()
    result = cli(srv, tmp_path)
    assert_one_line_error(result, EXIT_INTEGRITY, "unsafe path")


def test_unwritable_cache_dir(tmp_path, origin):
    srv, _ = origin
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="cannot create"):
        fetch_snapshot(settings_for(tmp_path, srv.url, cache_dir=blocker / "hub"), REPO)
    result = CliRunner().invoke(
        main, ["fetch", REPO, "--origin", srv.url, "--cache-dir", str(blocker / "hub")]
    )
    assert_one_line_error(result, EXIT_DISK, "cannot create")


def test_read_only_cache_mount(tmp_path, origin, mounted_tmpfs):
    srv, _ = origin
    mnt = mounted_tmpfs(tmp_path / "ro", "size=4m,ro")
    with pytest.raises(CacheError):
        fetch_snapshot(settings_for(tmp_path, srv.url, cache_dir=mnt / "hub"), REPO)


def test_origin_error_is_not_found_not_retried_forever(tmp_path, origin):
    srv, _ = origin
    srv.faults.status_methods = frozenset({"HEAD"})
    srv.faults.status_queue = [(404, {"X-Error-Code": "EntryNotFound"})]
    with pytest.raises(NotFoundError, match="not found"):
        fetch_snapshot(settings_for(tmp_path, srv.url, files_at_once=1), REPO)


def test_persistent_5xx_gives_up(tmp_path, origin):
    srv, _ = origin
    srv.faults.status_queue = [(500, {})] * 100
    t0 = time.monotonic()
    with pytest.raises(OriginError, match="500"):
        fetch_snapshot(settings_for(tmp_path, srv.url, max_retries=2, files_at_once=1), REPO)
    assert time.monotonic() - t0 < 30


def test_token_is_sent_to_the_origin_host_only():
    from agent.core.settings import OriginSettings
    from agent.origin.kinds import open_origin

    client = open_origin(OriginSettings(endpoint="http://127.0.0.1:8080", token=TOKEN))
    http = client.kind.http
    on_origin = http.headers_for("http://127.0.0.1:8080/org/m/resolve/main/x")
    assert on_origin["Authorization"] == f"Bearer {TOKEN}"
    for elsewhere in ("http://127.0.0.2:8080/_cdn/x", "http://127.0.0.1:9090/x", "https://127.0.0.1:8080/x"):
        assert "Authorization" not in http.headers_for(elsewhere)
    assert TOKEN not in repr(client)


def test_a_stalled_range_is_hedged_by_a_free_connection_and_does_not_hold_the_download(tmp_path, origin):
    srv, files = origin
    shard = shards(files)[0]
    chunk, stall = 256 * 1024, 8.0
    assert len(files[shard]) > 4 * chunk
    # One response stalls after 100 kB, for longer than the whole download takes; the read timeout is
    # longer still, so only a second request for the rest of that range can end the wait.
    srv.faults.stall_seconds = stall
    srv.faults.stall_after = 100_000
    settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=4)
    t0 = time.monotonic()
    result = fetch_snapshot(settings, REPO, include=[shard])
    elapsed = time.monotonic() - t0
    assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
    assert elapsed < stall / 2, elapsed

    def ranges() -> list[str]:
        return [r.range for r in srv.requests if r.method == "GET" and r.range]

    # The stalled response is recorded when its handler wakes up: then one range was asked for twice.
    loop_until(lambda: len(ranges()) > len(set(ranges())), timeout=2 * stall, what="the stalled request")
    twice = [r for r in set(ranges()) if ranges().count(r) == 2]
    assert len(twice) == 1, ranges()


def test_a_stalled_range_that_comes_back_is_not_served_twice_beside_its_hedge(tmp_path):
    """The stall ends while the hedge is still reading the rest of the chunk (a TCP retransmit that
    backs off, then recovers, under shaping): both connections then carried the same bytes, and the
    origin served up to a chunk twice (a whole 4 MiB range, 1.25 x S, in the namespace test). Once
    the hedge's bytes flow, the stalled response is closed."""
    root = tmp_path / "origin"
    files = model(root, total=24 * MiB, shards=3)
    shard = shards(files)[0]
    chunk = 4 * MiB
    assert 2 * chunk <= len(files[shard]) < 3 * chunk
    with HubServer(root, rate_per_connection=1e6) as srv:
        # 1 MB/s per connection: a chunk counts as stalled after 1 s without bytes. The first response
        # stalls after 64 KiB for 4.5 s: the hedge asks for the rest at ~1 s and needs ~4 s for it, and
        # the stalled response wakes at ~4.5 s with as much still to send.
        srv.faults.stall_after, srv.faults.stall_seconds = 64 * 1024, 4.5
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=4)
        result = fetch_snapshot(settings, REPO, include=[shard])
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        assert len(ranges) > len(set(ranges)) or len(ranges) > 3, f"no hedge, no test: {ranges}"
        time.sleep(1)  # the stalled handler, awake, has tried to send the rest
        extra = srv.egress_bytes - len(files[shard])
        assert extra <= 256 * 1024, f"{extra} bytes served twice: {ranges}"


def test_a_stalled_range_that_comes_back_before_its_hedge_flows_keeps_the_chunk(tmp_path):
    """On an origin shared by 16 connections a hedge took 7 s to its first byte, while the response it
    was sent to replace came back after 1.2 s. Cut when the hedge's bytes came, at 3 MiB, it had the origin
    send those 3 MiB twice. A stalled response that is back and ahead keeps its chunk, and the hedge gives
    way."""
    root = tmp_path / "origin"
    files = model(root, total=12 * MiB, shards=1)
    shard = shards(files)[0]
    chunk = 4 * MiB
    with HubServer(root, rate_per_connection=1e6) as srv:
        # Chunk 0 (the probe) stalls after 64 KiB for 2 s; its hedge, asked for at ~1 s, stalls before
        # its first byte for 3 s, by when the first response has brought ~2 MB more.
        srv.faults.range_stalls = {chunk - 1: [(64 * 1024, 2.0), (0, 3.0)]}
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=4)
        result = fetch_snapshot(settings, REPO, include=[shard])
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        head = [r for r in ranges if r.endswith(f"-{chunk - 1}")]
        assert len(head) == 2 and not srv.faults.range_stalls[chunk - 1], f"no hedge, no test: {ranges}"
        time.sleep(0.5)
        extra = srv.egress_bytes - len(files[shard])
        assert extra <= 512 * 1024, f"{extra} bytes served twice: {ranges}"


def test_a_range_slower_than_the_others_but_flowing_is_not_hedged(tmp_path):
    """Under a shaped link shared by several nodes one flow may get a small share: its bytes come, just
    slowly. Seen a read block (1 MiB) at a time, the head chunk looked stalled beside fast ones and was
    asked for again from its first byte (a whole 4 MiB range served twice in the namespace test). While
    the front is within the `WINDOW` (4 connections: 8 chunks; there are 6 others), it is left alone
    (the next test: when the front reaches it)."""
    root = tmp_path / "origin"
    files = model(root, total=6 * MiB, shards=1)
    shard = shards(files)[0]
    chunk = 1 * MiB
    assert 6 * chunk <= len(files[shard]) < 7 * chunk
    with HubServer(root) as srv:
        # The first body (the probe: chunk 0, the head of the prefix) goes at 300 KB/s, 3.5 s for its
        # 1 MiB; every other chunk comes at loopback speed.
        srv.faults.slow_rate = 300_000
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=4)
        result = fetch_snapshot(settings, REPO, include=[shard])
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        assert srv.faults.slow_times == 0, "the slow body was never sent: no test"
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        assert len(ranges) == len(set(ranges)), f"a range asked for twice: {ranges}"


def _slow_head(
    tmp_path: Path, chunk: int, connections: int, fast: float | None, slow: float
) -> tuple[list[str], int, float]:
    """A 12-MiB shard in `chunk`s over `connections` at `fast` bytes/s each (None: as fast as they go),
    the first body (the probe: chunk 0, the head of the prefix) at `slow`: the GET ranges in the order
    asked, where among them the head's rest was asked for, and the seconds the fetch took. It checks the
    blob, that the head was asked for twice, and that at most one chunk's bytes were served twice."""
    root = tmp_path / "origin"
    files = model(root, total=12 * MiB, shards=1)
    shard = shards(files)[0]
    assert len(files[shard]) >= (WINDOW * connections + 4) * chunk
    with HubServer(root, rate_per_connection=fast) as srv:
        srv.faults.slow_rate = slow
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=connections)
        t0 = time.monotonic()
        result = fetch_snapshot(settings, REPO, include=[shard])
        elapsed = time.monotonic() - t0
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        assert srv.faults.slow_times == 0, "the slow body was never sent: no test"
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        head = [r for r in ranges if r.endswith(f"-{chunk - 1}")]
        assert len(head) == 2, f"the head chunk was asked for {len(head)} times: {head}"
        time.sleep(0.5)
        extra = srv.egress_bytes - len(files[shard])
        assert extra <= chunk, f"{extra} bytes served twice"
    return ranges, ranges.index(head[1]), elapsed


def test_a_head_range_left_far_behind_by_the_others_is_hedged_for_its_rest(tmp_path, monkeypatch):
    """One of eight connections on a shaped origin kept flowing, slowly, for seconds: the lease holder's
    prefix (what it relays) stood at 0 while its front reached 166 MiB, and the relayed nodes finished
    2.5-4 s after it. The front stops at the `WINDOW`, a free connection asks for the head's rest, and the
    slow response is closed once that flows. The slow-chunk hedge (next test) is off here: it would send
    for the head's rest first, and this one is for a head that is slow but not `SLOWER` than a free
    connection, which the window alone catches."""
    monkeypatch.setattr(origin_hedging, "SLOWER", float("inf"))
    chunk, connections, slow = 512 * 1024, 4, 100_000
    # The head at 100 KB/s, 5.2 s for its 512 KiB, a 64-KiB read every 0.65 s: flowing, never quiet for
    # `HEDGE_AFTER`. Every other chunk comes at loopback speed.
    asked, rest, elapsed = _slow_head(tmp_path, chunk, connections, None, slow)
    # Asked for when the front reached the window, and the front went no further.
    assert WINDOW * connections - 1 <= rest <= WINDOW * connections, asked
    assert elapsed < chunk / slow / 2, f"{elapsed:.1f} s: the download waited for the slow range"


def test_a_head_range_far_slower_than_a_free_connection_is_hedged_before_the_window(tmp_path):
    """A shared origin gave each lease holder one connection at 4.6 MB/s and seven at 0.2 MB/s (ss on the
    origin, bench.swarm): a head chunk on a slow one took 20 s, flowing all along and behind the window
    for 11 s. A worker whose connection brought its last chunk `SLOWER` than the head's asks for the
    head's rest as soon as it is free, not when the front reaches the window."""
    chunk, connections, fast, slow = MiB, 4, 1_000_000, 100_000
    assert fast >= 2 * SLOWER * slow
    asked, rest, elapsed = _slow_head(tmp_path, chunk, connections, fast, slow)
    # Asked for once the first chunks beside it were in (request 5, or 6 when a free worker took the next
    # chunk before the head had been in flight for `HEDGE_AFTER`), not at the window (request 9).
    assert rest < WINDOW * connections, asked
    assert elapsed < chunk / slow / 2, f"{elapsed:.1f} s: the download waited for the slow range"


def test_slow_ranges_left_at_the_end_are_hedged_side_by_side(tmp_path):
    """Once no chunk is left to take, the free workers go after every slow chunk in flight, not only the
    head: the last bytes of a lease holder's blob are what its relayed nodes wait for, and rescued one
    after another three slow chunks at the end took three chunks' time."""
    root = tmp_path / "origin"
    files = model(root, total=15 * MiB, shards=1)
    shard = shards(files)[0]
    chunk, connections, fast, slow = 2 * MiB, 4, 1_000_000, 100_000
    size = len(files[shard])
    nchunks = -(-size // chunk)
    assert nchunks == 8
    late = list(range(nchunks - 3, nchunks))  # taken last, beside one fast chunk
    with HubServer(root, rate_per_connection=fast) as srv:
        srv.faults.range_slow = {min(size, (i + 1) * chunk) - 1: slow for i in late}
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=connections)
        t0 = time.monotonic()
        result = fetch_snapshot(settings, REPO, include=[shard])
        elapsed = time.monotonic() - t0
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        assert srv.faults.range_slow == {}, "a slow body was never sent: no test"
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        for i in late:
            end = min(size, (i + 1) * chunk) - 1
            asked = [r for r in ranges if r.endswith(f"-{end}")]
            assert len(asked) == 2, f"chunk {i} was asked for {len(asked)} times: {asked}"
        # Four chunks at 2.1 s each, then one: 4.2 s; the three rests side by side: 2.1 s more. One after
        # another they end at 10.5 s; left alone the slow ones take 21 s.
        one = chunk / fast
        assert elapsed < 4 * one, f"{elapsed:.1f} s: the slow chunks were not hedged side by side"
        time.sleep(0.5)
        extra = srv.egress_bytes - size
        assert extra <= chunk, f"{extra} bytes served twice"


def test_a_slow_range_is_closed_as_its_hedge_is_asked_for(tmp_path):
    """On the benchmark's shared origin nearly every chunk of a lease holder was hedged as slow, and each
    slow response, left open until its hedge's bytes flowed, sent ~150 KB twice: 2 % of S on the origin's
    link. Here the hedge's first byte takes 4 s; the slow response must not run on meanwhile."""
    root = tmp_path / "origin"
    files = model(root, total=12 * MiB, shards=1)
    shard = shards(files)[0]
    chunk, connections, fast, slow, wait = MiB, 4, 1_000_000, 100_000, 4.0
    with HubServer(root, rate_per_connection=fast) as srv:
        srv.faults.slow_rate = slow  # the first body: chunk 0, the probe
        srv.faults.range_stalls = {chunk - 1: [(0, 0.0), (0, wait)]}  # chunk 0's second request: the hedge
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=chunk, connections=connections)
        result = fetch_snapshot(settings, REPO, include=[shard])
        assert snapshot_contents(result.snapshot_path) == {shard: files[shard]}
        ranges = [r.range for r in srv.requests if r.method == "GET" and r.range]
        head = [r for r in ranges if r.endswith(f"-{chunk - 1}")]
        assert len(head) == 2, f"the head chunk was asked for {len(head)} times: {head}"
        assert not srv.faults.range_stalls[chunk - 1], "the hedge never waited: no test"
        time.sleep(0.5)
        extra = srv.egress_bytes - len(files[shard])
    # Left open, the slow response would have sent `wait` s of its rate (400 KB) a second time.
    assert extra < 128 * 1024, f"{extra} bytes served twice"


def test_a_slow_range_shows_its_bytes_before_a_whole_block_has_come(tmp_path):
    """The written prefix (what the relay streams, what a lease holder's heartbeats report) grows while
    a slow range arrives, not a 1 MiB block at a time: on a shared origin a block took ~15 s, longer
    than a holder may go without progress, and another node took the lease and pulled the blob again."""
    root = tmp_path / "origin"
    files = model(root, total=2 * MiB, shards=1)
    shard = shards(files)[0]
    rate = 400_000  # a 1 MiB block in 2.6 s
    progress = Progress(quiet=True)
    results = []
    with HubServer(root, rate_per_connection=rate) as srv:
        settings = settings_for(tmp_path, srv.url, read_timeout=60, chunk_size=4 * MiB, connections=1)
        fetch = threading.Thread(
            target=lambda: results.append(fetch_snapshot(settings, REPO, include=[shard], progress=progress))
        )
        began = time.monotonic()
        fetch.start()
        loop_until(lambda: progress.done > 0, timeout=30, interval=0.02)
        first_write = time.monotonic() - began
        fetch.join(timeout=60)
    assert len(files[shard]) > MiB and results, "one block, or no fetch: no test"
    assert snapshot_contents(results[0].snapshot_path) == {shard: files[shard]}
    assert first_write < 1.3, f"first bytes written after {first_write:.1f} s (one block: {MiB / rate:.1f} s)"


def test_a_refused_head_leaves_its_connection_fit_for_the_next_request(origin):
    """http.client keeps a HEAD's response open until it is read or collected, and a refused one lives on
    in its error's traceback (while the client backs off, in another thread). Handed back to the pool as
    it was, its connection broke the next request after the origin had answered it, and the client sent
    that request again: a whole range served twice (a daemon test's egress, 1.08 x S). One connection
    here, so every request reuses the HEAD's."""
    from agent.core.settings import OriginSettings
    from agent.origin.kinds import open_origin
    from agent.origin.session import body_complete, release

    srv, files = origin
    client = open_origin(OriginSettings(endpoint=srv.url, max_retries=1), max_connections=1)
    shard = shards(files)[0]
    meta = client.file_metadata(REPO, "main", shard)
    srv.faults.status_queue = [(429, {"Retry-After": "1", "X-Error-Code": "RateLimited"})]
    srv.reset_counters()
    with pytest.raises(RateLimitedError) as refused:
        client.file_metadata(REPO, "main", shard)
    resp = client.kind.http.request("GET", meta.url, shard, {"Range": "bytes=0-99"})
    assert resp.read() == files[shard][:100] and body_complete(resp)
    release(resp)
    assert refused.value  # still held, as a retrying caller holds it
    assert [(r.method, r.status) for r in srv.requests] == [("HEAD", 429), ("GET", 206)]  # none twice
