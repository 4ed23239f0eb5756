"""Repos that share file contents, as real ones do (`.gitattributes`, the model card, a tokenizer, an
unchanged shard): every path works for the second repo, shared content is one file (one inode) in
the cache, downloaded once, seeded once, and survives the removal of either repo.

The origin is the real test hub serving a base model and a fine-tune made by
`agent.hub.testmodel.make_family`; agents, tracker and libtorrent are real, all on loopback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir, snapshot_download

from agent.cache.eviction import BlobReaders, Evictor, UsageLog, own_bytes, remove_model, scan_cache
from agent.cache.layout import RepoCache, repo_folder_name
from agent.core.settings import Settings
from agent.fetch.engine import fetch_snapshot
from agent.fetch.publish import publish_directory
from agent.hub.cdn import cdn_path
from agent.hub.server import HubServer
from agent.hub.testmodel import make_family
from tests.support.cluster import BIN, Origin, admin_request, agent_settings, repo_files, wait_until_seeded
from tests.support.cluster import fetch_and_wait as _fetch
from tests.support.procs import loop_until

BASE, TUNED = "acme/base", "acme/tuned"
SHARD = "model-00001-of-00003.safetensors"
"""The shard the fine-tune kept from its base (a frozen embedding)."""
SHARED = {".gitattributes", "README.md", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
          "model.safetensors.index.json", SHARD}
"""What the two repos share byte for byte, as written by make_family (checked below, not assumed)."""


@dataclasses.dataclass
class Family:
    hub: HubServer
    files: dict[str, dict[str, bytes]]
    """repo id -> path -> bytes."""

    def origin(self, repo_id: str) -> Origin:
        return Origin.of(self.hub, repo_id, self.files[repo_id])

    @property
    def shard_sha(self) -> str:
        return hashlib.sha256(self.files[BASE][SHARD]).hexdigest()

    def shard_gets(self) -> int:
        """GETs of the shared shard's bytes at the origin (its CDN URL, whichever repo's resolve gave it)."""
        paths = {cdn_path(repo_id, self.shard_sha) for repo_id in self.files}
        return sum(1 for r in self.hub.requests if r.method == "GET" and r.path in paths)

    def unique_bytes(self) -> int:
        return sum(len(b) for b in {hashlib.sha256(b).digest(): b for f in self.files.values()
                                    for b in f.values()}.values())


@pytest.fixture
def family(tmp_path: Path) -> Iterator[Family]:
    root = tmp_path / "hub"
    make_family(root, BASE, TUNED, total_bytes=3 * 2**20, shards=3, seed=11)
    files = {r: repo_files(root, r) for r in (BASE, TUNED)}
    assert {p for p in files[BASE] if files[BASE][p] == files[TUNED].get(p)} == SHARED
    with HubServer(root) as hub:
        yield Family(hub, files)


def _blob(cache_dir: Path, repo_id: str, path: str) -> Path:
    snapshots = cache_dir / repo_folder_name(repo_id) / "snapshots"
    (snap,) = list(snapshots.iterdir())
    return (snap / path).resolve()


def _assert_one_file_per_content(cache_dir: Path) -> None:
    for path in SHARED:
        a, b = _blob(cache_dir, BASE, path), _blob(cache_dir, TUNED, path)
        assert a != b and a.parent.parent != b.parent.parent  # each repo has its own blobs/ entry...
        assert os.path.samefile(a, b), path  # ...and they are one file


def _assert_repo(cache_dir: Path, fam: Family, repo_id: str) -> None:
    """The snapshot holds the origin's bytes, and huggingface_hub reads it offline."""
    snap = Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True))
    got = {str(p.relative_to(snap)): p.read_bytes() for p in snap.rglob("*") if p.is_file()}
    assert got == fam.files[repo_id]


def test_second_repo_sharing_files_fetches_through_the_daemon(family, tracker, make_agent):
    """The reported failure: X then Y on a daemon with a tracker; Y's shared blobs are already seeded
    from X's folder, and its fetch ended in FileNotFoundError on every node."""
    a = make_agent("a", family.origin(BASE), tracker)
    _fetch(a, BASE)
    family.hub.reset_counters()
    status = _fetch(a, TUNED)
    sources = {f["path"]: f["source"] for f in status["files"]}
    assert all(sources[p] == "cache" for p in SHARED), sources
    assert family.shard_gets() == 0
    gets = [r.path for r in family.hub.requests if r.method == "GET" and "/resolve/" in r.path]
    fetched = {p.rsplit("/", 1)[-1] for p in gets}
    assert not fetched & SHARED, fetched
    cache_dir = a.settings.cache_dir
    _assert_one_file_per_content(cache_dir)
    assert not scan_cache_dir(cache_dir).warnings
    _assert_repo(cache_dir, family, BASE)
    _assert_repo(cache_dir, family, TUNED)
    # Seeded once: one torrent per blob id, whichever repo's link it reads.
    assert len(a.held_blobs()) == len({hashlib.sha256(b).digest() for f in family.files.values()
                                       for b in f.values()})


