"""Interop with a standard BitTorrent client (aria2c, Debian package aria2) through our tracker.

Both directions, with real agents, a real tracker and a real aria2c process on 127.0.0.1:
aria2c downloads a blob that only an agent seeds, from a .torrent built out of the tracker's
metainfo; and an agent whose origin does not exist fetches a model that only aria2c seeds
(metainfo published to the tracker by hand), so every byte must come from aria2c.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.cache.layout import RepoCache, StateDir
from agent.daemon.node import Daemon
from agent.fetch.entitlement import Entitlements
from tests.support.cluster import (
    TrackerProcess,
    agent_settings,
    assert_snapshot_verifies,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.support.procs import free_port, loop_until, require, stop_process
from wirekit.bencode import bdecode, bencode


@pytest.fixture(autouse=True)
def _aria2c() -> None:
    if shutil.which("aria2c") is None:
        require("aria2c", "Debian package aria2 (./dev installs it)")


_ARIA2_ISOLATED = [
    "--enable-dht=false",
    "--enable-dht6=false",
    "--bt-enable-lpd=false",
    "--enable-peer-exchange=false",
    "--bt-tracker-connect-timeout=10",
    "--bt-tracker-timeout=10",
    "--summary-interval=0",
    "--show-console-readout=false",
    "--max-concurrent-downloads=64",  # default 5: a model has more blobs, each its own torrent
    "--console-log-level=warn",
    "--no-conf",
]


def _torrent(tracker: TrackerProcess, blob_id: str, path: Path) -> Path:
    """A .torrent for one blob: the tracker's metainfo (the info dict) plus its announce URL."""
    resp = httpx.get(f"{tracker.url}/v1/blobs/{blob_id}/metainfo", headers=tracker.auth, timeout=10)
    assert resp.status_code == 200, resp.text
    path.write_bytes(bencode({"announce": tracker.announce_url, "info": bdecode(resp.content)}))
    return path


def _seeders(tracker: TrackerProcess, blob_id: str) -> int:
    return int(tracker.blob(blob_id).get("seeders") or 0)


@pytest.fixture
def aria2c(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """aria2c processes a test starts; each one stopped by PID at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        stop_process(p)


def test_aria2c_downloads_a_blob_from_an_agent_through_the_tracker(tmp_path, origin, tracker, make_agent):
    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    wait_until_seeded(tracker, a)
    origin.hub.reset_counters()
    shard = max(origin.files, key=lambda p: len(origin.files[p]))
    cache = RepoCache(a.settings.cache_dir, a.settings.state_dir, origin.repo_id)
    blob_id = next(b for b in a.held_blobs() if cache.blob_path(b).read_bytes() == origin.files[shard])
    torrent = _torrent(tracker, blob_id, tmp_path / "shard.torrent")
    out = tmp_path / "aria2"
    out.mkdir()
    proc = subprocess.run(
        [
            "aria2c",
            "--dir",
            str(out),
            "--seed-time=0",
            "--listen-port",
            str(free_port()),
            "--check-integrity=true",
            *_ARIA2_ISOLATED,
            str(torrent),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (out / blob_id).read_bytes() == origin.files[shard]
    assert file_requests(origin.hub) == []  # the bytes came from the agent, not the origin
    assert a.swarm is not None and a.swarm.status(a.held_blobs()[blob_id]).bytes_uploaded >= len(
        origin.files[shard]
    )


def test_agent_fetches_a_model_only_aria2c_seeds(tmp_path, origin, tracker, make_agent, aria2c):
    # A fetches once, so the tracker has the model's manifest and every blob's metainfo; then A leaves.
    a = make_agent("a", origin, tracker)
    commit = fetch_and_wait(a, origin.repo_id)["commit"]
    blobs = dict(a.held_blobs())
    cache = RepoCache(a.settings.cache_dir, a.settings.state_dir, origin.repo_id)
    seed_dir = tmp_path / "aria2-seed"
    seed_dir.mkdir()
    torrents = []
    for blob_id in blobs:
        shutil.copyfile(cache.blob_path(blob_id), seed_dir / blob_id)
        torrents.append(str(_torrent(tracker, blob_id, tmp_path / f"{blob_id}.torrent")))
    a.stop()  # its "stopped" announces leave aria2c as the only seeder
    loop_until(lambda: all(_seeders(tracker, b) == 0 for b in blobs), timeout=30, what="A gone")

    # aria2c checks the files against the piece hashes (-V) and seeds them.
    log = tmp_path / "aria2c.log"
    with open(log, "wb") as fh:
        aria2c.append(
            subprocess.Popen(
                [
                    "aria2c",
                    "-V",
                    "--seed-ratio=0.0",
                    "--seed-time=5",
                    "--dir",
                    str(seed_dir),
                    "--listen-port",
                    str(free_port()),
                    *_ARIA2_ISOLATED,
                    *torrents,
                ],
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        )
    loop_until(
        lambda: all(_seeders(tracker, b) == 1 for b in blobs), timeout=60, what=f"aria2c seeding ({log})"
    )

    # B's origin is a port nothing listens on: the plan comes from the tracker's manifest, the bytes
    # from aria2c, because there is nowhere else to get them. B fetched this model before, when the
    # origin reported it public (its record, agent.fetch.entitlement): without one, an origin that
    # cannot be asked lets no node plan from the tracker.
    dead_origin = f"http://127.0.0.1:{free_port()}"
    settings = agent_settings(tmp_path, "b", dead_origin, tracker)
    Entitlements(StateDir(settings.state_dir)).record(origin.repo_id, "main", commit, public=True, token=None)
    b = Daemon(settings)
    try:
        b.start()
        status = fetch_and_wait(b, origin.repo_id, timeout=120)
    finally:
        b.stop()
    assert_snapshot_verifies(status["snapshot"], origin)
    assert status["bytes_from_origin"] == 0
    assert status["bytes_from_peers"] >= origin.size
    assert all(f["source"] == "peers" for f in status["files"]), status["files"]
    assert aria2c[0].poll() is None, log.read_text()[-2000:]
