"""Warm starts over the relay (agent.relay.directory "Warm starts"): a large blob some node has whole comes
as a chain of relays, one stream per node, before BitTorrent; a seed that hangs or serves bad bytes
leaves the receiver to finish by BitTorrent with the right bytes. Real tracker, real daemons (one a
subprocess, to be stopped), a test hub."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agent.core import hashing
from agent.core.settings import DaemonSettings
from agent.core.swarm_settings import SwarmSettings
from agent.relay.directory import (
    NEXT_HEADER,
    RELAY_PATH,
    RelayDirectory,
    rank_key,
    relay_credential,
    relay_infohash,
)
from agent.tracking.client import TrackerClient
from tests.support.cluster import (
    PASSKEY,
    TOKEN,
    AgentProcess,
    Origin,
    admin_request,
    assert_snapshot_verifies,
    fetch_and_wait,
    model_origin,
    wait_until_seeded,
)
from tests.support.procs import loop_until

MiB = 2**20
SHARD = 24 * MiB  # relayed: 16 MiB or more


@pytest.fixture
def one_shard(tmp_path: Path) -> Iterator[Origin]:
    with model_origin(tmp_path / "hub", "acme/warm", total_bytes=SHARD, shards=1, seed=61) as o:
        yield o


def shard(origin: Origin) -> tuple[str, bytes]:
    path = next(p for p in origin.files if p.endswith(".safetensors"))
    return path, origin.files[path]


def shard_blob(origin: Origin) -> str:
    return hashlib.sha256(shard(origin)[1]).hexdigest()


def torrent_bytes(daemon, blob: str) -> tuple[int, int]:
    """(bytes from BitTorrent peers, from web seeds) of the daemon's torrent of the blob."""
    st = daemon.swarm.status(daemon.held_blobs()[blob])
    return st.bytes_from_peers, st.bytes_from_web_seeds


def offered(tracker, blob: str, port: int = 7471) -> list:
    """The relay sources the tracker lists for the blob (asked as a node of its own)."""
    settings = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    client, peer_id = TrackerClient(tracker.url, TOKEN, settings), b"-WS0001-" + os.urandom(6).hex().encode()
    try:
        peers = client.announce(relay_infohash(blob), peer_id, port, 100).peers
        client.announce(relay_infohash(blob), peer_id, port, 0, "stopped", numwant=0)
    finally:
        client.close()
    return peers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("relay_seeds", [True, False])
def test_a_blob_a_node_has_whole_comes_over_the_relay_before_bittorrent(
    one_shard, tracker, make_agent, relay_seeds, monkeypatch
):
    blob = shard_blob(one_shard)
    a = make_agent("a", one_shard, tracker, relay_seeds=relay_seeds)
    fetch_and_wait(a, one_shard.repo_id)
    wait_until_seeded(tracker, a)
    if relay_seeds:
        loop_until(lambda: len(offered(tracker, blob)) == 1, timeout=10, what="a offers the blob")
    one_shard.hub.reset_counters()
    piece_hashed: list[int] = []

    class CountingPieceHasher(hashing.PieceHasher):
        def update(self, data: bytes | bytearray | memoryview) -> None:
            piece_hashed.append(memoryview(data).nbytes)
            super().update(data)

    monkeypatch.setattr(hashing, "PieceHasher", CountingPieceHasher)  # b runs in this process
    b = make_agent("b", one_shard, tracker, relay_seeds=relay_seeds)
    status = fetch_and_wait(b, one_shard.repo_id)
    assert_snapshot_verifies(status["snapshot"], one_shard)
    path, data = shard(one_shard)
    assert next(f for f in status["files"] if f["path"] == path)["source"] == "peers"
    assert one_shard.hub.egress_bytes < 64 * 1024  # the shard from a (a small file may come from the hub)
    # Over the relay, libtorrent brought none of it (b seeds it now); without, BitTorrent brought it all.
    assert torrent_bytes(b, blob) == ((0, 0) if relay_seeds else (len(data), 0))
    # Either way b seeds it under a's metainfo, whose piece hashes it took: the sha256 checked the bytes.
    assert b.held_blobs()[blob] == a.held_blobs()[blob]
    assert sum(piece_hashed) == 0


