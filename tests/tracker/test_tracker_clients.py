"""Real BitTorrent clients complete downloads through the tracker: libtorrent and aria2c.

Peers find each other only through the tracker (no DHT, LSD, PEX, or direct connects).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.procs import free_port, kill_process, loop_until, require, require_module
from tests.support.stock import stock_session
from tests.support.trackerkit import AUTH, SETTINGS, Tracker, compact_ports, make_info, run_server
from wirekit.bencode import bdecode, bencode

lt = require_module("libtorrent", "a dependency of weightswarm: pip install -e '.[dev]' (./dev does)")

DATA = os.urandom(1024 * 1024 + 12345)  # not a whole number of pieces on purpose
PIECE = 64 * 1024


def make_session(**extra: object) -> object:
    return stock_session(**{"announce_to_all_trackers": True, "alert_mask": 0, **extra})


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    # A short interval so a re-announce (should the first one race) comes quickly.
    with run_server(replace(SETTINGS, interval=2, min_interval=1)) as t:
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
    atp.trackers = [tracker.announce_url]
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
    torrent.write_bytes(bencode({"announce": tracker.announce_url, "info": bdecode(info)}))
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


def _next_alert(session: object, wanted: Callable[[object], bool], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.wait_for_alert(200)  # type: ignore[attr-defined]
        for alert in session.pop_alerts():  # type: ignore[attr-defined]
            if wanted(alert):
                return alert
    raise AssertionError(f"no {what} within {timeout}s")


def test_stock_libtorrent_is_refused_without_the_passkey(tracker: Tracker, tmp_path: Path) -> None:
    """A plain libtorrent session (nothing of ours) announcing with no passkey, a wrong one, and
    the right one; then scraping, at the URL libtorrent derives from the announce URL."""
    blob_id, info = make_info(DATA, PIECE)
    tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info).raise_for_status()
    ih = bytes.fromhex(tracker.http.get(f"/v1/blobs/{blob_id}").json()["infohash"])
    (tmp_path / blob_id).write_bytes(DATA)
    alerts = lt.alert.category_t.tracker_notification | lt.alert.category_t.error_notification
    # libtorrent's SSRF guard allows only paths starting /announce on a loopback tracker, which
    # blocks /scrape/<passkey> here (not on a cluster address); the agents run with it off too.
    session = make_session(alert_mask=int(alerts), ssrf_mitigation=False)
    atp = _params(tracker, info, tmp_path)
    atp.trackers = [f"{tracker.url}/announce"]  # type: ignore[attr-defined]
    handle = session.add_torrent(atp)  # type: ignore[attr-defined]

    def refused(alert: object) -> bool:
        return (
            isinstance(alert, lt.tracker_error_alert)
            and alert.failure_reason() == "unknown or missing passkey"
        )

    try:
        loop_until(lambda: handle.status().is_seeding, timeout=60, what="seeder to check its file")
        _next_alert(session, refused, 30, "refusal of the announce without passkey")
        handle.replace_trackers([lt.announce_entry(f"{tracker.url}/announce/wrong-passkey-123")])
        handle.force_reannounce()
        _next_alert(session, refused, 30, "refusal of the announce with a wrong passkey")
        assert tracker.scrape(ih)[b"files"][ih][b"complete"] == 0, "a refused seeder is not listed"
        assert tracker.http.get(f"/v1/blobs/{blob_id}").json()["seeders"] == 0

        handle.replace_trackers([lt.announce_entry(tracker.announce_url)])
        handle.force_reannounce()
        _next_alert(session, lambda a: isinstance(a, lt.tracker_reply_alert), 30, "announce reply")
        assert tracker.scrape(ih)[b"files"][ih][b"complete"] == 1
        handle.scrape_tracker()
        scraped = _next_alert(
            session,
            lambda a: isinstance(a, lt.scrape_reply_alert | lt.scrape_failed_alert),
            30,
            "scrape answer",
        )
        assert isinstance(scraped, lt.scrape_reply_alert), scraped.message()  # type: ignore[attr-defined]
        assert scraped.complete == 1  # type: ignore[attr-defined]
    finally:
        session.remove_torrent(handle)  # type: ignore[attr-defined]
        del session
    metrics = tracker.http.get("/metrics").text
    refusals = next(
        line
        for line in metrics.splitlines()
        if line.startswith('tracker_auth_refusals_total{reason="passkey"}')
    )
    assert float(refusals.split()[-1]) >= 2


def test_agent_tracker_client_roles_and_passkey(tracker: Tracker, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's TrackerClient: its announce URL carries the passkey, hub manifests go with the
    agent token, hub-less ones with the publisher token (refused locally without one)."""
    from agent.core.errors import RefusedError
    from agent.core.errors import TrackerError as AgentTrackerError
    from agent.core.settings import DaemonSettings
    from agent.swarm.ltkit import redact_tracker_url
    from agent.tracking.client import TrackerClient
    from tests.support.trackerkit import PASSKEY, PUBLISHER_TOKEN, SIGNATURE, TOKEN

    caplog.set_level(logging.DEBUG)
    base = DaemonSettings(tracker_url=tracker.url, tracker_token=TOKEN, tracker_passkey=PASSKEY)
    node = TrackerClient(tracker.url, TOKEN, base)
    publisher = TrackerClient(tracker.url, TOKEN, replace(base, publisher_token=PUBLISHER_TOKEN))
    files = [{"path": "w.bin", "size": 3, "blob_id": "f" * 64, "infohash": None}]
    try:
        assert node.announce_url == f"{tracker.url}/announce/{PASSKEY}"
        assert redact_tracker_url(node.announce_url) == f"{tracker.url}/announce/***"
        assert redact_tracker_url(f"{tracker.url}/scrape/{PASSKEY}") == f"{tracker.url}/scrape/***"
        assert PASSKEY not in repr(node) and TOKEN not in repr(node)
        with pytest.raises(RefusedError, match="--publisher-token-file"):
            node.publish_manifest("acme/local", "1" * 40, "main", files, signature=SIGNATURE)
        assert node.get_manifest("acme/local", "1" * 40) is None, "nothing was sent"
        publisher.publish_manifest("acme/local", "1" * 40, "main", files, signature=SIGNATURE)
        assert node.get_manifest("acme/local", "1" * 40) == {
            "repo_id": "acme/local",
            "commit": "1" * 40,
            "files": files,
            "published": True,
            "signature": SIGNATURE,
        }
        with pytest.raises(AgentTrackerError, match="403") as refused:
            node.put_manifest("acme/local", "2" * 40, "main", files)
        assert refused.value.status == 403 and "acme/local is a published model" in str(refused.value)
        assert node.resolve("acme/local", "main") == "1" * 40
        node.put_manifest("acme/hub", "3" * 40, "main", files)  # a hub model: the agent role's
        assert node.get_manifest("acme/hub", "3" * 40)["signature"] is None
        assert node.resolve("acme/hub", "main") is None, "only the publisher moves refs"
        node.put_manifest("acme/hub", "3" * 40, "main", files)  # the same files: a no-op
        with pytest.raises(AgentTrackerError, match="409") as conflict:
            node.put_manifest("acme/hub", "3" * 40, "main", [{**files[0], "size": 4}])
        assert "a commit's manifest never changes" in str(conflict.value)
        anonymous = TrackerClient(tracker.url, None, replace(base, tracker_token=None))
        with pytest.raises(AgentTrackerError, match="401"):
            anonymous.resolve("acme/hub", "main")
        anonymous.close()
    finally:
        node.close()
        publisher.close()
    assert PASSKEY not in caplog.text and TOKEN not in caplog.text and PUBLISHER_TOKEN not in caplog.text


