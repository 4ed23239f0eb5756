"""What even the node's admin channel refuses (docs/security.md): publishing outside the
`--publish-root`s, through a symlink that leaves the folder, or under a repo id the origin has;
removing a model that pods on the node use, unless forced. Real daemons on a real test hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libtorrent as lt
import pytest

from agent.daemon.node import Daemon
from agent.http.agent_httpx import http_client
from agent.hub.testmodel import make_model
from tests.support.cluster import Origin, agent_settings, fetch_and_wait
from tests.support.procs import free_port


def _agent(tmp_path: Path, origin_url: str, name: str = "node", **daemon: Any) -> Daemon:
    s = agent_settings(tmp_path, name, origin_url, None)
    # Short backoff: an unreachable origin is the point of one test here, not its retries' pace.
    origin = dataclasses.replace(s.origin, backoff_base=0.05)
    d = Daemon(dataclasses.replace(s, origin=origin, daemon=dataclasses.replace(s.daemon, **daemon)))
    d.start()
    return d


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """(a publish root holding a model folder `ft`, a folder outside it holding a 'secret')."""
    root = tmp_path / "models"
    make_model(root, "me/ft", total_bytes=2**18, shards=1, seed=9)
    outside = tmp_path / "serviceaccount"
    outside.mkdir()
    (outside / "token").write_text("a-kubernetes-service-account-token")
    return root, outside


@pytest.fixture
def node(tmp_path: Path, origin: Origin, roots: tuple[Path, Path]) -> Iterator[Daemon]:
    d = _agent(tmp_path, origin.hub.url, publish_roots=(roots[0].resolve(),))
    try:
        yield d
    finally:
        d.stop()


def _publish(d: Daemon, directory: Path, repo_id: str) -> tuple[int, str]:
    with http_client(d.admin_url, 60) as admin:
        resp = admin.post("/v1/publish", json={"directory": str(directory), "repo_id": repo_id})
    return resp.status_code, resp.json().get("detail", "") if resp.status_code >= 400 else ""


def test_publish_reads_only_under_its_roots(node: Daemon, roots: tuple[Path, Path]):
    root, outside = roots
    code, detail = _publish(node, outside, "local/stolen")
    assert code == 403 and "outside the agent's --publish-root" in detail
    code, detail = _publish(node, root / "me" / ".." / ".." / "serviceaccount", "local/stolen")
    assert code == 403 and "outside" in detail
    assert not list(node.settings.cache_dir.glob("models--local--stolen"))
    assert _publish(node, root / "me" / "ft", "local/ft")[0] == 200


def test_what_a_node_publishes_it_seeds_as_had(node: Daemon, roots: tuple[Path, Path]):
    """The node computed the piece hashes from the files it copied in: no piece is read and hashed again
    when a peer first asks for it (seed mode, agent.swarm.session `Swarm.seed`)."""
    assert _publish(node, roots[0] / "me" / "ft", "local/ft")[0] == 200
    held = node.seeder.held()
    assert held
    for ih in held.values():
        handle = node.swarm._torrents[ih].handle
        assert not handle.flags() & lt.torrent_flags.seed_mode, ih
        assert all(handle.status(lt.torrent_handle.query_pieces).pieces), ih


def test_publishing_is_off_without_a_root(tmp_path: Path, origin: Origin, roots: tuple[Path, Path]):
    d = _agent(tmp_path, origin.hub.url)
    try:
        code, detail = _publish(d, roots[0] / "me" / "ft", "local/ft")
    finally:
        d.stop()
    assert code == 403 and "--publish-root" in detail


def test_a_symlink_out_of_the_folder_is_refused_one_inside_is_published(node: Daemon, roots):
    root, outside = roots
    (root / "me" / "ft" / "token.txt").symlink_to(outside / "token")
    code, detail = _publish(node, root / "me" / "ft", "local/ft")
    assert code == 400 and "outside" in detail, detail
    assert not list(node.settings.cache_dir.glob("models--local--ft/snapshots/*"))
    (root / "me" / "ft" / "token.txt").unlink()
    (root / "me" / "ft" / "README.txt").symlink_to(root / "me" / "ft" / "config.json")
    assert _publish(node, root / "me" / "ft", "local/ft")[0] == 200
    snap = next(node.settings.cache_dir.glob("models--local--ft/snapshots/*"))
    assert (snap / "README.txt").read_bytes() == (root / "me" / "ft" / "config.json").read_bytes()


def test_a_repo_id_the_origin_has_cannot_be_shadowed(node: Daemon, origin: Origin, roots):
    code, detail = _publish(node, roots[0] / "me" / "ft", origin.repo_id)
    assert code == 403 and "must not shadow" in detail, detail
    assert not list(node.settings.cache_dir.glob(f"models--{origin.repo_id.replace('/', '--')}"))


def test_without_an_origin_to_ask_publishing_needs_the_air_gap_flag(tmp_path: Path, roots):
    no_origin = f"http://127.0.0.1:{free_port()}"
    root = roots[0].resolve()
    d = _agent(tmp_path, no_origin, publish_roots=(root,))
    try:
        code, detail = _publish(d, root / "me" / "ft", "local/ft")
        assert code == 403 and "--publish-unchecked-ids" in detail, detail
    finally:
        d.stop()
    d = _agent(tmp_path, no_origin, "airgapped", publish_roots=(root,), publish_unchecked_ids=True)
    try:
        assert _publish(d, root / "me" / "ft", "local/ft")[0] == 200
    finally:
        d.stop()


def test_rm_refuses_a_model_pods_use_unless_forced(node: Daemon, origin: Origin):
    fetch_and_wait(node, origin.repo_id)
    node.ops.pin_for_pods({origin.repo_id})  # what the pod watcher does for a pod that asks for it
    with http_client(node.admin_url, 30) as admin:
        refused = admin.delete(f"/v1/models/{origin.repo_id}")
        assert refused.status_code == 403 and "in use" in refused.json()["detail"]
        assert [m["repo_id"] for m in node.list_models()] == [origin.repo_id]
        forced = admin.delete(f"/v1/models/{origin.repo_id}", params={"force": "true"})
        assert forced.status_code == 200, forced.text
    assert node.list_models() == []
