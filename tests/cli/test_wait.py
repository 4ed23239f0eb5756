"""`agent wait` as an init container runs it (a subprocess), against a real agent on loopback, or with
the agent unreachable and only the hub cache to look at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.cli.wait import complete_snapshot
from agent.kube.requests import ModelRef
from tests.support.cluster import REPO, Origin, agent_cli, assert_snapshot_verifies, socket_dir
from tests.support.procs import free_port

EXIT_TIMEOUT = 7


def unreachable_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture
def slow_origin(make_origin) -> Origin:
    return make_origin(  # ~30 s for the model: far beyond the timeout
        REPO, total_bytes=3 * 2**20, shards=3, seed=5, root="slow-origin", rate_total=100 * 1024
    )


@pytest.fixture
def filled_cache(tmp_path: Path, origin: Origin) -> Path:
    """A hub cache filled by a standalone `agent fetch` (no agent running)."""
    cache = tmp_path / "filled" / "hub"
    res = agent_cli("fetch", REPO, "--agent", "off", "--cache-dir", str(cache),
                    "--state-dir", str(tmp_path / "filled" / "state"), "--origin", origin.hub.url, "--quiet")
    assert res.returncode == 0, res.stderr
    return cache


def test_wait_through_the_agent_requests_and_reports(origin, make_agent, tmp_path) -> None:
    # As the chart's init container: over the pods' socket.
    pods = socket_dir() / f"pods-{tmp_path.name[-24:]}.sock"
    daemon = make_agent("a", origin, None, daemon={"pods_socket": pods})
    res = agent_cli("wait", REPO, "--agent", f"unix://{pods}", "--timeout", "60")
    assert res.returncode == 0, res.stderr
    snapshot = res.stdout.strip().splitlines()[-1]
    assert_snapshot_verifies(snapshot, origin)
    assert Path(snapshot).parents[2] == daemon.settings.cache_dir
    # The agent fetched it because `wait` asked (no pod annotation involved), with progress on stderr.
    assert [j.key.repo_id for j in daemon.jobs.all()] == [REPO]
    assert "fetching model-00001-of-00003.safetensors" in res.stderr
    assert f"{REPO}@main ready" in res.stderr and "from the origin" in res.stderr
    assert snapshot not in res.stderr.splitlines()  # the path is stdout's business

    again = agent_cli("wait", f"{REPO}@main", "--agent", str(pods), "--timeout", "30")
    assert again.returncode == 0 and again.stdout.strip() == snapshot


def test_wait_times_out_with_a_clear_line(slow_origin, make_agent) -> None:
    daemon = make_agent("a", slow_origin, None)
    res = agent_cli("wait", REPO, "--agent", daemon.admin_url, "--timeout", "1.5")
    assert res.returncode == EXIT_TIMEOUT, res.stderr
    assert res.stdout == ""
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {REPO}@main not complete after 1.5s: the agent reports ")
    assert " of 3.0 MiB" in last or "Pending" in last
    assert "(downloading from the origin)" in last or "(queued" in last  # which stage is slow


def test_wait_for_an_unknown_repo_fails(origin, make_agent) -> None:
    daemon = make_agent("a", origin, None)
    res = agent_cli("wait", "acme/missing", "--agent", daemon.admin_url, "--timeout", "30")
    assert res.returncode not in (0, EXIT_TIMEOUT), res.stderr
    assert res.stdout == ""
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the agent could not fetch acme/missing@main:")


def test_wait_rejects_a_malformed_reference() -> None:
    res = agent_cli("wait", "not a repo", "--agent", unreachable_url(), "--timeout", "5")
    assert res.returncode == 2 and "bad model reference" in res.stderr


def test_agent_unreachable_but_model_complete_in_the_cache(filled_cache: Path, origin: Origin) -> None:
    res = agent_cli("wait", REPO, "--agent", unreachable_url(), "--cache-dir", str(filled_cache),
                    "--timeout", "20")
    assert res.returncode == 0, res.stderr
    snapshot = res.stdout.strip().splitlines()[-1]
    assert_snapshot_verifies(snapshot, origin)
    assert "unreachable" in res.stderr and "complete in the cache" in res.stderr
    # A commit revision works too (no ref involved).
    commit = Path(snapshot).name
    by_commit = agent_cli("wait", f"{REPO}@{commit}", "--agent", unreachable_url(),
                          "--cache-dir", str(filled_cache), "--timeout", "20")
    assert by_commit.returncode == 0 and by_commit.stdout.strip() == snapshot


def test_agent_unreachable_and_model_absent_times_out(tmp_path: Path) -> None:
    res = agent_cli("wait", REPO, "--agent", unreachable_url(), "--cache-dir", str(tmp_path / "empty"),
                    "--timeout", "2")
    assert res.returncode == EXIT_TIMEOUT, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {REPO}@main not complete after 2s: the agent at ")
    assert "unreachable" in last


def test_offline_completeness_needs_every_blob_and_every_indexed_shard(filled_cache: Path) -> None:
    ref = ModelRef(REPO)
    snapshot = complete_snapshot(filled_cache, ref)
    assert snapshot is not None
    shard = snapshot / "model-00002-of-00003.safetensors"
    blob = shard.resolve()
    # A blob still downloading (or evicted) leaves a dangling link: not complete.
    os.rename(blob, blob.with_name(blob.name + ".incomplete"))
    assert complete_snapshot(filled_cache, ref) is None
    os.rename(blob.with_name(blob.name + ".incomplete"), blob)
    assert complete_snapshot(filled_cache, ref) == snapshot
    # A shard the index lists but the snapshot lacks: not complete.
    link = os.readlink(shard)
    shard.unlink()
    assert complete_snapshot(filled_cache, ref) is None
    os.symlink(link, shard)
    assert complete_snapshot(filled_cache, ref) == snapshot
    # No ref for the branch: nothing says which snapshot is `main`.
    (filled_cache / "models--acme--tiny" / "refs" / "main").unlink()
    assert complete_snapshot(filled_cache, ref) is None
    assert complete_snapshot(filled_cache, ModelRef(REPO, snapshot.name)) == snapshot
