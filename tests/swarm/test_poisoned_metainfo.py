"""Recovery from a poisoner and from a stalled lease holder (issue 12, item 4).

A poisoner holds the agent-role token: it publishes, first, an info dict for a blob computed over other
bytes of the same size, and seeds those bytes from a plain libtorrent session on its own address
(127.0.0.2, so that banning it does not ban the honest agents on 127.0.0.1). Honest agents must still
end Ready with the origin's bytes, the tracker must end up with the metainfo of the true bytes, and the
poisoner must be banned. A lease holder whose heartbeats go on while its bytes do not must not make
others wait for it.

Real agents, a real tracker process, a real test hub, all on loopback.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import libtorrent as lt
import pytest

from tests.support.cluster import (
    Origin,
    TrackerProcess,
    assert_snapshot_verifies,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.support.procs import loop_until
from wirekit.bencode import bdecode, bencode

POISONER = "127.0.0.2"
PIECE = 64 * 1024


def _info(data: bytes, name: str, piece_length: int = PIECE) -> bytes:
    """A canonical single-file info dict of `data`, computed here (not by the code under test)."""
    pieces = b"".join(
        hashlib.sha1(data[i : i + piece_length]).digest() for i in range(0, len(data), piece_length)
    )
    return bencode({"length": len(data), "name": name, "piece length": piece_length, "pieces": pieces})


def _shard(origin: Origin) -> tuple[str, str, bytes]:
    """(repo path, blob id, bytes) of the model's first shard."""
    path = sorted(p for p in origin.files if p.endswith(".safetensors"))[0]
    data = origin.files[path]
    return path, hashlib.sha256(data).hexdigest(), data


POISONER_RATE = 512 * 1024
"""Bytes/s the poisoner sends. A node learns which seeds sent a torrent by sampling its connections
(agent.swarm.session, at the first verified piece, then every 0.5 s); a 1 MiB shard sent at full
loopback speed can arrive, and its seed leave, before a loaded machine's alert thread first looks (CI:
nobody to ban). A real shard takes seconds; so does this one."""


class Poisoner:
    """A rogue node: a plain libtorrent session on 127.0.0.2 seeding `data` under `info`."""

    def __init__(self, tmp: Path, tracker: TrackerProcess, blob_id: str, data: bytes, info: bytes) -> None:
        self.dir = tmp / "poisoner"
        self.dir.mkdir()
        (self.dir / blob_id).write_bytes(data)
        self.ses = lt.session(
            {
                "listen_interfaces": f"{POISONER}:0",
                "outgoing_interfaces": POISONER,
                "enable_dht": False,
                "enable_lsd": False,
                "enable_upnp": False,
                "enable_natpmp": False,
                "enable_outgoing_utp": False,
                "enable_incoming_utp": False,
                "min_announce_interval": 1,
                "upload_rate_limit": POISONER_RATE,
            }
        )
        # libtorrent exempts loopback peers from rate limits (its "local" peer class): not these.
        everyone = lt.ip_filter()
        everyone.add_rule("0.0.0.0", "255.255.255.255", 1 << lt.session.global_peer_class_id)
        self.ses.set_peer_class_filter(everyone)
        atp = lt.add_torrent_params()
        atp.ti = lt.torrent_info(b"d4:info" + info + b"e")
        atp.save_path = str(self.dir)
        # Every piece claimed as had, none checked (not seed mode, which checks each piece before
        # sending it): the poisoner serves `data` whether or not it matches `info`.
        atp.have_pieces = [True] * atp.ti.num_pieces()
        atp.trackers = [tracker.announce_url]
        self.handle = self.ses.add_torrent(atp)
        self.infohash = hashlib.sha1(info).hexdigest()

    def uploaded(self) -> int:
        return int(self.handle.status().total_payload_upload)

    def close(self) -> None:
        self.ses.remove_torrent(self.handle)
        del self.ses


