"""A model on disk survives its origin: a revision complete in the cache is served when the origin is down
or `HF_HUB_OFFLINE=1`, from a read-only cache too; `agent verify` never leaves a snapshot entry pointing
at nothing. huggingface_hub is the reference (file_download.py: a branch by its `refs/` entry, a commit
by its snapshot, when the HEAD fails; snapshot_download's `local_files_only`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from agent.cache.layout import RepoCache
from agent.cli.main import main
from tests.support.fetchkit import REPO, fetch_args, repo_dir, served_model, sha256, shards, snapshot_contents


@pytest.fixture
def origin(tmp_path):
    yield from served_model(tmp_path)


@pytest.fixture
def no_xet(monkeypatch):
    # As tests/hub/conftest.py: hf_xet is installed, and the 2026 answers' X-Xet-Hash would send
    # huggingface_hub to a CAS the test hub does not serve.
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def _immutable(root: Path, on: bool) -> None:
    """chattr +i (or -i) on every directory and file under `root` (symlinks take no attributes)."""
    paths = [str(p) for p in [root, *root.rglob("*")] if not p.is_symlink()]
    subprocess.run(["chattr", "+i" if on else "-i", *paths], check=True)


def _api_calls(srv) -> list[str]:
    return [r.path for r in srv.requests if r.path.startswith(f"/api/models/{REPO}")]


def _fetch(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(main, args, env={"HF_HUB_OFFLINE": None, **(env or {})})


@pytest.mark.parametrize("by_commit", [False, True], ids=["main", "commit"])
def test_a_complete_revision_is_served_from_the_cache_after_one_quick_try_while_the_origin_fails(
    tmp_path, origin, by_commit
):
    srv, _root, files = origin
    first = _fetch([*fetch_args(srv.url, tmp_path), "--quiet"])
    assert first.exit_code == 0, first.output
    snapshot = first.stdout.strip().splitlines()[-1]
    revision = Path(snapshot).name if by_commit else "main"
    # The Hub answering 503 to everything (an outage): the revision must come from the cache.
    srv.faults.path_status[f"/api/models/{REPO}/revision/{revision}"] = (503, {})
    srv.reset_counters()
    res = _fetch([*fetch_args(srv.url, tmp_path), "--revision", revision])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == snapshot
    assert snapshot_contents(Path(snapshot)) == files
    said = [line for line in res.stderr.splitlines() if "serving commit" in line]
    assert len(said) == 1 and "cannot be asked" in said[0], res.stderr
    # One ask, no retries: the 6 attempts of a download are for bytes the cache lacks.
    assert _api_calls(srv) == [f"/api/models/{REPO}/revision/{revision}"], res.stderr


def test_origin_refusing_connections_serves_the_cache(tmp_path, origin):
    srv, _root, files = origin
    assert _fetch([*fetch_args(srv.url, tmp_path), "--quiet"]).exit_code == 0
    url = srv.url
    srv.stop()  # nothing listens there now: connections are refused
    res = _fetch(fetch_args(url, tmp_path))
    assert res.exit_code == 0, res.output
    assert snapshot_contents(Path(res.stdout.strip().splitlines()[-1])) == files


def test_hf_hub_offline_never_asks_the_origin_and_refuses_what_the_cache_lacks(tmp_path, origin):
    srv, _root, files = origin
    assert _fetch([*fetch_args(srv.url, tmp_path), "--quiet", "--include", "*.json"]).exit_code == 0
    srv.reset_counters()
    offline = {"HF_HUB_OFFLINE": "1"}
    res = _fetch([*fetch_args(srv.url, tmp_path), "--include", "*.json"], offline)
    assert res.exit_code == 0, res.output
    assert "HF_HUB_OFFLINE is set" in res.stderr
    assert sorted(snapshot_contents(Path(res.stdout.strip().splitlines()[-1]))) == sorted(
        p for p in files if p.endswith(".json")
    )
    # The whole model: the record of the commit names shards this node never fetched.
    whole = _fetch(fetch_args(srv.url, tmp_path), offline)
    assert whole.exit_code == 3, whole.output
    assert whole.stderr.strip().splitlines()[-1].startswith("error: ") and "HF_HUB_OFFLINE" in whole.stderr
    assert srv.requests == []


def test_a_cache_that_huggingface_hub_wrote_is_served_offline(tmp_path, origin, no_xet):
    srv, _root, files = origin
    snapshot_download(REPO, endpoint=srv.url, cache_dir=tmp_path / "hub")
    srv.reset_counters()
    res = _fetch(fetch_args(srv.url, tmp_path), {"HF_HUB_OFFLINE": "1"})
    assert res.exit_code == 0, res.output
    assert snapshot_contents(Path(res.stdout.strip().splitlines()[-1])) == files
    assert srv.requests == []


def test_a_complete_model_on_a_read_only_cache_is_exit_0(tmp_path, origin):
    srv, _root, files = origin
    assert _fetch([*fetch_args(srv.url, tmp_path), "--quiet"]).exit_code == 0
    cache = tmp_path / "hub"
    # Root ignores permission bits: the immutable attribute refuses every write, as a read-only mount.
    _immutable(cache, True)
    try:
        with pytest.raises(PermissionError):
            (cache / "probe").touch()
        res = _fetch(fetch_args(srv.url, tmp_path))
    finally:
        _immutable(cache, False)
    assert res.exit_code == 0, res.output
    assert snapshot_contents(Path(res.stdout.strip().splitlines()[-1])) == files


def _corrupt_first_shard(tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    shard = shards(files)[0]
    blob = repo_dir(tmp_path / "hub") / "blobs" / sha256(files[shard])
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    return shard, blob.name


def test_verify_refetches_from_the_recorded_origin(tmp_path, origin):
    srv, _root, files = origin
    assert _fetch([*fetch_args(srv.url, tmp_path), "--quiet"]).exit_code == 0
    _corrupt_first_shard(tmp_path, files)
    # No --origin, and $HF_ENDPOINT names a hub that refuses connections: the repo's own origin repairs it.
    dirs = ["--cache-dir", str(tmp_path / "hub"), "--state-dir", str(tmp_path / "st"), "--agent", "off"]
    res = CliRunner().invoke(main, ["verify", REPO, *dirs], env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert res.exit_code == 0, res.output
    assert "repaired 1 of 1" in res.stdout
    snap = repo_dir(tmp_path / "hub") / "snapshots" / srv.commit_for(REPO)
    assert snapshot_contents(snap) == files


def test_verify_that_cannot_refetch_leaves_no_entry_pointing_at_nothing(tmp_path, origin):
    srv, _root, files = origin
    assert _fetch([*fetch_args(srv.url, tmp_path), "--quiet"]).exit_code == 0
    commit = srv.commit_for(REPO)
    shard, _blob = _corrupt_first_shard(tmp_path, files)
    url = srv.url
    srv.stop()
    dirs = ["--cache-dir", str(tmp_path / "hub"), "--state-dir", str(tmp_path / "st"), "--agent", "off"]
    res = CliRunner().invoke(main, ["verify", REPO, *dirs])
    assert res.exit_code == 6, res.output
    [line] = [x for x in res.stderr.splitlines() if x.startswith("still corrupt")]
    assert f"agent fetch {REPO} --revision {commit} --origin {url}" in line and "refs main" in line
    cache = RepoCache(tmp_path / "hub", tmp_path / "st", REPO)
    assert not cache.snapshot_file(commit, shard).is_symlink() and cache.read_ref("main") is None
    for entry in (repo_dir(tmp_path / "hub") / "snapshots").rglob("*"):
        assert entry.is_dir() or entry.exists(), f"{entry} points at nothing"
    # huggingface_hub: main is gone (a clean LocalEntryNotFound); the commit holds only what is intact.
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download(REPO, cache_dir=tmp_path / "hub", local_files_only=True)
    path = Path(snapshot_download(REPO, revision=commit, cache_dir=tmp_path / "hub", local_files_only=True))
    assert snapshot_contents(path) == {p: b for p, b in files.items() if p != shard}
    # And weightswarm itself no longer calls the commit complete.
    offline = _fetch(fetch_args(url, tmp_path), {"HF_HUB_OFFLINE": "1"})
    assert offline.exit_code == 3, offline.output
