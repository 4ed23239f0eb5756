"""The standalone fetch against a hub that answers as huggingface.co does now (the test hub's default):
small files behind a 307, LFS files behind a 302 to an expiring signed CDN URL, 429s that say when only
with `RateLimit t=`, a mirror that ignores Range or drops Content-Length on HEAD."""

from __future__ import annotations

import threading
import time

from click.testing import CliRunner

from agent.cli.main import main
from agent.core.errors import EXIT_FAILURE
from agent.fetch.engine import fetch_snapshot
from agent.hub.repos import is_lfs
from agent.origin import location as origin_location
from tests.support.fetchkit import (
    REPO,
    MiB,
    fetch_args,
    model,
    serve,
    settings_for,
    shards,
    snapshot_contents,
)


def _small(files: dict[str, bytes]) -> list[str]:
    return sorted(p for p, b in files.items() if not is_lfs(p, len(b)))


def test_small_files_behind_a_307_arrive_with_one_resolve_each(tmp_path):
    root = tmp_path / "origin"
    files = model(root)
    for srv in serve(root):
        result = fetch_snapshot(settings_for(tmp_path, srv.url), REPO)
        assert snapshot_contents(result.snapshot_path) == files
        small = _small(files)
        assert small, "the model has small files"
        redirects = [r for r in srv.requests if "/resolve/" in r.path and r.status == 307]
        names = sorted(r.path.rsplit("/", 1)[-1] for r in redirects)
        assert names == sorted(p.rsplit("/", 1)[-1] for p in small)
        assert not [r for r in srv.requests if r.method == "HEAD" and r.path.endswith(tuple(small))]
        api = [r for r in srv.requests if r.path.startswith("/api/models/")]
        assert len(api) == 1 and "/revision/" in api[0].path, api  # one origin API call plans the commit


def test_a_shard_that_outlives_its_signed_url_is_renewed_and_resumed(tmp_path, monkeypatch):
    root = tmp_path / "origin"
    files = model(root, total=6 * MiB, shards=1)
    shard = shards(files)[0]
    monkeypatch.setattr(origin_location, "FRESH", 0.5)
    # A TTL well above FRESH: on a loaded machine a resolve's answer took long enough to arrive that a URL
    # with a 1-s life was refused within FRESH of it, which is the real-refusal rule's case, not this one.
    for srv in serve(root, cdn_url_ttl=2.0, rate_per_connection=1.0 * MiB):
        started = time.monotonic()
        result = fetch_snapshot(settings_for(tmp_path, srv.url, connections=2), REPO)
        assert time.monotonic() - started > 2.0  # it did outlive the URL
        assert snapshot_contents(result.snapshot_path) == files
        heads = [r for r in srv.requests if r.method == "HEAD" and r.path.endswith(shard)]
        refused = [r for r in srv.requests if r.status == 403]
        assert refused and len(heads) >= 2, (len(refused), len(heads))
        assert not any(r.authorized for r in srv.requests if r.bucket == "cdn")  # the token stays home
        assert srv.egress_bytes < 1.2 * sum(map(len, files.values()))  # each range went on where it stopped


def test_a_url_refused_right_after_a_fresh_resolve_is_a_refusal_that_names_the_cdn(tmp_path):
    root = tmp_path / "origin"
    files = model(root, total=2 * MiB, shards=1)
    for srv in serve(root, cdn_url_ttl=-10.0):  # every signed URL is born expired
        result = CliRunner().invoke(main, fetch_args(srv.url, tmp_path))
        # Not the gated/token code: the origin itself granted access, its download host refused.
        assert result.exit_code == EXIT_FAILURE, result.output
        last = result.stderr.strip().splitlines()[-1]
        assert "download host" in last and f"127.0.0.1:{srv.cdn_port}" in last, last
        assert "--token" not in last, last  # the origin granted access: no token would help
        heads = [r for r in srv.requests if r.method == "HEAD" and r.path.endswith(shards(files)[0])]
        assert len(heads) == 1, heads  # no loop of resolves


def test_a_429_that_says_when_only_with_ratelimit_is_waited_out(tmp_path):
    root = tmp_path / "origin"
    files = model(root)
    for srv in serve(root):
        limited = {"RateLimit": '"api";r=0;t=2', "RateLimit-Policy": '"fixed window";"api";q=500;w=300'}
        srv.faults.path_status[f"/api/models/{REPO}/revision/main"] = (429, limited)
        threading.Timer(1.0, srv.faults.path_status.clear).start()
        started = time.monotonic()
        result = fetch_snapshot(settings_for(tmp_path, srv.url, max_retries=3), REPO)
        waited = time.monotonic() - started
        assert snapshot_contents(result.snapshot_path) == files
        asked = [r.status for r in srv.requests if r.path.endswith("/revision/main")]
        # With the backoff alone (base 0.02 s) all three attempts would be spent within 0.2 s.
        assert asked == [429, 200] and waited >= 2.0, (asked, waited)


def test_a_mirror_that_ignores_range_and_drops_head_lengths_still_serves(tmp_path, caplog):
    root = tmp_path / "origin"
    files = model(root)
    for srv in serve(root):
        srv.faults.ignore_range = True
        srv.faults.head_without_length = True
        with caplog.at_level("INFO", logger="agent.origin.ranges"):
            result = fetch_snapshot(settings_for(tmp_path, srv.url, chunk_size=512 * 1024), REPO)
        assert snapshot_contents(result.snapshot_path) == files
        said = [r.message for r in caplog.records if "ignores Range" in r.message]
        said_for = [m.split(":")[0] for m in said]
        assert len(said_for) == len(set(said_for)), said  # once per file
        cdn_gets = [r for r in srv.requests if r.bucket == "cdn" and r.method == "GET"]
        assert len(cdn_gets) == len(shards(files))


def test_progress_never_says_done_for_a_file_that_failed(tmp_path):
    root = tmp_path / "origin"
    files = model(root)
    bad = shards(files)[0]
    for srv in serve(root):
        srv.faults.corrupt_paths = {bad}
        result = CliRunner().invoke(main, fetch_args(srv.url, tmp_path))
        assert result.exit_code != 0
        lines = result.stderr.splitlines()
        assert f"  failed {bad}" in lines, lines
        assert not any(line.startswith(f"  done {bad}") for line in lines), lines
        assert any(line.startswith(f"  done {_small(files)[0]}") for line in lines), lines
