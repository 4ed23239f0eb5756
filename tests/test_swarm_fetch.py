"""The per-blob policy under bad peers: corrupt pieces, a vanished seeder, metainfo known but no seeders."""

from __future__ import annotations

import os
from pathlib import Path

from agent.cache import RepoCache
from tests.daemon_fixtures import (
    AgentProcess,
    assert_snapshot_verifies,
    fetch_all_and_verify,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.helpers import loop_until


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
    fetch_all_and_verify(agents, origin)
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


def test_lease_holder_takes_a_seeder_its_own_swarm_found_over_the_origin(
    tmp_path, origin, tracker, make_agent
):
    """The tracker's seeder count is a snapshot: 0 when asked, yet a seeder is reachable (one that
    announced a moment later, or, as built here, one a torrent restored after a restart already
    knows). The lease holder must take the bytes from it, not pull them from the origin."""
    from agent.settings import SwarmSettings
    from agent.swarm import Swarm
    from agent.swarm_fetch import encoded_info

    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    cache_a = RepoCache(a.settings.cache_dir, a.settings.state_dir, origin.repo_id)
    shard = max(origin.files, key=lambda p: len(origin.files[p]))
    blob_id = next(b for b in a.held_blobs() if cache_a.blob_path(b).read_bytes() == origin.files[shard])
    digest = cache_a.read_sidecar(blob_id)
    assert digest is not None
    info = encoded_info(blob_id, digest)
    seed_dir = tmp_path / "hidden"
    seed_dir.mkdir()
    (seed_dir / blob_id).write_bytes(origin.files[shard])
    a.stop()  # "stopped": the tracker keeps the metainfo and counts no seeders

    # A seeder the tracker does not know (no announce), slow enough to still be needed when the job runs.
    with Swarm(SwarmSettings(upload_rate_limit=200_000), tmp_path / "hidden-state") as hidden:
        hidden.seed(seed_dir / blob_id, info, [])
        b = make_agent("b", origin, tracker)
        assert b.swarm is not None
        cache_b = RepoCache(b.settings.cache_dir, b.settings.state_dir, origin.repo_id)
        ih = b.swarm.download(
            cache_b.blobs_dir,
            blob_id,
            info,
            trackers=[f"{tracker.url}/announce"],
            peers=[("127.0.0.1", hidden.listen_port)],
            incomplete_name=cache_b.incomplete_path(blob_id).name,
        )
        loop_until(lambda: b.swarm.status(ih).num_seeds > 0, timeout=30, what="B connected to the seeder")
        assert int(tracker.blob(blob_id).get("seeders") or 0) == 0
        origin.hub.reset_counters()
        status = fetch_and_wait(b, origin.repo_id, timeout=120)

    assert_snapshot_verifies(status["snapshot"], origin)
    assert next(f for f in status["files"] if f["path"] == shard)["source"] == "peers"
    assert [r for r in file_requests(origin.hub) if blob_id in r.path or shard in r.path] == []
    assert tracker.blob(blob_id).get("lease") is None  # given back, not left to expire