@pytest.fixture
def publish_as_poisoner(tmp_path: Path, tracker: TrackerProcess) -> Iterator[Any]:
    started: list[Poisoner] = []

    def start(blob_id: str, info: bytes, seeded: bytes) -> Poisoner:
        """PUT `info` for `blob_id` first (with the agent-role token), then seed `seeded` under it."""
        put = httpx.put(
            f"{tracker.url}/v1/blobs/{blob_id}/metainfo",
            content=info,
            headers={**tracker.auth, "Content-Type": "application/x-bittorrent"},
            timeout=10,
        )
        assert put.status_code == 201, put.text
        p = Poisoner(tmp_path, tracker, blob_id, seeded, info)
        started.append(p)
        loop_until(lambda: tracker.blob(blob_id)["seeders"] == 1, timeout=20, what="poisoner seeding")
        return p

    yield start
    for p in started:
        p.close()


def _metainfo(tracker: TrackerProcess, blob_id: str) -> bytes | None:
    resp = httpx.get(f"{tracker.url}/v1/blobs/{blob_id}/metainfo", headers=tracker.auth, timeout=10)
    return resp.content if resp.status_code == 200 else None


def _quarantine(tracker: TrackerProcess, blob_id: str) -> list[dict[str, Any]]:
    url = f"{tracker.url}/v1/blobs/{blob_id}/metainfo/quarantine"
    resp = httpx.get(url, headers=tracker.auth, timeout=10)
    resp.raise_for_status()
    return list(resp.json()["quarantined"])


def _assert_true_metainfo(tracker: TrackerProcess, blob_id: str, data: bytes, not_this: str) -> None:
    """The tracker's metainfo of the blob now describes `data`: every piece hash recomputed here."""
    info = _metainfo(tracker, blob_id)
    assert info is not None, "no metainfo re-published"
    d = bdecode(info)
    assert d[b"name"] == blob_id.encode() and d[b"length"] == len(data)
    assert info == _info(data, blob_id, d[b"piece length"]), "the published pieces are not the true ones"
    assert hashlib.sha1(info).hexdigest() != not_this


def test_bytes_that_match_a_poisoned_metainfo_are_refused_and_the_metainfo_replaced(
    origin, tracker, make_agent, publish_as_poisoner
):
    path, blob_id, data = _shard(origin)
    fake = bytes(b ^ 0x5A for b in data)  # other bytes, same size
    poisoner = publish_as_poisoner(blob_id, _info(fake, blob_id), fake)

    honest = make_agent("honest", origin, tracker)
    status = fetch_and_wait(honest, origin.repo_id, timeout=60)
    assert_snapshot_verifies(status["snapshot"], origin)
    assert poisoner.uploaded() >= len(data) // 2, "the honest agent did take the poisoned bytes first"
    assert next(f["source"] for f in status["files"] if f["path"] == path) == "origin"

    # Reported and quarantined; the metainfo of the verified bytes published in its place.
    records = _quarantine(tracker, blob_id)
    assert [(r["infohash"], r["reporter"]) for r in records] == [(poisoner.infohash, honest.node_id)]
    _assert_true_metainfo(tracker, blob_id, data, not_this=poisoner.infohash)

    # The poisoner is banned: it cannot even connect to take the true blob.
    assert honest.swarm is not None and POISONER in honest.swarm.banned()
    good = _metainfo(tracker, blob_id)
    assert good is not None
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(b"d4:info" + good + b"e")
    atp.save_path = str(poisoner.dir / "leech")
    leech = poisoner.ses.add_torrent(atp)
    leech.connect_peer(("127.0.0.1", honest.swarm.listen_port))
    # Nothing to wait for when nothing may happen: a loopback connection and the first blocks of an
    # unbanned peer take milliseconds (without the ban the whole blob arrives within this window).
    time.sleep(3)
    assert leech.status().total_payload_download == 0
    poisoner.ses.remove_torrent(leech)

    # The cluster recovered: the next node takes every byte from the honest one.
    wait_until_seeded(tracker, honest)
    origin.hub.reset_counters()
    late = make_agent("late", origin, tracker)
    status = fetch_and_wait(late, origin.repo_id, timeout=60)
    assert_snapshot_verifies(status["snapshot"], origin)
    assert status["bytes_from_origin"] == 0 and file_requests(origin.hub) == []


