"""A large blob pulled from the origin in parts by several nodes at once (agent.swarm.relay "Parts",
issue 13): each node holds the lease of one part, receives the others from their holders' relays,
and every failure of that path ends in the right bytes. Real tracker, real daemons (one a
subprocess, to be killed), a rate-capped test hub with its fault injection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.swarm.relay import part_key
from tests.support.cluster import AgentProcess, Origin, admin_request, model_origin
from tests.support.procs import loop_until
from tests.swarm.test_relay import LEASE, assert_ready, shard_blob, shard_status

MiB = 2**20
SHARD = 36 * MiB
PARTS = 3
SPLIT = {"origin_holders": PARTS, "origin_part_min": 8 * MiB}
"""Three parts of 12 MiB (three 4-MiB origin chunks each)."""
RATE = 6 * MiB  # the shard takes ~6 s from the origin, all parts together


@pytest.fixture
def big_shard(tmp_path: Path) -> Iterator[Origin]:
    hub = tmp_path / "hub"
    with model_origin(hub, "acme/parts", total_bytes=SHARD, shards=1, seed=53, rate_total=RATE) as o:
        yield o


def part_holders(tracker, blob: str) -> list[str | None]:
    """Who holds each part's origin lease now."""
    holders: list[str | None] = []
    for k in range(PARTS):
        lease = tracker.blob(part_key(blob, k, PARTS)).get("lease")
        holders.append(str(lease["holder"]) if isinstance(lease, dict) else None)
    return holders


def job_json(job) -> dict:
    return job.status().to_json()


@pytest.mark.timeout(150)
def test_each_node_pulls_one_part_from_the_origin_and_the_rest_from_the_others(
    big_shard, tracker, make_agent
):
    shard, blob = shard_blob(big_shard)
    agents = [make_agent(n, big_shard, tracker, daemon=LEASE, **SPLIT) for n in ("a", "b", "c")]
    jobs = [d.request_model(big_shard.repo_id, "main") for d in agents]
    seen: set[str] = set()
    while not all(j.done for j in jobs):
        seen.update(h for h in part_holders(tracker, blob) if h is not None)
        time.sleep(0.2)
    assert seen == {d.node_id for d in agents}, "each node held the lease of a part"
    for job in jobs:
        assert_ready(job, big_shard, 60)
    assert big_shard.hub.egress_bytes < 1.05 * big_shard.size  # one copy of each part left the origin
    part = SHARD // PARTS
    for job in jobs:
        status = job_json(job)
        # Its own part from the origin, the two others relayed (the small files come from anyone).
        assert part <= status["bytes_from_origin"] < part + 2 * MiB, status
        assert status["bytes_from_peers"] >= 2 * part - 2 * MiB, status
        assert shard_status(job, shard)["source"] == "origin"
    assert part_holders(tracker, blob) == [None] * PARTS  # released once the blob was published
    assert tracker.blob(blob).get("infohash") is not None


@pytest.mark.timeout(180)
def test_a_part_holder_killed_mid_part_is_taken_over_from_where_its_receivers_are(
    tmp_path, big_shard, tracker, make_agent
):
    shard, blob = shard_blob(big_shard)
    a = AgentProcess(
        tmp_path, "a", big_shard.hub.url, tracker, "--lease-ttl", "3",
        "--origin-holders", str(PARTS), "--origin-part-min", str(8 * MiB),
    )
    a.start()
    try:
        admin_request(a.url, "POST", "/v1/fetch", json={"repo_id": big_shard.repo_id})
        loop_until(lambda: any(part_holders(tracker, blob)), timeout=30, what="a holds a part's lease")
        others = [make_agent(n, big_shard, tracker, daemon=LEASE, **SPLIT) for n in ("b", "c")]
        jobs = [d.request_model(big_shard.repo_id, "main") for d in others]
        loop_until(
            lambda: shard_status(jobs[0], shard)["done"] >= SHARD // 3, timeout=30, what="b has a third of it"
        )
        a.kill()
    finally:
        a.stop()
    for job in jobs:
        assert_ready(job, big_shard, 120)
    # The killed node's part was taken over where its receivers were: at most what a had pulled and not
    # yet relayed comes twice (its connections' buffers), not the part again.
    assert big_shard.hub.egress_bytes < 1.25 * big_shard.size


@pytest.mark.timeout(180)
def test_a_corrupt_origin_byte_in_one_part_is_caught_and_the_blob_fetched_again(
    big_shard, tracker, make_agent
):
    shard, _ = shard_blob(big_shard)
    big_shard.hub.faults.corrupt_paths = {shard}
    big_shard.hub.faults.corrupt_times = 1  # the first range a part holder asks for
    agents = [make_agent(n, big_shard, tracker, daemon=LEASE, **SPLIT) for n in ("a", "b", "c")]
    jobs = [d.request_model(big_shard.repo_id, "main") for d in agents]
    # Every node checks the whole blob's sha256: the flipped byte, relayed to the others, fails it there
    # too; each drops the blob and fetches it whole, and ends with the origin's bytes.
    for job in jobs:
        assert_ready(job, big_shard, 120)


@pytest.mark.timeout(120)
def test_an_origin_dropping_connections_mid_range_does_not_reach_the_parts(big_shard, tracker, make_agent):
    big_shard.hub.faults.truncate_after = 100_000
    big_shard.hub.faults.truncate_times = 4
    agents = [make_agent(n, big_shard, tracker, daemon=LEASE, **SPLIT) for n in ("a", "b", "c")]
    jobs = [d.request_model(big_shard.repo_id, "main") for d in agents]
    for job in jobs:
        assert_ready(job, big_shard, 60)
    assert big_shard.hub.egress_bytes < 1.05 * big_shard.size