def test_agent_swarm_logs_tracker_refusals_without_the_passkey(
    tracker: Tracker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's libtorrent adapter logs a refused announce (the operator must see a wrong
    passkey) with the passkey part of the URL redacted: libtorrent's own message holds it."""
    from agent.core.swarm_settings import SwarmSettings
    from agent.swarm.session import Swarm

    caplog.set_level(logging.INFO, logger="agent.swarm.session")
    blob_id, info = make_info(DATA, PIECE)
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / blob_id).write_bytes(DATA)
    wrong = f"{tracker.url}/announce/not-the-passkey-42"
    with Swarm(SwarmSettings(listen="127.0.0.1:0"), tmp_path / "state") as swarm:
        swarm.seed(tmp_path / "blobs" / blob_id, info, [wrong])
        line = loop_until(
            lambda: next((r.getMessage() for r in caplog.records if "tracker error" in r.getMessage()), None),
            timeout=30,
            what="the refused announce logged",
        )
    assert line == f"tracker error for {blob_id} from {tracker.url}/announce/***: unknown or missing passkey"
    assert "not-the-passkey" not in caplog.text


INTEROP = "test-interop-passkey-0123"


def _announced(session: object, handle: object, what: str) -> object:
    """The next reply or failure of `handle`'s tracker: a `tracker_reply_alert` or `tracker_error_alert`."""
    return _next_alert(
        session,
        lambda a: isinstance(a, lt.tracker_reply_alert | lt.tracker_error_alert) and a.handle == handle,
        30,
        what,
    )