def test_pieces_that_fail_a_poisoned_metainfo_send_the_node_to_the_origin(
    origin, tracker, make_agent, publish_as_poisoner
):
    """The poisoner seeds the true bytes under piece hashes of other bytes: every piece fails. That
    alone proves nothing (corrupt peers look the same), so the node takes the blob from the origin
    without a report; holding verified bytes, it finds the published dict does not match them, and
    only then reports and replaces it."""
    path, blob_id, data = _shard(origin)
    fake = bytes(b ^ 0x5A for b in data)
    poisoner = publish_as_poisoner(blob_id, _info(fake, blob_id), data)

    honest = make_agent("honest", origin, tracker)
    started = time.monotonic()
    status = fetch_and_wait(honest, origin.repo_id, timeout=60)
    assert time.monotonic() - started < 20, "well before the 20 s stall timeout"
    assert_snapshot_verifies(status["snapshot"], origin)
    assert next(f["source"] for f in status["files"] if f["path"] == path) == "origin"
    records = _quarantine(tracker, blob_id)
    assert [r["infohash"] for r in records] == [poisoner.infohash]
    assert "do not match bytes verified end to end" in records[0]["reason"]
    _assert_true_metainfo(tracker, blob_id, data, not_this=poisoner.infohash)


class GhostHolder:
    """A lease holder that heartbeats (ttl 60 s) and reports `progress`, which the test moves or not."""

    def __init__(self, tracker: TrackerProcess, blob_id: str) -> None:
        self.url = f"{tracker.url}/v1/leases/{blob_id}"
        self.auth = tracker.auth
        self.progress = 0
        self.moving = True
        self.answers: list[int] = []
        self._stop = threading.Event()
        granted = httpx.post(self.url, json={"node_id": "ghost", "ttl": 60}, headers=self.auth, timeout=10)
        assert granted.json()["granted"]
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            if self.moving:
                self.progress += 64 * 1024
            body = {"node_id": "ghost", "ttl": 60, "progress": self.progress}
            self.answers.append(httpx.post(f"{self.url}/heartbeat", json=body, headers=self.auth).status_code)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_waiter_takes_over_the_lease_of_a_holder_that_makes_no_progress(origin, tracker, make_agent):
    _path, blob_id, _data = _shard(origin)
    ghost = GhostHolder(tracker, blob_id)
    try:
        # lease_ttl 6 s: a holder whose bytes stay the same for 4 s (two heartbeats) counts as stalled.
        short = {"lease_ttl": 6.0, "lease_stall_min": 1.0, "max_wait_seconds": 300.0}
        agent = make_agent("waiter", origin, tracker, daemon=short)
        job = agent.request_model(origin.repo_id, "main")
        assert not job.wait(8), "a holder whose bytes move keeps its lease, and the waiter waits"
        assert tracker.blob(blob_id)["holders"] == ["ghost"]

        ghost.moving = False  # the heartbeats go on, the bytes stop
        stalled = time.monotonic()
        assert job.wait(30), job.status()
        took = time.monotonic() - stalled
        status = job.status().to_json()
        assert status["phase"] == "Ready", status
        assert_snapshot_verifies(status["snapshot"], origin)
        assert took < 6.0 + 4.0, f"took {took:.1f}s: not well before the ghost's 60 s lease TTL"
        # The ghost learns it lost the lease: held by the waiter (409), or released by it already (404).
        loop_until(lambda: {404, 409} & set(ghost.answers), timeout=5, what="the ghost's heartbeat refused")
    finally:
        ghost.stop()
