"""A large blob pulled from the origin in parts by several nodes at once (agent.relay.directory "Parts",
issue 13): each node holds the lease of one part, receives the others from their holders' relays,
and every failure of that path ends in the right bytes. Real tracker, real daemons (one a
subprocess, to be killed), a rate-capped test hub with its fault injection."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download

from agent.core.settings import DaemonSettings
from agent.relay.admission import MORE, ONE, admission_key
from agent.relay.directory import part_key
from agent.tracking.client import TrackerClient
from tests.http.test_hf_streaming import client_warnings
from tests.support.cluster import TOKEN, AgentProcess, Origin, TrackerProcess, admin_request, model_origin
from tests.support.procs import RedisProcess, loop_until
from tests.swarm.test_relay import LEASE, assert_ready, shard_blob, shard_status
from tests.swarm.test_tracker_outage import restart_when_busy

MiB = 2**20
SHARD = 36 * MiB
PARTS = 3
SPLIT = {"origin_holders": PARTS, "origin_part_min": 8 * MiB, "origin_probe_seconds": 2.0}
"""Three parts of 12 MiB; the lead's rates count once two 1-s windows agree (the default's windows:
half-second ones, ~0.5 MiB each here, disagreed by more than 15 % on a loaded CI machine)."""
PER_CONNECTION = 128 * 1024
"""An origin that caps each connection (a CDN's per-client cap, on loopback where every node has one
address): a node's 8 connections draw 1 MiB/s, a part takes ~12 s (the probe ~5), and two holders
draw twice what one does."""
TOTAL = 3 * MiB
"""An origin that caps its total: two holders draw what one does; the shard takes ~12 s."""


@pytest.fixture
def big_shard(tmp_path: Path) -> Iterator[Origin]:
    hub = tmp_path / "hub"
    with model_origin(
        hub, "acme/parts", total_bytes=SHARD, shards=1, seed=53, rate_per_connection=PER_CONNECTION
    ) as o:
        yield o


@pytest.fixture
def total_capped(tmp_path: Path) -> Iterator[Origin]:
    hub = tmp_path / "hub"
    with model_origin(hub, "acme/parts", total_bytes=SHARD, shards=1, seed=59, rate_total=TOTAL) as o:
        yield o


def part_holders(tracker, blob: str) -> list[str | None]:
    """Who holds each part's origin lease now."""
    return [lease_holder(tracker, part_key(blob, k, PARTS)) for k in range(PARTS)]


def lease_holder(tracker, key: str) -> str | None:
    lease = tracker.blob(key).get("lease")
    return str(lease["holder"]) if isinstance(lease, dict) else None


def watch_parts(tracker, blob: str, jobs) -> tuple[dict[int, set[str]], set[str], set[str]]:
    """Until the jobs are done: who held each part, who probed, and the verdicts seen held."""
    held: dict[int, set[str]] = {k: set() for k in range(PARTS)}
    probers: set[str] = set()
    verdicts: set[str] = set()
    while not all(j.done for j in jobs):
        for k, h in enumerate(part_holders(tracker, blob)):
            if h is not None:
                held[k].add(h)
        prober = lease_holder(tracker, admission_key(blob, PARTS, "probe"))
        probers.update([prober] if prober is not None else [])
        verdicts.update(v for v in (MORE, ONE) if lease_holder(tracker, admission_key(blob, PARTS, v)))
        time.sleep(0.2)
    return held, probers, verdicts


def job_json(job) -> dict:
    return job.status().to_json()


def three_nodes_fetch(origin: Origin, tracker, make_agent) -> tuple[list, list]:
    """Nodes a, b and c (parts settings) asked for the model at once: (agents, jobs)."""
    agents = [make_agent(n, origin, tracker, daemon=LEASE, **SPLIT) for n in ("a", "b", "c")]
    return agents, [d.request_model(origin.repo_id, "main") for d in agents]


@pytest.mark.timeout(150)
def test_each_node_pulls_one_part_from_the_origin_and_the_rest_from_the_others(
    big_shard, tracker, make_agent
):
    shard, blob = shard_blob(big_shard)
    agents, jobs = three_nodes_fetch(big_shard, tracker, make_agent)
    held, probers, verdicts = watch_parts(tracker, blob, jobs)
    # One node led (part 0), one probed with the last part and measured twice the rate: every node held a
    # part (the third, part 1, once the verdict said more holders pay).
    assert verdicts == {MORE}
    assert len(probers) == 1 and held[PARTS - 1] == probers
    assert set().union(*held.values()) == {d.node_id for d in agents}, held
    assert all(len(h) == 1 for h in held.values()), held  # nobody took a part over
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
    assert lease_holder(tracker, admission_key(blob, PARTS, MORE)) is None
    assert tracker.blob(blob).get("infohash") is not None


