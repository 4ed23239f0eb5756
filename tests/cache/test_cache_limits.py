"""README "Cache limits": `agent serve --cache-max-disk-percent P` evicts least-recently-used blobs so the
cache's filesystem stays at most P % full, counting what else lives there. A real `agent serve` on a
real 128 MiB tmpfs (root: CI; elsewhere it skips); the fill level is read with statvfs, not from the agent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import scan_cache_dir

from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.cluster import AgentProcess, TrackerProcess, admin_request

MiB = 2**20
# A fetch wants 64 MiB free beyond its bytes; these sizes leave that room even without eviction, so
# only the percent limit makes the agent evict.
DISK = 128 * MiB  # the tmpfs
PERCENT = 40  # 51.2 MiB
OTHER_DATA = 40 * MiB  # not the cache's: the limit counts it, eviction cannot free it
MODEL = 8 * MiB  # tensor bytes per repo: one fits under the limit beside OTHER_DATA (48 MiB), two do not
REPOS = ("acme/first", "acme/second")


@pytest.fixture
def two_models(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, dict[str, bytes]]]]:
    root = tmp_path / "hub-src"
    files = {}
    for i, repo in enumerate(REPOS):
        paths = make_model(root, repo, total_bytes=MODEL, shards=2, seed=20 + i)
        files[repo] = {str(p.relative_to(root / repo)): p.read_bytes() for p in paths}
    with HubServer(root) as hub:
        yield hub, files


def used_fraction(path: Path) -> float:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) / st.f_blocks


def fetch(agent: AgentProcess, repo_id: str) -> dict[str, Any]:
    status: dict[str, Any] = admin_request(
        agent.url, "POST", "/v1/fetch", json={"repo_id": repo_id}, timeout=10
    ).json()
    status = admin_request(
        agent.url, "GET", f"/v1/jobs/{status['job_id']}", params={"wait": 60}, timeout=70
    ).json()
    assert status["phase"] == "Ready", status
    return status


def test_cache_max_disk_percent_evicts_lru_to_keep_the_filesystem_under_the_limit(
    two_models, tracker: TrackerProcess, mounted_tmpfs, tmp_path
):
    hub, files = two_models
    disk = mounted_tmpfs(tmp_path / "node", f"size={DISK // MiB}m")
    (disk / "other-data.bin").write_bytes(bytes(OTHER_DATA))
    agent = AgentProcess(tmp_path, "node", hub.url, tracker, "--cache-max-disk-percent", str(PERCENT))
    assert agent.cache_dir.is_relative_to(disk)
    agent.start()
    try:
        fetch(agent, REPOS[0])
        assert used_fraction(disk) <= PERCENT / 100  # it fits beside the other data: nothing evicted
        assert {r.repo_id for r in scan_cache_dir(agent.cache_dir).repos} == {REPOS[0]}

        second = fetch(agent, REPOS[1])

        assert used_fraction(disk) <= PERCENT / 100, f"{used_fraction(disk):.2%} used"
        cache = scan_cache_dir(agent.cache_dir)
        assert not cache.warnings, cache.warnings
        revisions = {r.repo_id: r.revisions for r in cache.repos}
        assert not revisions.get(REPOS[0]), "the least recently used model was not evicted"
        assert len(revisions[REPOS[1]]) == 1
        snap = Path(second["snapshot"])
        for rel, data in files[REPOS[1]].items():
            assert hashlib.sha256((snap / rel).read_bytes()).digest() == hashlib.sha256(data).digest(), rel
        assert (disk / "other-data.bin").stat().st_size == OTHER_DATA  # not the cache's to evict
    finally:
        agent.stop()
