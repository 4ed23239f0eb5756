"""Eviction, pins, readers and `agent rm` on a real hub cache filled by the real fetch engine."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import scan_cache_dir

from agent.cache.eviction import BlobReaders, Evictor, UsageLog, remove_model, scan_cache
from agent.cli.main import main
from agent.core.errors import CacheFullError
from agent.core.settings import OpsSettings, Settings
from agent.fetch.engine import fetch_snapshot
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model

MODEL = 2**20
REPOS = ("acme/old", "acme/pinned", "acme/recent")


@pytest.fixture
def filled(tmp_path: Path):
    """A hub cache holding three ~1 MiB models, fetched in order old, pinned, recent."""
    root = tmp_path / "hub-src"
    for i, repo in enumerate(REPOS):
        make_model(root, repo, total_bytes=MODEL, shards=2, seed=i)
    with HubServer(root) as hub:
        settings = Settings.from_env_defaults(cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
        settings = dataclasses.replace(
            settings, origin=dataclasses.replace(settings.origin, endpoint=hub.url)
        )
        for repo in REPOS:
            fetch_snapshot(settings, repo)
        yield settings, hub


def assert_consistent(cache_dir: Path) -> None:
    info = scan_cache_dir(cache_dir)
    assert not info.warnings, info.warnings
    for repo in info.repos:  # every snapshot file resolves to a present blob
        for rev in repo.revisions:
            for f in rev.files:
                assert f.blob_path.exists(), f.file_path


def repo_bytes(settings: Settings, repo_id: str) -> int:
    r = scan_cache(settings.cache_dir).get(repo_id)
    return sum(r.blobs.values()) if r else 0


def test_eviction_keeps_pinned_and_recent_models_and_the_cache_consistent(filled):
    settings, _hub = filled
    sizes = {r: repo_bytes(settings, r) for r in REPOS}
    limit = sum(sizes.values()) - sizes["acme/old"] // 2  # over by half a model
    settings = dataclasses.replace(settings, ops=OpsSettings(cache_max_bytes=limit, pins=("acme/pinned",)))
    usage = UsageLog(settings.state_dir / "usage.json")
    now = time.time()
    # Last use: pinned is the oldest of all (pins must win over LRU), then old, then recent.
    for age, repo in ((300, "acme/pinned"), (200, "acme/old"), (100, "acme/recent")):
        usage.touch(scan_cache(settings.cache_dir)[repo].blobs, when=now - age)
    evicted_log = []
    ev = Evictor(settings, usage, BlobReaders(), on_evict=evicted_log.append)

    evicted = ev.run_once()
    assert evicted and {r for e in evicted for r in e.repo_ids} == {"acme/old"}
    assert repo_bytes(settings, "acme/pinned") == sizes["acme/pinned"]
    assert repo_bytes(settings, "acme/recent") == sizes["acme/recent"]
    repos = scan_cache(settings.cache_dir)
    assert sum(sum(r.blobs.values()) for r in repos.values()) <= limit
    assert repos["acme/old"].snapshots == {} and repos["acme/old"].refs == {}  # the broken revision is gone
    assert evicted_log == evicted
    assert_consistent(settings.cache_dir)
    # Usage times survive a restart (state dir), and evicted blobs are forgotten there.
    reread = UsageLog(settings.state_dir / "usage.json")
    assert all(reread.last_used(e.blob_id) is None for e in evicted)
    assert reread.last_used(next(iter(repos["acme/recent"].blobs))) == pytest.approx(now - 100)


def test_a_leased_blob_is_never_evicted_and_a_model_that_cannot_fit_is_refused(filled):
    settings, _hub = filled
    total = sum(repo_bytes(settings, r) for r in REPOS)
    settings = dataclasses.replace(
        settings, ops=OpsSettings(cache_max_bytes=total // 4, pins=("acme/pinned",))
    )
    readers = BlobReaders()
    repos = scan_cache(settings.cache_dir)
    held = next(b for b in repos["acme/recent"].blobs if b not in repos["acme/pinned"].blobs)
    readers.acquire(held)
    refused = []
    ev = Evictor(settings, UsageLog(settings.state_dir / "usage.json"), readers)
    ev.cannot_fit_hooks.append(refused.append)

    with pytest.raises(CacheFullError, match="acme/huge needs"):
        ev.make_room("acme/huge", 10 * total, protect=set())
    assert len(refused) == 1
    assert repo_bytes(settings, "acme/old") > 0  # refused up front: nothing was evicted for nothing

    ev.run_once()
    left = scan_cache(settings.cache_dir)
    assert held in left["acme/recent"].blobs  # served right now: kept although unpinned
    assert left["acme/pinned"].snapshots  # pinned: kept although over the limit
    # Old and unpinned: all of it went, except content it shares with the pinned model (one file,
    # pinned for every repo that uses it, e.g. the identical `.gitattributes`).
    assert "acme/old" not in left or set(left["acme/old"].blobs) <= set(left["acme/pinned"].blobs)
    readers.release(held)
    ev.run_once()
    assert held not in scan_cache(settings.cache_dir)["acme/recent"].blobs
    assert_consistent(settings.cache_dir)


def test_agent_rm_without_a_daemon(filled):
    settings, _hub = filled
    runner = CliRunner()
    args = ["--cache-dir", str(settings.cache_dir), "--state-dir", str(settings.state_dir)]
    commit = scan_cache(settings.cache_dir)["acme/old"].refs["main"]
    before = scan_cache(settings.cache_dir)
    # Sidecars live in the state dir per blob id: one shared with another repo (same config file) stays.
    shared = set(before["acme/old"].blobs) & {b for r in REPOS[1:] for b in before[r].blobs}
    old_blobs = set(before["acme/old"].blobs) - shared
    assert old_blobs and shared
    sidecars = {b: settings.state_dir / "digests" / f"{b}.json" for b in old_blobs | shared}
    assert all(p.exists() for p in sidecars.values())

    result = runner.invoke(main, ["rm", "acme/old@main", *args])
    assert result.exit_code == 0, result.output
    assert "1 revision(s)" in result.output
    repos = scan_cache(settings.cache_dir)
    assert "main" not in repos["acme/old"].refs and commit not in repos["acme/old"].snapshots
    assert repos["acme/old"].blobs == {}
    assert not any(sidecars[b].exists() for b in old_blobs)
    # The shared ones stay, with their sidecar, in the repos that still use them.
    assert all(sidecars[b].exists() for b in shared), [b for b in shared if not sidecars[b].exists()]
    for repo in REPOS[1:]:
        assert repos[repo].blobs == before[repo].blobs
    assert_consistent(settings.cache_dir)

    result = runner.invoke(main, ["rm", "acme/recent", *args])
    assert result.exit_code == 0, result.output
    assert "acme/recent" not in scan_cache(settings.cache_dir)
    assert_consistent(settings.cache_dir)

    result = runner.invoke(main, ["rm", "acme/never@v1", *args])
    assert result.exit_code == 3 and "not in the cache" in result.output
    assert repo_bytes(settings, "acme/pinned") > 0


def test_removing_one_revision_name_removes_its_snapshot_and_unused_blobs(filled):
    settings, _hub = filled
    repo = scan_cache(settings.cache_dir)["acme/pinned"]
    (commit,) = repo.snapshots
    # A second revision name for the same commit: removing one name removes the snapshot it points at.
    (repo.root / "refs" / "v1").write_text(commit)
    removed = remove_model(settings, "acme/pinned", "v1")
    assert removed.snapshots == (commit,)
    left = scan_cache(settings.cache_dir)["acme/pinned"]
    assert left.refs == {} and left.snapshots == {} and left.blobs == {}
    assert set(removed.blobs) == set(repo.blobs)
    assert_consistent(settings.cache_dir)
