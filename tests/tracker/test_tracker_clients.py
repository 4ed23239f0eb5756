"""Real BitTorrent clients complete downloads through the tracker: libtorrent and aria2c.

Peers find each other only through the tracker (no DHT, LSD, PEX, or direct connects).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port, kill_process, loop_until, require, require_module
from tests.tracker.test_tracker_fixtures import AUTH, TOKEN, Tracker, make_info, run_server
from tracker.bencode import bdecode, bencode
from tracker.settings import TrackerSettings

lt = require_module("libtorrent", "a dependency of weightswarm: pip install -e '.[dev]' (./dev does)")

DATA = os.urandom(1024 * 1024 + 12345)  # not a whole number of pieces on purpose
PIECE = 64 * 1024


def make_session() -> object:
    settings = {
        "listen_interfaces": "127.0.0.1:0",
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "allow_multiple_connections_per_ip": True,
        "announce_to_all_trackers": True,
        "alert_mask": 0,
    }
    return lt.session(settings)


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    # A short interval so a re-announce (should the first one race) comes quickly.
    with run_server(TrackerSettings(token=TOKEN, interval=2, min_interval=1)) as t:
        yield t


@pytest.fixture
def seeder(tracker: Tracker, tmp_path: Path) -> Iterator[tuple[str, bytes, object]]:
    """A libtorrent session seeding DATA, announced to the tracker; yields (blob id, info, handle)."""
    blob_id, info = make_info(DATA, PIECE)
    assert tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).status_code == 201
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    (seed_dir / blob_id).write_bytes(DATA)
    session = make_session()
    handle = session.add_torrent(_params(tracker, info, seed_dir))
    try:
        loop_until(lambda: handle.status().is_seeding, timeout=60, what="seeder to check its file")
        ih = bytes.fromhex(tracker.http.get(f"/v1/blobs/{blob_id}").json()["infohash"])
        loop_until(
            lambda: tracker.scrape(ih)[b"files"][ih][b"complete"] == 1, timeout=60, what="seeder to announce"
        )
        yield blob_id, info, handle
    finally:
        session.remove_torrent(handle)
        del session


def _params(tracker: Tracker, info: bytes, save_path: Path) -> object:
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(lt.bdecode(bencode({"info": bdecode(info)})))
    atp.save_path = str(save_path)
    atp.trackers = [f"{tracker.url}/announce"]
    return atp


def test_libtorrent_downloads_through_tracker(tracker: Tracker, seeder, tmp_path: Path) -> None:
    blob_id, info, _ = seeder
    leech_dir = tmp_path / "leech"
    leech_dir.mkdir()
    session = make_session()
    handle = session.add_torrent(_params(tracker, info, leech_dir))
    try:
        loop_until(lambda: handle.status().is_seeding, timeout=90, what="libtorrent leecher to complete")
        assert (leech_dir / blob_id).read_bytes() == DATA
        # The finished leecher re-announces as a seeder: the swarm now has two complete copies.
        state = loop_until(
            lambda: (s := tracker.http.get(f"/v1/blobs/{blob_id}").json())["seeders"] == 2 and s,
            timeout=60,
            what="second seeder in the swarm",
        )
        assert state["leechers"] == 0
    finally:
        session.remove_torrent(handle)
        del session


def test_aria2c_downloads_from_libtorrent_seeder_through_tracker(
    tracker: Tracker, seeder, tmp_path: Path
) -> None:
    if shutil.which("aria2c") is None:
        require("aria2c", "Debian package aria2 (./dev installs it)")
    blob_id, info, _ = seeder
    torrent = tmp_path / "blob.torrent"
    torrent.write_bytes(bencode({"announce": f"{tracker.url}/announce", "info": bdecode(info)}))
    out = tmp_path / "aria2"
    out.mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [
            "aria2c",
            "--dir",
            str(out),
            "--enable-dht=false",
            "--enable-dht6=false",
            "--bt-enable-lpd=false",
            "--enable-peer-exchange=false",
            "--seed-time=0",
            "--listen-port",
            str(port),
            "--bt-tracker-connect-timeout=10",
            "--bt-tracker-timeout=10",
            "--summary-interval=0",
            "--console-log-level=warn",
            "--check-integrity=true",
            "--no-conf",
            str(torrent),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        kill_process(proc)
    assert proc.returncode == 0, output
    assert (out / blob_id).read_bytes() == DATA
    metrics = tracker.http.get("/metrics").text
    assert 'tracker_announces_total{event="stopped"} 1.0' in metrics, "aria2c left the swarm cleanly"
    assert 'tracker_announces_total{event="error"} 0.0' in metrics, "aria2c's announces all parsed"