def test_the_interop_passkey_announces_only_blobs_with_metainfo_never_relay_keys(
    store_settings, tmp_path: Path
) -> None:
    """Issue 62: a stock client with the interop passkey announced a blob's relay key (and rank and place
    keys: no torrent has them), crowding the 50 sources an agent's announce reply lists. libtorrent, as any
    stock client holding a magnet link, announces the relay key with the interop passkey: a bencoded
    failure, nothing stored; the same client seeding a blob whose metainfo the tracker holds is listed."""
    from agent.relay.directory import relay_infohash

    settings = replace(store_settings, interop_passkey=INTEROP, interval=2, min_interval=1)
    with run_server(settings) as tracker:
        blob_id, info = make_info(DATA, PIECE)
        assert tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info).status_code == 201
        ih = bytes.fromhex(tracker.http.get(f"/v1/blobs/{blob_id}").json()["infohash"])
        key = relay_infohash(blob_id)
        # An agent offers the blob over the relay: the key's one source.
        assert b"failure reason" not in tracker.announce(key, b"-WS0100-relay-agent1", 7001, left=0)
        interop_url = f"{tracker.url}/announce/{INTEROP}"
        alerts = lt.alert.category_t.tracker_notification | lt.alert.category_t.error_notification
        session = make_session(alert_mask=int(alerts))
        magnet = lt.add_torrent_params()
        magnet.info_hashes = lt.info_hash_t(lt.sha1_hash(key))
        magnet.save_path = str(tmp_path / "magnet")
        magnet.trackers = [interop_url]
        magnet.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        relay = session.add_torrent(magnet)  # type: ignore[attr-defined]
        (tmp_path / blob_id).write_bytes(DATA)
        atp = _params(tracker, info, tmp_path)
        atp.trackers = [interop_url]  # type: ignore[attr-defined]
        seed = session.add_torrent(atp)  # type: ignore[attr-defined]
        try:
            refused = _announced(session, relay, "the tracker's answer to the relay key's announce")
            assert isinstance(refused, lt.tracker_error_alert), refused.message()  # type: ignore[attr-defined]
            assert refused.failure_reason().startswith("unregistered torrent"), refused.failure_reason()
            # Nothing stored: the key still lists its one agent, and the stock client in no reply.
            listed = tracker.scrape(key)[b"files"][key]
            assert listed == {b"complete": 1, b"downloaded": 0, b"incomplete": 0}, listed
            reply = tracker.announce(key, b"-WS0100-relay-agent2", 7002, numwant=50)
            assert compact_ports(reply[b"peers"]) == [7001], reply

            loop_until(lambda: seed.status().is_seeding, timeout=60, what="the stock seeder's check")
            accepted = _announced(session, seed, "the tracker's answer to the blob's announce")
            message = accepted.message()  # type: ignore[attr-defined]
            assert isinstance(accepted, lt.tracker_reply_alert), message
            loop_until(lambda: tracker.scrape(ih)[b"files"][ih][b"complete"] == 1, timeout=30, what="listed")
        finally:
            session.remove_torrent(relay)  # type: ignore[attr-defined]
            session.remove_torrent(seed)  # type: ignore[attr-defined]
            del session