def test_a_seed_relays_a_whole_blob_to_one_agent_at_a_time_and_to_agents_only(one_shard, tracker, make_agent):
    """The attacks: a pod that reaches the agent's port asks for a seeded blob's bytes, with no credential or
    from an address no agent announced from. And the chain: a second stream of a whole blob is refused while
    one runs (the receiver then asks the node that receives it), so each uplink carries it once."""
    blob = shard_blob(one_shard)
    a = make_agent("a", one_shard, tracker)
    fetch_and_wait(a, one_shard.repo_id)
    url = f"{a.api_url}{RELAY_PATH}{blob}"
    assert httpx.get(url, timeout=10).status_code == 404  # no credential
    assert httpx.get(url, headers={"Authorization": "Bearer guess"}, timeout=10).status_code == 404
    good = {"Authorization": f"Bearer {relay_credential(a.settings)}", "Range": "bytes=0-"}
    outsider = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=outsider, timeout=10) as client:
        assert client.get(url, headers=good).status_code == 503  # the credential alone is not enough

    data = shard(one_shard)[1]
    tail = {**good, "Range": f"bytes={len(data) - 10}-"}
    with httpx.Client(timeout=10) as first, httpx.Client(timeout=10) as second:
        # The gate admits 127.0.0.1 once it has seen an agent announce from it.
        loop_until(lambda: first.get(url, headers=tail).status_code == 206, timeout=10, what="an agent")
        assert first.get(url, headers=tail).content == data[-10:]
        with first.stream("GET", url, headers=good) as resp:
            assert resp.status_code == 206
            body = resp.iter_bytes()
            got = bytearray(next(body))
            busy = second.get(url, headers=tail)
            assert busy.status_code == 503  # one stream of a whole blob at a time
            # The node it streams to: a receiver asks it next (down the chain), not every source in turn.
            assert busy.headers[NEXT_HEADER] == "127.0.0.1"
            for chunk in body:
                got += chunk
        assert hashlib.sha256(got).hexdigest() == blob
        # Once the first is over, the next is served.
        loop_until(lambda: second.get(url, headers=tail).status_code == 206, timeout=10, what="a 2nd stream")


@pytest.mark.timeout(150)
def test_a_hung_seed_leaves_the_receiver_to_bittorrent_from_the_others(
    tmp_path, one_shard, tracker, make_agent, caplog, receive_path
):
    """A seed that offers the blob and then answers nothing (a stopped process: its sockets accept, nothing
    reads them): the receiver gives up on it after the relay's stall time and takes the blob by BitTorrent
    from a seed that does not offer it over the relay."""
    blob = shard_blob(one_shard)
    hung = AgentProcess(tmp_path, "hung", one_shard.hub.url, tracker)
    hung.start()
    try:
        admin_request(hung.url, "POST", "/v1/fetch", json={"repo_id": one_shard.repo_id})
        # Listed as a relay source while it pulls the blob, and on as a seed once it has it whole.
        loop_until(lambda: int(tracker.blob(blob).get("seeders") or 0) == 1, timeout=60, what="hung seeds")
        assert len(offered(tracker, blob)) == 1
        good = make_agent("good", one_shard, tracker, relay_seeds=False)  # BitTorrent only
        fetch_and_wait(good, one_shard.repo_id)
        assert hung.proc is not None
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            b = make_agent("b", one_shard, tracker, daemon={"lease_stall_min": 3.0, "lease_ttl": 3.0})
            caplog.set_level("INFO", logger="agent.relay.receiver")
            status = fetch_and_wait(b, one_shard.repo_id, timeout=100)
            assert_snapshot_verifies(status["snapshot"], one_shard)
            assert f"relay source {hung.api_url} stopped at byte 0" in caplog.text  # it asked hung first
            assert torrent_bytes(b, blob)[0] == len(shard(one_shard)[1])  # all of it by BitTorrent, from good
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
    finally:
        hung.stop()