def test_two_repos_requested_at_once_on_one_node_download_shared_content_once(family, tracker, make_agent):
    a = make_agent("a", family.origin(BASE), tracker)
    jobs = [a.request_model(BASE, "main"), a.request_model(TUNED, "main")]
    for job in jobs:
        assert job.wait(90) and job.status().phase == "Ready", job.status()
    assert family.shard_gets() >= 1  # fetched from the origin...
    assert family.hub.egress_bytes <= 1.1 * family.unique_bytes()  # ...once
    _assert_one_file_per_content(a.settings.cache_dir)
    _assert_repo(a.settings.cache_dir, family, TUNED)


def test_three_nodes_fetch_the_fine_tune_while_one_holds_the_base_then_rm_keeps_seeding(
    family, tracker, make_agent, tmp_path
):
    """The issue's "done when": A holds X; A, B, C fetch Y at once; all verified; the shared shard is
    one inode on A; after `rm X` on A, a fresh node fetches Y with 0 bytes of that shard from the origin."""
    a = make_agent("a", family.origin(BASE), tracker)
    _fetch(a, BASE)
    b = make_agent("b", family.origin(TUNED), tracker)
    c = make_agent("c", family.origin(TUNED), tracker)
    jobs = [d.request_model(TUNED, "main") for d in (a, b, c)]
    for job in jobs:
        assert job.wait(120) and job.status().phase == "Ready", job.status()
    for d in (a, b, c):
        _assert_repo(d.settings.cache_dir, family, TUNED)
    _assert_one_file_per_content(a.settings.cache_dir)

    resp = admin_request(a.admin_url, "DELETE", f"/v1/models/{BASE}", timeout=30)
    assert resp.status_code == 200, resp.text
    assert family.shard_sha in resp.json()["shared"]
    assert not (a.settings.cache_dir / repo_folder_name(BASE)).exists()
    _assert_repo(a.settings.cache_dir, family, TUNED)
    ih = a.held_blobs()[family.shard_sha]
    st = a.swarm.status(ih)
    assert st.state == "seeding" and st.path == _blob(a.settings.cache_dir, TUNED, SHARD)

    b.stop()
    c.stop()
    wait_until_seeded(tracker, a)
    family.hub.reset_counters()
    d = make_agent("d", family.origin(TUNED), tracker)
    status = _fetch(d, TUNED)
    assert family.shard_gets() == 0, family.hub.requests
    shard = next(f for f in status["files"] if f["path"] == SHARD)
    assert shard["source"] == "peers"
    _assert_repo(d.settings.cache_dir, family, TUNED)