@pytest.mark.timeout(150)
def test_an_origin_capped_in_total_gets_no_more_holders_and_the_lead_pulls_the_parts_in_order(
    total_capped, tracker, make_agent
):
    shard, blob = shard_blob(total_capped)
    agents, jobs = three_nodes_fetch(total_capped, tracker, make_agent)
    held, probers, verdicts = watch_parts(tracker, blob, jobs)
    # Two holders drew what one did: the prober kept its part, the lead took the other two, in order,
    # and the third node pulled nothing from the origin. The verdict is published when the lead's rate
    # with the prober settled; on a loaded machine it may not within the shard's 12 s ("no steady origin
    # rate with a second node": one CI run, and 1 run of 9 here beside two CPU hogs), and the lead then
    # keeps ONE to itself, which changes none of the rest.
    assert verdicts <= {ONE}
    assert len(probers) == 1 and held[PARTS - 1] == probers
    (lead,) = held[0]
    assert held[1] == {lead} and lead not in probers
    for job in jobs:
        assert_ready(job, total_capped, 60)
    assert total_capped.hub.egress_bytes < 1.05 * total_capped.size
    by_node = {d.node_id: job_json(job) for d, job in zip(agents, jobs, strict=True)}
    (third,) = set(by_node) - {lead} - probers
    assert by_node[third]["bytes_from_origin"] < 2 * MiB, by_node[third]  # its small files at most
    assert by_node[lead]["bytes_from_origin"] >= 2 * SHARD // PARTS


@pytest.mark.timeout(150)
def test_a_forged_verdict_costs_speed_and_nothing_else(total_capped, tracker, make_agent):
    """The attack: a pod with the agents' token holds a blob's ONE verdict before anyone measured, to keep
    its parts with one node (holding MORE instead would send every node to the origin at once). The
    nodes take the verdict as it is, so it costs speed: one node pulls every part, in order; the
    bytes are still checked end to end and one copy leaves the origin."""
    shard, blob = shard_blob(total_capped)
    daemon = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN)
    forger = TrackerClient(tracker.url, TOKEN, daemon)
    try:
        assert forger.acquire_lease(admission_key(blob, PARTS, ONE), "forger", ttl=120).granted
        _, jobs = three_nodes_fetch(total_capped, tracker, make_agent)
        held, probers, _ = watch_parts(tracker, blob, jobs)
    finally:
        forger.close()
    assert not probers
    (lead,) = held[0]
    assert all(h == {lead} for h in held.values()), held
    for job in jobs:
        assert_ready(job, total_capped, 60)
    assert total_capped.hub.egress_bytes < 1.05 * total_capped.size


@pytest.mark.timeout(180)
def test_a_part_holder_killed_mid_part_is_taken_over_from_where_its_receivers_are(
    tmp_path, big_shard, tracker, make_agent
):
    shard, blob = shard_blob(big_shard)
    lead = make_agent("b", big_shard, tracker, daemon=LEASE, **SPLIT)
    jobs = [lead.request_model(big_shard.repo_id, "main")]
    loop_until(lambda: part_holders(tracker, blob)[0] == lead.node_id, timeout=30, what="b leads")
    a = AgentProcess(
        tmp_path, "a", big_shard.hub.url, tracker, "--lease-ttl", "3",
        "--origin-holders", str(PARTS), "--origin-part-min", str(8 * MiB),
    )
    a.start()
    try:
        admin_request(a.url, "POST", "/v1/fetch", json={"repo_id": big_shard.repo_id})
        c = make_agent("c", big_shard, tracker, daemon=LEASE, **SPLIT)
        jobs.append(c.request_model(big_shard.repo_id))
        a_id = f"a:{a.bt_port}"  # its node id: node name and BitTorrent port
        loop_until(lambda: a_id in part_holders(tracker, blob), timeout=30, what="a holds a part's lease")
        # Some of a's part has reached the lead (its own part 0 is ~2/3 in by then).
        loop_until(
            lambda: shard_status(jobs[0], shard)["done"] >= SHARD // 3, timeout=30, what="b has a third of it"
        )
        a.kill()
    finally:
        a.stop()
    for job in jobs:
        assert_ready(job, big_shard, 120)
    # The killed node's part was taken over where its receivers were: at most what a had pulled and not
    # yet relayed comes twice (its connections' other chunks of the part), not the part again.
    assert big_shard.hub.egress_bytes < 1.25 * big_shard.size


@pytest.mark.timeout(180)
def test_a_corrupt_origin_byte_in_one_part_is_caught_and_the_blob_fetched_again(
    big_shard, tracker, make_agent
):
    shard, _ = shard_blob(big_shard)
    big_shard.hub.faults.corrupt_paths = {shard}
    big_shard.hub.faults.corrupt_times = 1  # the first range a part holder asks for
    _, jobs = three_nodes_fetch(big_shard, tracker, make_agent)
    # Every node checks the whole blob's sha256: the flipped byte, relayed to the others, fails it there
    # too; each drops the blob and fetches it whole, and ends with the origin's bytes.
    for job in jobs:
        assert_ready(job, big_shard, 120)


