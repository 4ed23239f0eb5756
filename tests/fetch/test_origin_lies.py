"""An origin whose answers disagree with themselves: what is left on disk, and what the user is told.

A failed blob that no resume can fix (the origin lists more bytes than it has, its bytes fail their
hash) takes its reservation and its resume record with it; a failed fetch leaves `refs/<rev>` where it
was, so a reader of the branch never lands on a snapshot missing files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cache.layout import RepoCache
from agent.cli.main import main
from agent.core.errors import EXIT_INTEGRITY, IntegrityError, OriginError, OriginLengthError
from agent.fetch.engine import fetch_snapshot
from agent.hub import server as hub_server
from agent.hub.server import HubServer
from agent.hub.testmodel import change_shard
from tests.support.fetchkit import (
    REPO,
    GiB,
    MiB,
    allocated,
    assert_one_line_error,
    fetch_args,
    leftovers,
    model,
    settings_for,
    shards,
    snapshot_contents,
)


def test_an_origin_that_lists_ten_gib_and_sends_three_mib_leaves_no_allocation(tmp_path: Path):
    root = tmp_path / "origin"
    files = model(root, total=3 * MiB, shards=1)
    shard = shards(files)[0]
    with HubServer(root) as srv:
        srv.faults.claimed_sizes[shard] = 10 * GiB
        settings = settings_for(tmp_path, srv.url)
        with pytest.raises(OriginLengthError) as info:
            fetch_snapshot(settings, REPO)
        message = str(info.value)
        assert f"lists {10 * GiB} bytes, but " in message, message
        assert "discarded" in message
        assert leftovers(settings.cache_dir, settings.state_dir) == []
        assert allocated(settings.cache_dir) < 64 * MiB  # not the 10 GiB it reserved
        # The CLI says the same in one line, with the integrity exit code.
        result = CliRunner().invoke(main, fetch_args(srv.url, tmp_path / "cli"))
        assert_one_line_error(result, EXIT_INTEGRITY, "cannot send what it lists")


def test_a_new_revision_that_fails_part_way_leaves_the_branch_on_the_old_one(tmp_path: Path):
    root = tmp_path / "origin"
    files = model(root, total=8 * MiB, shards=2)
    with HubServer(root) as srv:
        settings = settings_for(tmp_path, srv.url)
        first = fetch_snapshot(settings, REPO)
        changed = change_shard(root, REPO, 1, seed=99)
        second = srv.commit_for(REPO)
        assert second != first.commit
        srv.faults.corrupt_paths = {changed.name}
        with pytest.raises(IntegrityError, match=changed.name):
            fetch_snapshot(settings, REPO)
        cache = RepoCache(settings.cache_dir, settings.state_dir, REPO)
        assert cache.read_ref("main") == first.commit  # not the snapshot that is missing a shard
        assert snapshot_contents(first.snapshot_path) == files
        assert leftovers(settings.cache_dir, settings.state_dir) == []
        assert not os.path.lexists(cache.snapshot_dir(second) / changed.name)


class _Sha(hub_server._Handler):
    """A hub whose revision answer names a commit made of `../` segments."""

    def _model_info(self, repo_id, revision, query):
        info = hub_server.listing.model_info(
            self._snapshot(repo_id, revision, False), private=False, gated=False, blobs=False
        )
        info["sha"] = "../../x?recursive=true#"
        self._send_json(200, info)


def test_a_commit_id_made_of_dot_segments_goes_into_no_url(tmp_path: Path):
    root = tmp_path / "origin"
    model(root, total=2 * MiB, shards=1)
    with HubServer(root) as srv:
        srv._server.RequestHandlerClass = _Sha
        with pytest.raises(OriginError, match="did not return a commit"):
            fetch_snapshot(settings_for(tmp_path, srv.url), REPO)
        assert [r.path for r in srv.requests] == [f"/api/models/{REPO}/revision/main"]  # nothing more asked


@pytest.mark.parametrize(
    ("headers", "refusal"),
    [
        ({"X-Repo-Commit": "../../x", "X-Linked-Etag": '"' + "a" * 64 + '"'}, "malformed commit"),
        ({"X-Linked-Etag": '"../../../etc/passwd"'}, "no usable ETag"),
        ({"X-Linked-Etag": '"' + "a" * 64 + '"', "X-Linked-Size": "1e12"}, "malformed size"),
    ],
    ids=["commit", "etag", "size"],
)
def test_what_a_resolve_answer_says_is_checked_before_it_is_used(tmp_path: Path, headers, refusal):
    root = tmp_path / "origin"
    files = model(root, total=2 * MiB, shards=1)
    with HubServer(root) as srv:
        commit = srv.commit_for(REPO)
        to_cdn = {**headers, "Location": f"{srv.cdn_url}/elsewhere"}
        srv.faults.path_status[f"/{REPO}/resolve/{commit}/{shards(files)[0]}"] = (302, to_cdn)
        settings = settings_for(tmp_path, srv.url)
        with pytest.raises(OriginError, match=refusal):
            fetch_snapshot(settings, REPO)
        assert leftovers(settings.cache_dir, settings.state_dir) == []
        assert not [r for r in srv.requests if r.bucket == "cdn"]
