"""The per-blob policy under bad peers: corrupt pieces, a vanished seeder, metainfo known but no seeders."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from agent.cache.layout import RepoCache
from tests.support.cluster import (
    AgentProcess,
    admin_request,
    assert_snapshot_verifies,
    fetch_all_and_verify,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.support.procs import loop_until


def _corrupt_shards(cache_dir: Path, state_dir: Path, repo_id: str) -> int:
    """Flip a byte in every 16 KiB block of every shard blob, in place (the seeder's libtorrent won't
    notice): whatever block a peer takes from this copy, the piece it belongs to fails its hash check."""
    cache = RepoCache(cache_dir, state_dir, repo_id)
    n = 0
    for blob in cache.blobs_dir.iterdir():
        size = blob.stat().st_size
        if size < 2**20:
            continue
        with open(blob, "r+b") as fh:
            for offset in range(100, size, 16 * 1024):
                fh.seek(offset)
                byte = fh.read(1)
                fh.seek(offset)
                fh.write(bytes([byte[0] ^ 0xFF]))
        n += 1
    return n


def test_a_corrupting_peer_does_not_corrupt_the_result(origin, tracker, make_agent, caplog):
    good = make_agent("good", origin, tracker)
    fetch_and_wait(good, origin.repo_id)
    # `bad` on its own address, and the victim with one connection per address, as on nodes: so
    # libtorrent's ban of `bad` holds (on one shared address, `bad` came back in as a new peer).
    bad = make_agent("bad", origin, tracker, listen="127.0.0.2:0")
    fetch_and_wait(bad, origin.repo_id)
    wait_until_seeded(tracker, good, bad)
    # `bad` got its blobs from the swarm, so it seeds from resume data and never re-checks them.
    assert _corrupt_shards(bad.settings.cache_dir, bad.settings.state_dir, origin.repo_id) == 3

    origin.hub.reset_counters()
    # A longer stall (so 15 s of failing pieces, none passing, before the metainfo is suspect): under a
    # loaded CI machine the good peer once sent nothing for 5 s, and the victim rightly took that blob
    # from the origin, which is the suspect-metainfo path, not the one this test is about.
    victim = make_agent(
        "victim", origin, tracker, stall_timeout=60.0, allow_multiple_connections_per_ip=False
    )
    caplog.set_level(logging.WARNING, logger="agent.swarm.session")
    status = fetch_and_wait(victim, origin.repo_id, timeout=120)
    assert_snapshot_verifies(status["snapshot"], origin)
    # The good peer fills in for the bad one, so no byte comes from the origin: except for a blob where
    # libtorrent banned the good peer too. A piece whose blocks came from both peers (before either
    # had a download rate, libtorrent takes a piece's blocks from any peer) and failed costs each
    # sender trust, and a small blob's four pieces failing at once cost the good peer its place (seen
    # under a loaded CI machine). Nothing is then left to send it, and the victim rightly takes it
    # from the origin, verified.
    # The good peer is the only one on 127.0.0.1 (any port: a connection it opened has its own).
    good_ban = re.compile(r"banned peer 127\.0\.0\.1:\d+ for ([0-9a-f]+) ")
    framed = {m[1] for r in caplog.records if (m := good_ban.match(r.getMessage()))}
    from_origin = {f["blob_id"]: f["size"] for f in status["files"] if f["source"] == "origin"}
    assert set(from_origin) <= framed, (from_origin, framed)
    # Such a blob keeps the pieces that passed their check before the ban: the origin sends only the rest.
    taken = status["bytes_from_origin"]
    assert (0 < taken <= sum(from_origin.values())) if from_origin else taken == 0, (taken, from_origin)
    # The victim did take data from the corrupt peer: libtorrent's piece check threw it away and
    # banned the sender.
    assert victim.swarm is not None
    seen = [victim.swarm.status(ih) for ih in victim.held_blobs().values()]
    assert sum(s.hash_failures for s in seen) > 0, seen
    assert sum(s.banned_peers for s in seen) > 0, seen


def test_metainfo_known_but_no_seeders_takes_the_lease_and_web_seed(origin, tracker, make_agent):
    first = make_agent("first", origin, tracker)
    fetch_and_wait(first, origin.repo_id)
    first.stop()  # its "stopped" announce leaves the tracker with metainfo but no seeders

    origin.hub.reset_counters()
    agents = [make_agent(n, origin, tracker) for n in ("b", "c")]
    statuses = fetch_all_and_verify(agents, origin)
    assert origin.hub.egress_bytes <= 1.1 * origin.size, (origin.hub.egress_bytes, origin.size)
    # One lease holder per blob pulled it from the origin as a web seed of its torrent (the origin
    # engine would have replaced that torrent with a fresh seeding one: no web seed bytes on it);
    # the other node took the blob from the holder over BitTorrent.
    for blob_id, size in {f["blob_id"]: f["size"] for f in statuses[0]["files"]}.items():
        seen = [a.swarm.status(a.held_blobs()[blob_id]) for a in agents if a.swarm is not None]
        holder, other = sorted(seen, key=lambda st: st.bytes_from_web_seeds, reverse=True)
        assert holder.bytes_from_web_seeds >= size and holder.bytes_from_peers == 0, (blob_id, seen)
        assert other.bytes_from_web_seeds == 0 and other.bytes_from_peers >= size, (blob_id, seen)
    for path in origin.files:
        sources = sorted(next(f["source"] for f in st["files"] if f["path"] == path) for st in statuses)
        assert sources == ["origin", "peers"], (path, sources)
    assert sum(st["bytes_from_origin"] for st in statuses) == origin.size, statuses


def test_stalled_peers_fall_back_to_the_origin(tmp_path, origin, tracker, make_agent):
    a = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    try:
        a.start()

        from tests.support.procs import loop_until

        job = admin_request(a.url, "POST", "/v1/fetch", json={"repo_id": origin.repo_id}).json()
        loop_until(
            lambda: admin_request(a.url, "GET", f"/v1/jobs/{job['job_id']}").json()["phase"] == "Ready",
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
    announced a moment later, or, as built here, one that a torrent restored after a restart already
    knows). The lease holder must take the bytes from it, not pull them from the origin."""
    import hashlib

    from agent.core.swarm_settings import SwarmSettings
    from agent.swarm.session import Swarm

    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    cache_a = RepoCache(a.settings.cache_dir, a.settings.state_dir, origin.repo_id)
    shard = max(origin.files, key=lambda p: len(origin.files[p]))
    blob_id = next(b for b in a.held_blobs() if cache_a.blob_path(b).read_bytes() == origin.files[shard])
    digest = cache_a.read_sidecar(blob_id)
    assert digest is not None
    info = digest.encoded_info(blob_id)
    ih = hashlib.sha1(info).hexdigest()
    seed_dir = tmp_path / "hidden"
    seed_dir.mkdir()
    (seed_dir / blob_id).write_bytes(origin.files[shard])
    a.stop()  # "stopped": the tracker keeps the metainfo and counts no seeders
    announce = [tracker.announce_url]

    # A slow seeder of the shard, listed on the tracker for now: B's first run finds it there.
    with Swarm(SwarmSettings(upload_rate_limit=100_000), tmp_path / "hidden-state") as hidden:
        hidden.admit(["127.0.0.1"])
        hidden.seed(seed_dir / blob_id, info, announce)
        loop_until(lambda: int(tracker.blob(blob_id).get("seeders") or 0) == 1, timeout=30, what="H listed")
        b = make_agent("b", origin, tracker)
        assert b.swarm is not None
        b.request_model(origin.repo_id, "main")
        others = {f for f in origin.files if f != shard}
        loop_until(lambda: len(b.held_blobs()) == len(others), timeout=60, what="B has all but the shard")
        loop_until(lambda: ih in b.swarm.torrents() and b.swarm.status(ih).done > 0, timeout=30, what="part")
        before_restart = set(b.held_blobs())
        b.stop()  # mid-download: the shard's torrent is saved (resume data) half done
        cache_b = RepoCache(b.settings.cache_dir, b.settings.state_dir, origin.repo_id)
        assert cache_b.incomplete_path(blob_id).exists() and not cache_b.blob_path(blob_id).exists()

        # The seeder leaves the tracker ("stopped") but stays up at the same address.
        hidden.remove(ih)
        hidden.seed(seed_dir / blob_id, info, [])
        loop_until(lambda: int(tracker.blob(blob_id).get("seeders") or 0) == 0, timeout=30, what="H gone")

        # B again, on the same cache and state: what it had seeds at once, and the shard's restored
        # torrent reconnects to the seeder it knew, which the tracker does not list.
        b = make_agent("b", origin, tracker)
        assert b.swarm is not None
        assert set(b.held_blobs()) == before_restart
        loop_until(lambda: b.swarm.status(ih).num_seeds > 0, timeout=30, what="B reconnected to the seeder")
        assert int(tracker.blob(blob_id).get("seeders") or 0) == 0
        origin.hub.reset_counters()
        status = fetch_and_wait(b, origin.repo_id, timeout=120)

    assert_snapshot_verifies(status["snapshot"], origin)
    assert next(f for f in status["files"] if f["path"] == shard)["source"] == "peers"
    assert [r for r in file_requests(origin.hub) if blob_id in r.path or shard in r.path] == []
    assert tracker.blob(blob_id).get("lease") is None  # given back, not left to expire
    # ... and the restarted B seeds every blob, the shard too.
    wait_until_seeded(tracker, b)
    assert set(b.held_blobs()) == before_restart | {blob_id}
