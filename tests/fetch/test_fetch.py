"""`agent fetch` end to end against the real test hub on loopback: layout, idempotence, moved main."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cache.layout import RepoCache
from agent.cli.main import main
from agent.fetch.engine import fetch_snapshot
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.cluster import model_origin
from tests.support.fetchkit import (
    REPO,
    MiB,
    fetch_args,
    file_requests,
    leftovers,
    model,
    origin_files,
    repo_dir,
    served_model,
    settings_for,
    snapshot_contents,
)


@pytest.fixture
def origin(tmp_path):
    yield from served_model(tmp_path)


def test_fetch_writes_hub_layout_that_huggingface_hub_loads_offline(tmp_path, origin):
    srv, root, files = origin
    settings = settings_for(tmp_path, srv.url)
    result = fetch_snapshot(settings, REPO)

    commit = srv.commit_for(REPO)
    assert result.commit == commit
    assert result.snapshot_path == repo_dir(settings.cache_dir) / "snapshots" / commit
    assert snapshot_contents(result.snapshot_path) == files
    assert result.bytes_from_origin == sum(len(b) for b in files.values())
    for path in files:
        link = result.snapshot_path / path
        target = os.readlink(link)
        assert link.is_symlink() and not os.path.isabs(target) and target.startswith("../../blobs/")
    cache = RepoCache(settings.cache_dir, settings.state_dir, REPO)
    assert (cache.refs_dir / "main").read_text() == commit
    # Blobs are named by content: sha256 for LFS shards, git sha1 for small files.
    shard = next(p for p in files if p.endswith(".safetensors"))
    assert os.readlink(result.snapshot_path / shard).endswith(hashlib.sha256(files[shard]).hexdigest())
    # Only the HF layout in the hub cache; the agent's state (sidecars) lives in state_dir.
    assert sorted(p.name for p in repo_dir(settings.cache_dir).iterdir()) == ["blobs", "refs", "snapshots"]
    assert len(list((settings.state_dir / "digests").iterdir())) == len(files)
    assert leftovers(settings.cache_dir, settings.state_dir) == []

    from huggingface_hub import snapshot_download

    got = snapshot_download(REPO, cache_dir=settings.cache_dir, local_files_only=True)
    assert Path(got) == result.snapshot_path

    # A separate process, fully offline, as vLLM would run: resolve from the cache, load a tensor.
    script = (
        "import sys, json\n"
        "from huggingface_hub import snapshot_download\n"
        "from safetensors import safe_open\n"
        "p = snapshot_download(sys.argv[1])\n"
        "idx = json.load(open(p + '/model.safetensors.index.json'))\n"
        "name, shard = sorted(idx['weight_map'].items())[0]\n"
        "with safe_open(p + '/' + shard, 'np') as f:\n"
        "    print(p); print(name, f.get_tensor(name).shape)\n"
    )
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(settings.cache_dir), HF_ENDPOINT="http://127.0.0.1:9"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, REPO], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(result.snapshot_path)

    # A cross-check with an independent loader: same tensor bytes as the origin's file.
    from safetensors import safe_open

    with (
        safe_open(str(result.snapshot_path / shard), "np") as ours,
        safe_open(str(root / REPO / shard), "np") as src,
    ):
        name = next(iter(ours.keys()))
        assert ours.get_tensor(name).tobytes() == src.get_tensor(name).tobytes()


def test_cli_second_run_downloads_nothing_and_says_so(tmp_path, origin):
    srv, _, files = origin
    args = fetch_args(srv.url, tmp_path)
    runner = CliRunner()
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    snapshot = Path(first.stdout.strip().splitlines()[-1])
    assert snapshot_contents(snapshot) == files
    assert "files fetched" in first.stderr

    srv.reset_counters()
    second = runner.invoke(main, args)
    assert second.exit_code == 0, second.output
    assert second.stdout.strip().splitlines()[-1] == str(snapshot)
    assert "already in the cache" in second.stderr
    assert file_requests(srv) == []  # no HEAD, no GET of any file: only resolve + listing


def test_cli_options_from_environment(tmp_path, origin, monkeypatch):
    srv, _, files = origin
    monkeypatch.setenv("WEIGHTSWARM_ORIGIN", srv.url)
    monkeypatch.setenv("WEIGHTSWARM_CACHE_DIR", str(tmp_path / "envhub"))
    monkeypatch.setenv("WEIGHTSWARM_STATE_DIR", str(tmp_path / "envstate"))
    monkeypatch.setenv("WEIGHTSWARM_INCLUDE", "*.json")
    result = CliRunner().invoke(main, ["fetch", REPO, "--quiet"])
    assert result.exit_code == 0, result.output
    snapshot = Path(result.stdout.strip())
    assert snapshot.is_relative_to(tmp_path / "envhub")
    assert set(snapshot_contents(snapshot)) == {p for p in files if p.endswith(".json")}
    assert result.stderr == ""


def test_hf_endpoint_and_cache_defaults(tmp_path, origin, monkeypatch):
    srv, _, files = origin
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hfcache"))
    result = CliRunner().invoke(main, ["fetch", REPO, "--quiet", "--include", "config.json"])
    assert result.exit_code == 0, result.output
    assert Path(result.stdout.strip()).is_relative_to(tmp_path / "hfcache")


def test_moved_main_resolves_to_new_commit_and_reuses_unchanged_blobs(tmp_path, origin):
    srv, root, files = origin
    settings = settings_for(tmp_path, srv.url)
    old = fetch_snapshot(settings, REPO)

    # Move main: a new config and one shard replaced by a different (but valid) one.
    other = tmp_path / "other"
    make_model(other, REPO, total_bytes=6 * MiB, shards=3, seed=7)
    shard = sorted(p for p in files if p.endswith(".safetensors"))[1]
    shutil.copyfile(other / REPO / shard, root / REPO / shard)
    cfg = json.loads(files["config.json"])
    cfg["moved"] = True
    (root / REPO / "config.json").write_text(json.dumps(cfg))
    new_files = origin_files(root)

    srv.reset_counters()
    new = fetch_snapshot(settings, REPO)
    assert new.commit == srv.commit_for(REPO) != old.commit
    assert snapshot_contents(new.snapshot_path) == new_files
    assert snapshot_contents(old.snapshot_path) == files  # the old commit is untouched
    assert RepoCache(settings.cache_dir, settings.state_dir, REPO).read_ref("main") == new.commit
    assert sorted(new.downloaded) == sorted(["config.json", shard])
    assert srv.egress_bytes < len(new_files[shard]) + 64 * 1024


def test_include_exclude_and_paginated_listing(tmp_path):
    root = tmp_path / "origin"
    files = model(root)
    with HubServer(root, tree_page_size=2) as srv:
        srv.faults.model_info_omit.add("siblings")  # a mirror whose revision lists no files: the tree pages
        settings = settings_for(tmp_path, srv.url)
        shards = fetch_snapshot(settings, REPO, include=["*.safetensors"], exclude=["model-00003-*"])
        assert set(snapshot_contents(shards.snapshot_path)) == {
            p for p in files if p.endswith(".safetensors") and not p.startswith("model-00003-")
        }
        everything = fetch_snapshot(settings, REPO)
        assert snapshot_contents(everything.snapshot_path) == files
        assert sorted(everything.downloaded) == sorted(p for p in files if p not in shards.downloaded)
        assert sum("/tree/" in r.path for r in srv.requests) > 2  # the listing really was paged


def test_fetch_by_commit_writes_no_ref(tmp_path, origin):
    srv, _, files = origin
    settings = settings_for(tmp_path, srv.url)
    commit = srv.commit_for(REPO)
    result = fetch_snapshot(settings, REPO, revision=commit, include=["*.json"])
    assert result.commit == commit
    assert list(RepoCache(settings.cache_dir, settings.state_dir, REPO).refs_dir.iterdir()) == []


@pytest.mark.parametrize("where", ["HF_TOKEN_PATH", "HF_HOME"])
def test_the_token_file_huggingface_hub_reads_is_honoured(tmp_path, monkeypatch, where):
    # The chart mounts the HF token Secret as a file (HF_TOKEN_PATH); a laptop has `hf auth login`'s.
    token = "hf_token_from_a_file_0123456789"
    with model_origin(tmp_path / "gated", "acme/gated", total_bytes=2**16, shards=1, seed=2,
                      tokens=[token], gated=["acme/gated"]) as o:
        home = tmp_path / "hf-home"
        home.mkdir()
        (home / "token").write_text(token + "\n")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HOME", str(home))
        if where == "HF_TOKEN_PATH":
            (home / "token").rename(tmp_path / "mounted-token")
            monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "mounted-token"))
        args = ["fetch", "acme/gated", "--quiet", "--agent", "off", "--origin", o.hub.url,
                "--cache-dir", str(tmp_path / "c"), "--state-dir", str(tmp_path / "s")]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        (home / "token").unlink(missing_ok=True)
        (tmp_path / "mounted-token").unlink(missing_ok=True)
        shutil.rmtree(tmp_path / "c")
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 4, refused.output  # the same fetch without the file: anonymous