def _standalone(tmp_path: Path, fam: Family) -> Settings:
    settings = Settings.from_env_defaults(cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
    return dataclasses.replace(settings, origin=dataclasses.replace(settings.origin, endpoint=fam.hub.url))


def test_standalone_fetch_links_what_another_repo_holds_and_rm_leaves_it(family, tmp_path):
    settings = _standalone(tmp_path, family)
    fetch_snapshot(settings, BASE)
    family.hub.reset_counters()
    result = fetch_snapshot(settings, TUNED)
    assert family.shard_gets() == 0
    assert set(result.downloaded) == set(family.files[TUNED]) - SHARED
    _assert_one_file_per_content(settings.cache_dir)
    assert not scan_cache_dir(settings.cache_dir).warnings
    assert own_bytes(scan_cache(settings.cache_dir)) == family.unique_bytes()  # shared bytes counted once

    removed = remove_model(settings, BASE)
    assert family.shard_sha in removed.shared
    assert removed.bytes_freed == sum(len(b) for p, b in family.files[BASE].items() if p not in SHARED)
    _assert_repo(settings.cache_dir, family, TUNED)
    assert not scan_cache_dir(settings.cache_dir).warnings


def test_agent_fetch_cli_links_shared_content(family, tmp_path):
    """The same through the real `agent fetch` command, as a laptop user runs it."""
    cache, state = tmp_path / "cache", tmp_path / "state"
    for repo_id in (BASE, TUNED):
        r = subprocess.run(
            [str(BIN / "agent"), "fetch", repo_id, "--cache-dir", str(cache), "--state-dir", str(state),
             "--origin", family.hub.url],
            capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
    assert "TiB/s" not in r.stderr and "GiB/s" not in r.stderr, r.stderr
    _assert_one_file_per_content(cache)
    _assert_repo(cache, family, TUNED)


def test_eviction_counts_shared_content_once_and_frees_it_with_the_last_repo(family, tmp_path):
    settings = _standalone(tmp_path, family)
    fetch_snapshot(settings, BASE)
    fetch_snapshot(settings, TUNED)
    usage = UsageLog(settings.state_dir / "usage.json")
    repos = scan_cache(settings.cache_dir)
    for repo in repos.values():
        usage.touch(repo.blobs, when=2000.0)
    usage.touch([family.shard_sha], when=1000.0)  # the shared shard is the least recently used
    limit = family.unique_bytes() - 1  # one byte too many: exactly one blob must go
    ops = dataclasses.replace(settings.ops, cache_max_bytes=limit)
    limited = dataclasses.replace(settings, ops=ops)

    pinned = Evictor(limited, usage, BlobReaders(), pins=lambda: [TUNED])
    (evicted,) = pinned.run_once()
    assert evicted.blob_id != family.shard_sha  # the fine-tune is pinned, so its shared shard stays
    base_copy = settings.cache_dir / repo_folder_name(BASE) / "blobs" / family.shard_sha
    assert os.path.samefile(base_copy, _blob(settings.cache_dir, TUNED, SHARD))

    fetch_snapshot(settings, BASE)  # put the evicted blob back
    usage.touch([family.shard_sha], when=1000.0)
    (evicted,) = Evictor(limited, usage, BlobReaders()).run_once()
    assert evicted.blob_id == family.shard_sha
    assert set(evicted.repo_ids) == {BASE, TUNED}
    assert evicted.size == len(family.files[BASE][SHARD])  # one file freed, not two
    repos = scan_cache(settings.cache_dir)
    assert all(family.shard_sha not in r.blobs for r in repos.values())
    assert not scan_cache_dir(settings.cache_dir).warnings  # both snapshots using it went with it


def test_verify_repairs_shared_content_for_every_repo(family, tmp_path):
    settings = _standalone(tmp_path, family)
    fetch_snapshot(settings, BASE)
    fetch_snapshot(settings, TUNED)
    blob = _blob(settings.cache_dir, BASE, SHARD)
    with open(blob, "r+b") as fh:  # flip bytes in place: both repos see the damage
        fh.seek(4096)
        fh.write(b"\xff" * 64)
    r = subprocess.run(
        [str(BIN / "agent"), "verify", BASE, "--cache-dir", str(settings.cache_dir), "--state-dir",
         str(settings.state_dir), "--origin", family.hub.url, "--agent", "off"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    _assert_repo(settings.cache_dir, family, BASE)
    _assert_repo(settings.cache_dir, family, TUNED)
    _assert_one_file_per_content(settings.cache_dir)


def test_restart_seeds_shared_content_from_the_repo_that_keeps_it(family, tracker, make_agent, tmp_path):
    a = make_agent("a", family.origin(BASE), tracker)
    _fetch(a, BASE)
    _fetch(a, TUNED)
    seeding_from = a.swarm.status(a.held_blobs()[family.shard_sha]).path
    a.stop()
    # `agent rm` with no daemon running: only the files change; the restart must cope.
    removed = remove_model(a.settings, BASE if BASE in str(seeding_from) else TUNED)
    assert family.shard_sha in removed.shared
    kept = TUNED if removed.repo_id == BASE else BASE
    again = make_agent("a", family.origin(kept), tracker)
    ih = loop_until(lambda: again.held_blobs().get(family.shard_sha), timeout=30, what="shared shard seeded")
    st = again.swarm.status(ih)
    assert st.state == "seeding" and st.path == _blob(again.settings.cache_dir, kept, SHARD)
    _assert_repo(again.settings.cache_dir, family, kept)


def test_publish_links_content_the_cache_already_holds(family, tmp_path):
    settings = _standalone(tmp_path, family)
    fetch_snapshot(settings, BASE)
    local = tmp_path / "finetune"
    local.mkdir()
    (local / SHARD).write_bytes(family.files[BASE][SHARD])
    (local / "adapter.safetensors").write_bytes(family.files[TUNED]["model-00002-of-00003.safetensors"])
    result = publish_directory(settings, local, "local/ft")
    cache = RepoCache(settings.cache_dir, settings.state_dir, "local/ft")
    assert os.path.samefile(cache.snapshot_file(result.commit, SHARD), _blob(settings.cache_dir, BASE, SHARD))
    assert not scan_cache_dir(settings.cache_dir).warnings


def test_hf_endpoint_serves_a_repo_whose_content_another_repo_brought(family, tmp_path):
    from agent.daemon.node import Daemon

    daemon = Daemon(agent_settings(tmp_path, "a", family.hub.url, None))
    daemon.start()
    try:
        _fetch(daemon, BASE)
        family.hub.reset_counters()
        client_cache = tmp_path / "client"
        snap = Path(snapshot_download(TUNED, cache_dir=client_cache, endpoint=daemon.api_url))
        got = {str(p.relative_to(snap)): p.read_bytes() for p in snap.rglob("*") if p.is_file()}
        assert got == family.files[TUNED]
        assert family.shard_gets() == 0  # served from the base's copy
    finally:
        daemon.stop()
