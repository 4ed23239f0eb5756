"""Revisions the Hub makes itself (`refs/pr/N`, `refs/convert/NAME`) go where huggingface_hub puts them.

huggingface_hub's `_cache_commit_hash_for_specific_revision` (file_download.py) writes a revision's ref
at `Path(storage_folder) / "refs" / revision` with its parents made, so `refs/pr/1` is the file
`refs/refs/pr/1`; `snapshot_download(..., local_files_only=True)` reads it back from
`os.path.join(storage_folder, "refs", revision)`. The test hub serves such refs from `.refs/pr/1/` beside
the repo's `main` files (agent.hub.repos).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.core.errors import AnnotationError
from agent.http.hf_paths import BadPath, api_request, resolve_request
from agent.kube.requests import ModelRef, parse_model_ref
from tests.support.fetchkit import REPO, fetch_args, model, repo_dir, serve, snapshot_contents

HUB_REFS = ("refs/pr/1", "refs/convert/parquet")


@pytest.fixture
def origin(tmp_path):
    """`main` and two Hub-made refs of one repo, each with other bytes."""
    root = tmp_path / "origin"
    files = {"main": model(root, total=2 * 2**20, shards=1, seed=1)}
    for n, ref in enumerate(HUB_REFS, start=2):
        other = tmp_path / f"other{n}"
        files[ref] = model(other, total=2 * 2**20, shards=1, seed=n)
        shutil.copytree(other / REPO, root / REPO / ".refs" / ref.removeprefix("refs/"))
    yield from ((srv, files) for srv in serve(root))


def test_agent_fetch_of_a_pr_ref_is_what_huggingface_hub_reads_offline(tmp_path, origin):
    from huggingface_hub import snapshot_download

    srv, files = origin
    cache = tmp_path / "hub"
    runner = CliRunner()
    for ref in ("main", *HUB_REFS):
        result = runner.invoke(main, fetch_args(srv.url, tmp_path, "--revision", ref))
        assert result.exit_code == 0, result.output
        snapshot = Path(result.stdout.strip().splitlines()[-1])
        assert snapshot_contents(snapshot) == files[ref]
        # huggingface_hub's own place for the ref: refs/ + the revision, its slashes as folders.
        assert (repo_dir(cache) / "refs" / ref).read_text() == snapshot.name
        got = snapshot_download(REPO, revision=ref, cache_dir=cache, local_files_only=True)
        assert Path(got) == snapshot
    assert len({(repo_dir(cache) / "refs" / ref).read_text() for ref in ("main", *HUB_REFS)}) == 3

    result = runner.invoke(
        main, ["rm", f"{REPO}@refs/pr/1", "--cache-dir", str(cache), "--state-dir", str(tmp_path / "st")]
    )
    assert result.exit_code == 0, result.output
    assert not (repo_dir(cache) / "refs" / "refs" / "pr" / "1").exists()
    assert Path(snapshot_download(REPO, cache_dir=cache, local_files_only=True)).is_dir()  # main stays


def test_a_revision_that_names_no_hub_ref_is_not_a_path_of_the_test_hub(tmp_path, origin):
    srv, _files = origin
    runner = CliRunner()
    for ref in ("refs/pr/2", "refs/pr/01", "refs/heads/main", "refs/convert/../pr/1"):
        result = runner.invoke(main, fetch_args(srv.url, tmp_path, "--revision", ref))
        assert result.exit_code != 0, ref
    assert not (tmp_path / "hub" / "models--org--tiny" / "snapshots").exists()


@pytest.mark.parametrize("ref", HUB_REFS)
def test_every_door_takes_hub_made_refs(ref):
    assert parse_model_ref(f"{REPO}@{ref}") == ModelRef(REPO, ref)
    quoted = ref.replace("/", "%2F")
    assert api_request(f"/api/models/{REPO}/revision/{quoted}".encode()).revision == ref
    assert resolve_request(f"/{REPO}/resolve/{quoted}/config.json".encode()).revision == ref


@pytest.mark.parametrize(
    "ref", ["refs/pr/../../x", "refs/pr/.1", "refs//pr/1", "refs/pr/1/", "refs/pr/1.lock", "refs/pr/1/.."]
)
def test_every_door_refuses_a_revision_that_could_leave_refs(ref):
    with pytest.raises(AnnotationError):
        parse_model_ref(f"{REPO}@{ref}")
    quoted = ref.replace("/", "%2F")
    with pytest.raises(BadPath):
        api_request(f"/api/models/{REPO}/revision/{quoted}".encode())
    with pytest.raises(BadPath):
        resolve_request(f"/{REPO}/resolve/{quoted}/config.json".encode())