@pytest.mark.timeout(150)
def test_a_seed_with_a_corrupt_copy_costs_the_receiver_one_stream_not_its_bytes(
    one_shard, tracker, make_agent, caplog, receive_path
):
    """A seed's file changed on disk after it was verified (a bad disk, a hand edit): what it relays fails
    the receiver's sha256, which drops it and takes the blob by BitTorrent (whose piece hashes refuse the
    bad seed's bad piece) or, where BitTorrent keeps failing, by the origin-lease path."""
    blob = shard_blob(one_shard)
    bad = make_agent("bad", one_shard, tracker)
    fetch_and_wait(bad, one_shard.repo_id)
    good = make_agent("good", one_shard, tracker, relay_seeds=False)  # seeds by BitTorrent only
    fetch_and_wait(good, one_shard.repo_id)
    path = bad.swarm.status(bad.held_blobs()[blob]).path
    stat = path.stat()
    with open(path, "r+b") as fh:  # one byte in the middle, the file's times kept
        fh.seek(len(shard(one_shard)[1]) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    loop_until(lambda: len(offered(tracker, blob)) == 1, timeout=10, what="only bad offers the blob")
    b = make_agent("b", one_shard, tracker)
    caplog.set_level("WARNING", logger="agent.relay.receiver")
    status = fetch_and_wait(b, one_shard.repo_id)
    assert_snapshot_verifies(status["snapshot"], one_shard)
    assert "relayed bytes fail the blob's sha256" in caplog.text  # b took bad's stream, then dropped it
    receive_path.assert_taken()
    # BitTorrent brought the blob, or the trust rule gave up on it: on loopback libtorrent's ban of bad does
    # not hold (SwarmSettings.allow_multiple_connections_per_ip), so bad can reconnect and serve its bad
    # piece again until b has had nothing from peers for a while (seen in CI, 1 run in many).
    assert torrent_bytes(b, blob)[0] > 0 or "taking the origin-lease path" in caplog.text


def test_a_seeded_blob_is_offered_on_refresh_and_withdrawn_once_it_is_gone(tracker):
    settings = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    blob = hashlib.sha256(b"a blob seeded whole").hexdigest()
    seeds: set[str] = {blob}
    client = TrackerClient(tracker.url, TOKEN, settings)
    try:
        directory = RelayDirectory(client, lambda: 7470, "credential", lambda _host: True)
        directory.seeds = lambda: set(seeds)
        directory.refresh()
        assert offered(tracker, blob) == [("127.0.0.1", 7470)]
        seeds.clear()  # removed, evicted
        directory.refresh()
        assert offered(tracker, blob) == []
    finally:
        client.close()


def test_only_a_node_without_an_upload_cap_passes_whole_blobs_on_over_the_relay():
    """`--upload-rate-limit` caps libtorrent, not the relay: a capped node neither offers its seeds nor
    takes a chain (where it would pass the stream on), so the cap keeps holding for whole blobs."""
    sw = SwarmSettings()
    assert sw.chains_seeds
    assert not dataclasses.replace(sw, upload_rate_limit=2**20).chains_seeds
    assert not dataclasses.replace(sw, relay_fanout=0).chains_seeds
    assert not dataclasses.replace(sw, relay_seeds=False).chains_seeds


def test_receivers_that_ask_at_once_each_find_a_place_of_their_own_in_the_seeds_chains(tracker):
    """A warm start's receivers find their sources in one look each (RelayDirectory.place), not by a
    search: each seed heads a chain, and each receiver follows the node the tracker counted as many places
    before it as there are seeds. Asked at once, no source is any two receivers', and every chain leads
    back to a seed."""
    settings = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    blob = hashlib.sha256(b"a blob two seeds have whole").hexdigest()
    clients = [TrackerClient(tracker.url, TOKEN, settings) for _ in range(10)]
    try:
        nodes = [
            RelayDirectory(c, lambda port=7400 + i: port, "credential", lambda _host: True)
            for i, c in enumerate(clients)
        ]
        seeds, receivers = nodes[:2], nodes[2:]
        for seed in seeds:
            seed.seeds = lambda: {blob}
            seed.refresh()
        with ThreadPoolExecutor(len(receivers)) as pool:
            places = list(pool.map(lambda node: node.place(blob, SHARD), receivers))
        before = {f"http://127.0.0.1:{n.port}": place for n, place in zip(receivers, places, strict=True)}
        assert None not in places, before
        assert len(set(places)) == len(receivers), before
        heads = set()
        for node in before:
            seen: set[str | None] = set()
            while node in before:
                assert node not in seen, before
                seen.add(node)
                node = before[node]
            heads.add(node)
        assert heads == {"http://127.0.0.1:7400", "http://127.0.0.1:7401"}
    finally:
        for c in clients:
            c.close()


def test_a_receiver_whose_node_before_never_says_where_it_is_looks_for_any_source(tracker):
    """A node counted among a blob's receivers that never says where it is (it stopped, or its tracker
    request failed) leaves the node after it without a place within about a second: that node then
    walks the sources as any receiver does (agent.relay.receiver)."""
    settings = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    blob = hashlib.sha256(b"a blob whose first receiver went quiet").hexdigest()
    seed_client, client = (TrackerClient(tracker.url, TOKEN, settings) for _ in range(2))
    try:
        seed = RelayDirectory(seed_client, lambda: 7400, "credential", lambda _host: True)
        seed.seeds = lambda: {blob}
        seed.refresh()
        client.announce(rank_key(blob), b"-WS0001-" + b"q" * 12, 7401, 1)  # counted, never placed
        receiver = RelayDirectory(client, lambda: 7402, "credential", lambda _host: True)
        started = time.monotonic()
        assert receiver.place(blob, SHARD) is None
        assert time.monotonic() - started < 5
    finally:
        seed_client.close()
        client.close()


def test_a_lease_holder_that_finishes_heads_the_chain_of_the_next_warm_start_at_once(tracker):
    """A holder joins a blob's relay sources as a receiver (bytes left); once it has the blob whole and
    seeds it, the tracker lists it as a seeder when it leaves, not at its next refresh (up to an announce
    interval later), so that a node starting warm a moment later takes its place behind it in one look
    (its rank, its place, the sources: three announces, no polling for the node before it). With no seed
    listed at all, a receiver has no chain and looks for any source at once."""
    settings = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    blob = hashlib.sha256(b"a blob its lease holder just finished").hexdigest()
    holder_client, client = (TrackerClient(tracker.url, TOKEN, settings) for _ in range(2))
    announces = 0
    announce = client.announce

    def counted(*args, **kwargs):
        nonlocal announces
        announces += 1
        return announce(*args, **kwargs)

    client.announce = counted  # type: ignore[method-assign]
    try:
        holder = RelayDirectory(holder_client, lambda: 7400, "credential", lambda _host: True)
        receiver = RelayDirectory(client, lambda: 7401, "credential", lambda _host: True)
        holder.join(blob, SHARD)
        assert receiver.place(blob, SHARD) is None  # the holder is still arriving: not a chain's head
        assert announces == 3
        receiver.leave(blob)
        holder.seeds = lambda: {blob}
        holder.leave(blob)  # whole now, and seeded here
        announces = 0
        assert receiver.place(blob, SHARD) == "http://127.0.0.1:7400"
        assert announces == 3
    finally:
        holder_client.close()
        client.close()
