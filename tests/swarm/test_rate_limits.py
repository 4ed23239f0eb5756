"""README "Agent daemon": `agent serve --upload-rate-limit` / `--download-rate-limit` (bytes/s) bound the
BitTorrent transfer between real `agent serve` processes on loopback (which libtorrent would exempt
from limits by default). 8 MiB through a 2 MiB/s cap cannot take less than 4 s; the assertion
allows a third of that for bursts, so only the lower bound is checked: no tight timing window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import (
    AgentProcess,
    Origin,
    TrackerProcess,
    admin_request,
    assert_snapshot_verifies,
    model_origin,
)
from tests.support.procs import loop_until

REPO = "acme/eight"
MiB = 2**20
LIMIT = 2 * MiB


@pytest.fixture
def origin8(tmp_path: Path) -> Iterator[Origin]:
    with model_origin(tmp_path / "hub", REPO, total_bytes=8 * MiB, shards=2, seed=5) as o:
        yield o


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in reversed(started):
        agent.stop()


def fetch(agent: AgentProcess, timeout: float = 90) -> tuple[dict[str, Any], float]:
    """POST /v1/fetch and follow the job to its end: (final status, seconds it took)."""
    started = time.monotonic()
    status = admin_request(agent.url, "POST", "/v1/fetch", json={"repo_id": REPO}, timeout=10).json()
    while status["phase"] not in ("Ready", "Failed"):
        assert time.monotonic() - started < timeout, status
        status = admin_request(
            agent.url, "GET", f"/v1/jobs/{status['job_id']}", params={"wait": 5}, timeout=15
        ).json()
    return status, time.monotonic() - started


@pytest.mark.parametrize("side", ["upload", "download"])
@pytest.mark.timeout(180)
def test_a_rate_limit_bounds_peer_throughput(side, origin8, tracker: TrackerProcess, agents, tmp_path):
    capped = [f"--{side}-rate-limit", str(LIMIT)]
    url = origin8.hub.url
    seeder = AgentProcess(tmp_path, "seeder", url, tracker, *(capped if side == "upload" else []))
    leecher = AgentProcess(tmp_path, "leecher", url, tracker, *(capped if side == "download" else []))
    for agent in (seeder, leecher):
        agents.append(agent)
        agent.start()
    first, _ = fetch(seeder)
    assert first["phase"] == "Ready", first
    blobs = {f["blob_id"] for f in first["files"]}
    loop_until(
        lambda: all(int(str(tracker.blob(b).get("seeders") or 0)) >= 1 for b in blobs),
        timeout=30,
        what="the seeder's blobs announced",
    )

    status, seconds = fetch(leecher)

    assert status["phase"] == "Ready", status
    assert status["bytes_from_origin"] == 0, status  # every byte through the limited peer link
    peer_bytes = status["bytes_from_peers"]
    assert peer_bytes >= 8 * MiB, status
    print(f"{side}: {peer_bytes} bytes from peers in {seconds:.2f}s")
    floor = peer_bytes / LIMIT  # 4 s at the cap; unlimited, loopback moves 8 MiB in well under 1 s
    assert seconds >= 0.67 * floor, f"{peer_bytes} bytes in {seconds:.2f}s: faster than the {side} limit"
    assert_snapshot_verifies(status["snapshot"], origin8)