@pytest.mark.timeout(120)
def test_an_origin_dropping_connections_mid_range_does_not_reach_the_parts(big_shard, tracker, make_agent):
    big_shard.hub.faults.truncate_after = 100_000
    big_shard.hub.faults.truncate_times = 4
    _, jobs = three_nodes_fetch(big_shard, tracker, make_agent)
    for job in jobs:
        assert_ready(job, big_shard, 60)
    assert big_shard.hub.egress_bytes < 1.05 * big_shard.size


@pytest.mark.timeout(180)
def test_a_tracker_restart_mid_transfer_loses_no_part_and_pulls_no_part_twice(big_shard, tracker, make_agent):
    """SIGKILL the tracker once a quarter of the shard has left the origin (during the measurement or
    just after it), start it again 3 s later: holders keep pulling and relaying, their heartbeats take
    their part and admission leases back, and nobody pulls a part that has a holder."""
    fetch_through_a_restart(big_shard, tracker, make_agent, tracker, down=3.0)


def fetch_through_a_restart(origin: Origin, tracker, make_agent, proc, down: float) -> None:
    """Nodes a, b and c fetch the model while `proc` (the tracker, or its redis-server) is SIGKILLed once
    a quarter of the shard has left the origin and started again `down` s later: every node ends with
    the right bytes, and no part came from the origin twice."""
    _, jobs = three_nodes_fetch(origin, tracker, make_agent)
    restarted: list[float] = []
    blip = threading.Thread(target=restart_when_busy, args=(proc, origin, restarted, down), daemon=True)
    blip.start()
    for job in jobs:
        assert_ready(job, origin, 120)
    blip.join(30)
    assert restarted and restarted[0] < origin.size * 0.9, "it was not restarted mid-transfer"
    assert origin.hub.egress_bytes < 1.1 * origin.size


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_a_redis_restart_without_its_data_mid_transfer_loses_no_part_and_pulls_no_part_twice(
    tmp_path, big_shard, make_agent
):
    """The tracker of a fleet keeps its state in Redis; restarted without its data once a quarter of the
    shard has left the origin, it loses every part lease, admission lease and verdict at once. Their
    holders' next heartbeats (a second apart here) take them back, a node that holds a part never asks
    for another while it pulls, so nobody pulls a part twice, and the blob is published in the new Redis
    at the end."""
    redis = RedisProcess(tmp_path)
    redis.start()
    tracker = TrackerProcess(tmp_path, redis.url)
    tracker.start()
    try:
        _, blob = shard_blob(big_shard)
        fetch_through_a_restart(big_shard, tracker, make_agent, redis, down=2.0)
        assert tracker.blob(blob).get("infohash") is not None
        assert part_holders(tracker, blob) == [None] * PARTS
    finally:
        tracker.stop()
        redis.stop()


@pytest.mark.timeout(180)
def test_huggingface_hub_streams_a_blob_coming_in_parts_without_a_retry(
    big_shard, tracker, make_agent, tmp_path, caplog
):
    """The stock client at its default timeouts (10 s read), through node b's HF endpoint while b
    receives the blob in parts: the endpoint streams b's contiguous prefix, which grows from the lead's
    part 0 into the parts the others pull; it never waits on a part long enough to time the client out."""
    shard, blob = shard_blob(big_shard)
    agents, jobs = three_nodes_fetch(big_shard, tracker, make_agent)
    caplog.set_level(logging.WARNING, logger="huggingface_hub")
    got: dict[str, object] = {}

    def download() -> None:
        started = time.monotonic()
        try:
            got["path"] = hf_hub_download(
                big_shard.repo_id, shard, endpoint=agents[1].api_url, cache_dir=tmp_path / "c", token=False
            )
        except Exception as exc:  # reported below, in the test's thread
            got["error"] = exc
        got["took"] = time.monotonic() - started

    client = threading.Thread(target=download, daemon=True)
    client.start()
    held, _, verdicts = watch_parts(tracker, blob, jobs)
    client.join(60)
    assert "error" not in got and "path" in got, got
    assert Path(str(got["path"])).read_bytes() == big_shard.files[shard]
    # Parts were in play: more than one node pulled the blob. (Not necessarily three: under a loaded CI
    # machine the lead once took part 1 over before the third node asked, as it should.)
    assert verdicts == {MORE} and len(set().union(*held.values())) >= 2, held
    assert float(str(got["took"])) > constants.HF_HUB_DOWNLOAD_TIMEOUT, got  # else it proves nothing
    assert client_warnings(caplog) == []  # no "timed out", no "Trying to resume download"
    assert big_shard.hub.egress_bytes < 1.05 * big_shard.size
