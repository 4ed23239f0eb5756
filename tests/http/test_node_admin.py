"""README "Node operations": `agent ls --json` and `POST /v1/blobs/{id}/forget`, against a real daemon,
tracker and origin. Expected values come from the origin's files and model info, not from the agent."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx

from tests.support.cluster import admin_request, agent_cli, fetch_and_wait, wait_until_seeded
from tests.support.procs import free_port, loop_until


def test_agent_ls_json_gives_revisions_files_sizes_and_seeded_blobs(origin, tracker, make_agent, tmp_path):
    a = make_agent("a", origin, tracker)
    status = fetch_and_wait(a, origin.repo_id)
    wait_until_seeded(tracker, a)
    commit = httpx.get(f"{origin.hub.url}/api/models/{origin.repo_id}", timeout=10).json()["sha"]
    blobs = {hashlib.sha256(data).digest() for data in origin.files.values()}  # distinct contents

    def expected(seeding: object) -> list[dict[str, object]]:
        snapshot = {"commit": commit, "path": status["snapshot"], "files": len(origin.files)}
        return [
            {
                "repo_id": origin.repo_id,
                "refs": {"main": commit},
                "snapshots": [{**snapshot, "bytes": origin.size, "seeding": seeding}],
                "partials": [],  # every download finished
            }
        ]

    res = agent_cli("ls", "--agent", a.admin_url, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == expected(len(blobs))

    # No daemon answering: the cache itself (HF_HUB_CACHE, as huggingface_hub), seeding unknown.
    cache = Path(status["snapshot"]).parents[2]
    dead = f"http://127.0.0.1:{free_port()}"
    res = agent_cli("ls", "--agent", dead, "--json", env={**os.environ, "HF_HUB_CACHE": str(cache)})
    assert res.returncode == 0, res.stderr
    assert "listing the local cache instead" in res.stderr
    assert json.loads(res.stdout) == expected("-")


def test_forget_stops_seeding_one_blob_and_keeps_its_file(origin, tracker, make_agent):
    a = make_agent("a", origin, tracker)
    status = fetch_and_wait(a, origin.repo_id)
    wait_until_seeded(tracker, a)
    shard = next(f for f in status["files"] if f["path"].endswith(".safetensors"))
    blob = shard["blob_id"]
    others = {f["blob_id"] for f in status["files"]} - {blob}
    assert blob == hashlib.sha256(origin.files[shard["path"]]).hexdigest()

    def seeding() -> int:
        return int(
            admin_request(a.admin_url, "GET", "/v1/models", timeout=10).json()[0]["snapshots"][0]["seeding"]
        )

    before = seeding()
    resp = admin_request(a.admin_url, "POST", f"/v1/blobs/{blob}/forget", timeout=10)
    assert resp.status_code == 200 and resp.json() == {"blob_id": blob}

    # The swarm hears it: the tracker lists no seeder for that blob (a "stopped" announce, or at
    # the latest once the peer expires, 2.5 x the 10 s interval), while the others stay seeded.
    loop_until(lambda: int(tracker.blob(blob)["seeders"]) == 0, timeout=40, what="tracker drops the seeder")
    assert all(int(tracker.blob(b)["seeders"]) >= 1 for b in others)
    assert seeding() == before - 1
    # Only seeding stops: the file stays in the cache, intact (`agent verify` deletes, not forget).
    kept = Path(status["snapshot"]) / shard["path"]
    assert hashlib.sha256(kept.read_bytes()).digest() == hashlib.sha256(origin.files[shard["path"]]).digest()
