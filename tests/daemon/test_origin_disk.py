"""Attack 7 through a real `agent serve` (docs/security.md): an origin that lists a large file and sends a
little more on every answer ends the job with a clear failure and its reservation freed; a partial a
killed daemon left behind is shown by `agent ls` and evicted for an honest model after the restart
(before, that model failed "only 0.0 MiB can be freed" while `agent ls` showed nothing to remove)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.cluster import AgentProcess, TrackerProcess, admin_request, agent_cli
from tests.support.fetchkit import allocated
from tests.support.procs import loop_until

MiB, GiB = 2**20, 2**30
HOSTILE, HONEST = "acme/hostile", "acme/honest"




def fetch(agent: AgentProcess, repo_id: str, wait: float = 60) -> dict[str, Any]:
    status: dict[str, Any] = admin_request(agent.url, "POST", "/v1/fetch", json={"repo_id": repo_id}).json()
    if wait:
        path = f"/v1/jobs/{status['job_id']}"
        status = admin_request(agent.url, "GET", path, params={"wait": wait}, timeout=wait + 10).json()
    return status


def test_attack_seven_ends_the_job_and_a_partial_left_by_a_kill_makes_room_after_the_restart(
    tmp_path: Path, tracker: TrackerProcess
):
    root = tmp_path / "hub-src"
    (shard,) = [
        p.name
        for p in make_model(root, HOSTILE, total_bytes=96 * MiB, shards=1, seed=1)
        if p.suffix == ".safetensors"
    ]
    make_model(root, HONEST, total_bytes=16 * MiB, shards=2, seed=2)
    with HubServer(root) as hub:
        hub.faults.claimed_sizes[shard] = 2 * GiB
        hub.faults.answer_bytes = 1000
        agent = AgentProcess(tmp_path, "node", hub.url, tracker)
        agent.start()
        try:
            status = fetch(agent, HOSTILE)
            assert status["phase"] == "Failed", status
            assert "cannot send what it lists" in status["error"], status["error"]
            asked = [r for r in hub.requests if r.method == "GET" and r.bucket == "cdn"]  # the shard's bytes
            # Before: 675 requests in 180 s and the job never ended.
            assert len(asked) <= 40, len(asked)
            rss = psutil.Process(agent.proc.pid).memory_info().rss  # type: ignore[union-attr]
            assert rss < 400 * MiB, rss
            assert allocated(agent.cache_dir) < 1 * MiB  # not the 2 GiB it reserved

            # A daemon killed while it pulls a file the origin lists at 2 GiB leaves the reservation.
            hub.faults.answer_bytes = None
            hub.faults.slow_rate, hub.faults.slow_times = 20_000.0, 10**6
            fetch(agent, HOSTILE, wait=0)
            loop_until(lambda: allocated(agent.cache_dir) >= 2 * GiB, timeout=30, what="the reservation")
            agent.kill()
        finally:
            agent.stop()

        hub.faults.reset()
        limited = AgentProcess(tmp_path, "node", hub.url, tracker, "--cache-max-bytes", str(256 * MiB))
        limited.start()
        try:
            listed = agent_cli("ls", "--agent", limited.url)
            assert listed.returncode == 0, listed.stderr
            (row,) = [line for line in listed.stdout.splitlines() if "(partial)" in line]
            assert row.startswith(HOSTILE) and shard in row and "2.0 GiB" in row, listed.stdout
            status = fetch(limited, HONEST)
            assert status["phase"] == "Ready", status
            assert not list(limited.cache_dir.rglob("*.incomplete"))
            assert allocated(limited.cache_dir) < 64 * MiB
        finally:
            limited.stop()
