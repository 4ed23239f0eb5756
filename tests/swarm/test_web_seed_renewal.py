"""A lease holder's web seed and the origin's signed CDN URLs, which expire (agent.swarm.webseed).

Metainfo known, no seeders: the lease holder's torrent takes the blob from the origin's CDN URL as a web
seed. The test hub's URLs live `cdn_url_ttl` seconds; a request that starts later is refused (403, an S3
XML body), one already running completes. libtorrent asks a web seed for up to 16 MiB at a time, so a
blob of a few such requests, under a rate cap, outlives its first URL.
"""

from __future__ import annotations

import hashlib
import time

from agent.hub.cdn import cdn_path
from tests.support.cluster import REPO, assert_snapshot_verifies, fetch_and_wait, model_origin

SHARD = "model.safetensors"
TTL = 3.0
"""Seconds a signed URL lives here: 2-3 s (the hub's X-Amz-Date counts whole seconds), room for a renewed
URL's first request to start in time on a loaded machine."""
RATE = 4_000_000
"""Bytes/s the hub sends: libtorrent's 16 MiB requests take 4.2 s each, longer than a URL lives."""


def _shard_heads(hub, commit: str) -> list:
    """The metadata requests for the shard (each a resolve at the origin)."""
    return [r for r in hub.requests if r.method == "HEAD" and r.path == f"/{REPO}/resolve/{commit}/{SHARD}"]


def test_a_web_seeded_shard_outlives_its_signed_url(tmp_path, tracker, make_agent):
    with model_origin(tmp_path / "hub", REPO, total_bytes=40 * 2**20, shards=1, seed=11) as origin:
        first = make_agent("first", origin, tracker)
        fetch_and_wait(first, origin.repo_id)
        first.stop()  # the tracker keeps the metainfo and counts no seeders
        size = len(origin.files[SHARD])
        origin.hub.reset_counters()
        origin.hub.cdn_url_ttl = TTL
        origin.hub.rate_total = RATE
        # Without the relay even a blob this large comes through the web seed (with it, the origin engine).
        b = make_agent("b", origin, tracker, relay_fanout=0)
        started = time.monotonic()
        status = fetch_and_wait(b, origin.repo_id, timeout=120)
        took = time.monotonic() - started
        hub = origin.hub

        assert_snapshot_verifies(status["snapshot"], origin)
        assert took > 2 * TTL, took  # the download did outlive its first URL
        shard = next(f for f in status["files"] if f["path"] == SHARD)
        assert shard["source"] == "origin"
        assert b.swarm is not None
        web = b.swarm.status(b.held_blobs()[shard["blob_id"]]).bytes_from_web_seeds
        assert web >= size, (web, size)  # libtorrent's web seed brought it, not the origin engine
        refused = [r for r in hub.requests if r.bucket == "cdn" and r.status == 403]
        heads = _shard_heads(hub, hub.commit_for(REPO))
        assert refused, hub.requests  # the CDN refused an expired URL ...
        assert len(heads) > 1, heads  # ... and the shard was resolved again
        assert len(heads) <= len(refused) + 1, (heads, refused)  # once per refusal at most
        # Each renewed URL went on from the pieces there were: no byte asked twice, no start from zero.
        assert hub.egress_bytes < 1.2 * size, (hub.egress_bytes, size)


def test_a_signed_url_refused_when_fresh_stays_a_refusal(tmp_path, tracker, make_agent):
    with model_origin(tmp_path / "hub", REPO, total_bytes=4 * 2**20, shards=1, seed=12) as origin:
        first = make_agent("first", origin, tracker)
        fetch_and_wait(first, origin.repo_id)
        first.stop()
        hub = origin.hub
        hub.reset_counters()
        sha256 = hashlib.sha256(origin.files[SHARD]).hexdigest()
        hub.faults.path_status[cdn_path(REPO, sha256)] = (403, {})  # every URL, fresh or not
        b = make_agent("b", origin, tracker)
        started = time.monotonic()
        job = b.request_model(origin.repo_id, "main")
        assert job.wait(60), job.status()
        took = time.monotonic() - started
        status = job.status().to_json()

        assert status["phase"] == "Failed", status
        error = status["error"] or ""
        cdn_host = hub.cdn_url.removeprefix("http://")
        assert cdn_host in error and "refused" in error, error
        assert "token" not in error.lower(), error
        heads = _shard_heads(hub, hub.commit_for(REPO))
        assert 1 <= len(heads) <= 3, heads  # no loop of resolves
        # The web seed's refusal is taken at once, not after libtorrent's retries (3 x 5 s) brought nothing.
        assert took < 12, took
