"""The peer gate (agent.swarm.gate): BitTorrent bytes flow only between agents that announced with the
tracker's passkey. The outsider is a stock libtorrent session on another loopback address (127.0.0.2)
holding the blob's metainfo and connecting straight to the agent's port.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import libtorrent as lt
import pytest

from tests.support.cluster import (
    Origin,
    TrackerProcess,
    fetch_and_wait,
    file_requests,
    model_origin,
    wait_until_seeded,
)
from tests.support.procs import loop_until, require
from tests.support.stock import stock_session
from wirekit.bencode import bdecode, bencode

OUTSIDER = "127.0.0.2"


def _metainfo(tracker: TrackerProcess, blob_id: str) -> bytes:
    resp = httpx.get(f"{tracker.url}/v1/blobs/{blob_id}/metainfo", headers=tracker.auth, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.content


def _largest(origin: Origin, status: dict) -> str:
    return max(status["files"], key=lambda f: f["size"])["blob_id"]


def test_an_outsider_with_the_metainfo_gets_no_byte(
    origin: Origin, tracker: TrackerProcess, make_agent, tmp_path
):
    a = make_agent("a", origin, tracker)
    blob_id = _largest(origin, fetch_and_wait(a, origin.repo_id))
    wait_until_seeded(tracker, a)
    info = _metainfo(tracker, blob_id)
    # enable_outgoing_utp off: the agents speak TCP only.
    ses = stock_session(f"{OUTSIDER}:0", outgoing_interfaces=OUTSIDER, enable_outgoing_utp=False)
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(bencode({"info": bdecode(info)}))
    atp.save_path = str(tmp_path / "outsider")
    # The announce URL without the passkey (what an outsider can know), and the agent's own port.
    atp.trackers = [f"{tracker.url}/announce"]
    handle = ses.add_torrent(atp)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        handle.connect_peer(("127.0.0.1", a.swarm.listen_port))
        time.sleep(1)
    st = handle.status()
    assert st.total_payload_download == 0 and st.total_done == 0
    del ses


def test_an_agent_elsewhere_is_admitted_once_it_announced(
    origin: Origin, tracker: TrackerProcess, make_agent
):
    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    wait_until_seeded(tracker, a)
    origin.hub.reset_counters()
    # B listens (and connects) on another address: A's gate must learn it from the tracker first.
    b = make_agent("b", origin, tracker, listen=f"{OUTSIDER}:0")
    status = fetch_and_wait(b, origin.repo_id, timeout=60)
    shards = [f["path"] for f in status["files"] if f["path"].endswith(".safetensors")]
    assert shards and all(f["source"] == "peers" for f in status["files"] if f["path"] in shards), status
    assert not [r for r in file_requests(origin.hub) if r.path.endswith(".safetensors")]
    assert OUTSIDER in a.tracker.peer_addresses()


def _aria2c(
    tracker: TrackerProcess, info: bytes, out: Path, seconds: int
) -> subprocess.CompletedProcess[str]:
    """aria2c on 127.0.0.2 with the blob's metainfo and the interop passkey: a stock client outside."""
    if shutil.which("aria2c") is None:
        require("aria2c", "Debian package aria2 (./dev installs it)")
    torrent = out.with_suffix(".torrent")
    torrent.write_bytes(bencode({"announce": tracker.interop_announce_url, "info": bdecode(info)}))
    argv = [
        "aria2c",
        "--no-conf",
        "--enable-dht=false",
        "--enable-dht6=false",
        "--bt-enable-lpd=false",
        "--enable-peer-exchange=false",
        f"--interface={OUTSIDER}",
        f"--dir={out}",
        "--seed-time=0",
        f"--bt-stop-timeout={seconds}",
        "--summary-interval=0",
        "--console-log-level=warn",
        str(torrent),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)


@pytest.mark.parametrize("interop", [True, False], ids=["interop-public", "closed"])
def test_a_stock_client_gets_public_blobs_only_with_interop(
    origin: Origin, tracker: TrackerProcess, make_agent, tmp_path, interop: bool
):
    a = make_agent("a", origin, tracker, interop_public=interop)
    blob_id = _largest(origin, fetch_and_wait(a, origin.repo_id))  # the test hub's repo is public
    wait_until_seeded(tracker, a)
    if interop:  # the gate opens the public model's torrents at its next refresh
        loop_until(lambda: any(r.open_to_all for r in a.swarm._torrents.values()), timeout=10)
    res = _aria2c(tracker, _metainfo(tracker, blob_id), tmp_path / "aria2c", seconds=6 if not interop else 40)
    got = tmp_path / "aria2c" / blob_id
    if interop:
        assert res.returncode == 0, res.stdout + res.stderr
        assert hashlib.sha256(got.read_bytes()).hexdigest() == blob_id
    else:
        assert res.returncode != 0
        assert not got.exists() or not any(got.read_bytes())  # preallocated at most: no byte came
    assert OUTSIDER not in a.tracker.peer_addresses()  # an interop announce never makes an agent


def test_interop_never_opens_a_gated_model(tracker: TrackerProcess, make_agent, tmp_path):
    token = "hf_node_token_for_the_gated_repo_0001"
    with model_origin(
        tmp_path / "gated-hub",
        "acme/gated",
        total_bytes=2**20,
        shards=2,
        seed=4,
        tokens=[token],
        gated=["acme/gated"],
    ) as gated:
        a = make_agent("a", gated, tracker, daemon={}, interop_public=True)
        job = a.request_model("acme/gated", token=token)
        assert job.wait(60) and job.status().phase == "Ready", job.status()
        status = job.status().to_json()
        blob_id = _largest(gated, status)
        wait_until_seeded(tracker, a)
        time.sleep(2 * a.settings.swarm.peer_gate_refresh)  # the gate had its chance to open it
        assert not any(r.open_to_all for r in a.swarm._torrents.values())
        res = _aria2c(tracker, _metainfo(tracker, blob_id), tmp_path / "aria2c", seconds=6)
        got = tmp_path / "aria2c" / blob_id
        assert res.returncode != 0 and (not got.exists() or not any(got.read_bytes()))
