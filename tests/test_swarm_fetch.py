"""The per-blob policy under bad peers: corrupt pieces, a vanished seeder, metainfo known but no seeders."""

from __future__ import annotations

import os
from pathlib import Path

from agent.cache import RepoCache
from tests import daemon_fixtures
from tests.daemon_fixtures import (
    AgentProcess,
    assert_snapshot_verifies,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)

origin = daemon_fixtures.origin
tracker = daemon_fixtures.tracker
make_agent = daemon_fixtures.make_agent


def _corrupt_shards(cache_dir: Path, state_dir: Path, repo_id: str) -> int:
    """Flip bytes in the middle of every shard blob, in place (the seeder's libtorrent won't notice)."""
    cache = RepoCache(cache_dir, state_dir, repo_id)
    n = 0
    for blob in cache.blobs_dir.iterdir():
        size = blob.stat().st_size
        if size < 2**20:
            continue
        with open(blob, "r+b") as fh:
            for offset in (size // 4, size // 2, 3 * size // 4):
                fh.seek(offset)
                byte = fh.read(1)
                fh.seek(offset)
                fh.write(bytes([byte[0] ^ 0xFF]))
        n += 1
    return n


def test_a_corrupting_peer_does_not_corrupt_the_result(origin, tracker, make_agent):
    good = make_agent("good", origin, tracker)
    fetch_and_wait(good, origin.repo_id)
    bad = make_agent("bad", origin, tracker)
    fetch_and_wait(bad, origin.repo_id)
    wait_until_seeded(tracker, good, bad)
    # `bad` got its blobs from the swarm, so it seeds from resume data and never re-checks them.
    assert _corrupt_shards(bad.settings.cache_dir, bad.settings.state_dir, origin.repo_id) == 3

    origin.hub.reset_counters()
    victim = make_agent("victim", origin, tracker)
    status = fetch_and_wait(victim, origin.repo_id, timeout=120)
    assert_snapshot_verifies(status["snapshot"], origin)
    assert status["bytes_from_origin"] == 0 and file_requests(origin.hub) == []


def test_metainfo_known_but_no_seeders_takes_the_lease_and_web_seed(origin, tracker, make_agent):
    first = make_agent("first", origin, tracker)
    fetch_and_wait(first, origin.repo_id)
    first.stop()  # its "stopped" announce leaves the tracker with metainfo but no seeders

    origin.hub.reset_counters()
    agents = [make_agent(n, origin, tracker) for n in ("b", "c")]
    jobs = [a.request_model(origin.repo_id) for a in agents]
    for job in jobs:
        assert job.wait(120), job.status()
    statuses = [j.status().to_json() for j in jobs]
    for st in statuses:
        assert st["phase"] == "Ready", st
        assert_snapshot_verifies(st["snapshot"], origin)
    # One lease holder per blob pulled it from the origin (web seed); the other took it from peers.
    assert origin.hub.egress_bytes <= 1.1 * origin.size, (origin.hub.egress_bytes, origin.size)


def test_stalled_peers_fall_back_to_the_origin(tmp_path, origin, tracker, make_agent):
    a = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    try:
        a.start()
        import httpx

        from tests.helpers import loop_until

        job = httpx.post(f"{a.url}/v1/fetch", json={"repo_id": origin.repo_id}).json()
        loop_until(
            lambda: httpx.get(f"{a.url}/v1/jobs/{job['job_id']}").json()["phase"] == "Ready",
            timeout=90,
            what="A ready",
        )
        # SIGKILL: no "stopped" announce, so the tracker still lists A as a seeder for a while.
        a.kill()
    finally:
        a.stop()
    origin.hub.reset_counters()
    b = make_agent("b", origin, tracker, stall_timeout=3.0)
    status = fetch_and_wait(b, origin.repo_id, timeout=120)
    assert_snapshot_verifies(status["snapshot"], origin)
    assert status["bytes_from_origin"] > 0 and status["bytes_from_peers"] == 0
    assert os.path.isdir(status["snapshot"])
