"""`agent serve` as a process, driven by `agent fetch --agent` and `agent ls`; SIGKILL and restart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from agent.cache import RepoCache
from tests import daemon_fixtures
from tests.daemon_fixtures import (
    BIN,
    AgentProcess,
    assert_snapshot_verifies,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.helpers import loop_until
from tracker.bencode import bdecode

# The shared fixtures (pytest finds them as module attributes).
origin = daemon_fixtures.origin
tracker = daemon_fixtures.tracker
make_agent = daemon_fixtures.make_agent


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "agent"), *args], capture_output=True, text=True, timeout=timeout)


def _verified_partial_bytes(resume_dir: Path) -> int:
    """Bytes of verified pieces of unfinished blobs, as libtorrent's resume data records them."""
    total = 0
    for rf in resume_dir.glob("*.resume"):
        d = bdecode(rf.read_bytes())
        info = d.get(b"info")
        assert info, "resume data without the info dict"
        npieces = -(-info[b"length"] // info[b"piece length"])
        have = sum(bin(byte).count("1") for byte in d.get(b"pieces", b""))
        if have < npieces:
            total += have * info[b"piece length"]
    return total


def test_fetch_via_agent_shows_progress_and_prints_snapshot_last_then_ls(tmp_path, origin, tracker):
    a = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    try:
        a.start()
        r = _cli("fetch", origin.repo_id, "--agent", a.url)
        assert r.returncode == 0, r.stderr
        snapshot = r.stdout.strip().splitlines()[-1]
        assert snapshot.startswith(str(a.cache_dir)) and "/snapshots/" in snapshot
        assert_snapshot_verifies(snapshot, origin)
        assert "fetching model-00001-of-00003.safetensors" in r.stderr  # the per-file progress lines
        assert "from the origin" in r.stderr

        r = _cli("ls", "--agent", a.url)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if x.startswith(origin.repo_id))
        assert "main" in line and snapshot.rsplit("/", 1)[-1][:12] in line

        # A second fetch through the agent: everything already cached.
        r = _cli("fetch", origin.repo_id, "--agent", a.url)
        assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == snapshot
    finally:
        a.stop()


def test_fetch_via_agent_bad_input_is_one_line(tmp_path, origin, tracker):
    a = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    try:
        a.start()
        r = _cli("fetch", "acme/does-not-exist", "--agent", a.url)
        assert r.returncode != 0
        assert r.stderr.strip().splitlines()[-1].startswith("error:") and "Traceback" not in r.stderr
    finally:
        a.stop()


def test_sigkilled_agent_resumes_from_peers_and_keeps_seeding(tmp_path, origin, tracker, make_agent):
    # A has the model and uploads slowly, so B can be killed halfway through.
    seeder = make_agent("a", origin, tracker, upload_rate_limit=600_000)
    fetch_and_wait(seeder, origin.repo_id)
    wait_until_seeded(tracker, seeder)
    origin.hub.reset_counters()

    b = AgentProcess(
        tmp_path, "b", origin.hub.url, tracker, "--stall-timeout", "60", "--resume-interval", "0.5"
    )
    try:
        b.start()
        job = httpx.post(f"{b.url}/v1/fetch", json={"repo_id": origin.repo_id}).json()
        # Kill once libtorrent's resume data records some verified pieces (saved every 0.5 s here).
        resume_dir = b.state_dir / "resume"
        loop_until(lambda: _verified_partial_bytes(resume_dir) >= 2**20, timeout=60, what="B partly done")
        b.kill()
        verified = _verified_partial_bytes(resume_dir)
        blobs = RepoCache(b.cache_dir, b.state_dir, origin.repo_id).blobs_dir
        assert list(blobs.glob("*.incomplete")), "nothing left to resume"

        b.start()
        job = httpx.post(f"{b.url}/v1/fetch", json={"repo_id": origin.repo_id}).json()
        st = loop_until(
            lambda: (
                (s := httpx.get(f"{b.url}/v1/jobs/{job['job_id']}", params={"wait": 2}, timeout=10).json())[
                    "phase"
                ]
                in ("Ready", "Failed")
                and s
            ),
            timeout=90,
        )
        assert st["phase"] == "Ready", st
        assert_snapshot_verifies(st["snapshot"], origin)
        assert file_requests(origin.hub) == []  # nothing from the origin, before or after the kill
        # The restart took only what was missing (give or take pieces in flight), not all again.
        assert st["bytes_from_peers"] <= origin.size - verified + 3 * 256 * 1024, (
            st["bytes_from_peers"],
            verified,
        )

        # And B seeds: a third agent gets the model even when A is gone.
        seeder.stop()
        c = make_agent("c", origin, tracker)
        st_c = fetch_and_wait(c, origin.repo_id)
        assert_snapshot_verifies(st_c["snapshot"], origin)
        assert file_requests(origin.hub) == []
    finally:
        b.stop()
