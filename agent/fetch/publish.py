"""`agent publish DIR --repo-id ID`: a local model (private, fine-tuned) enters the swarm with no hub.

Each file is copied once into `blobs/` while one pass computes its blob id (sha256, as an LFS oid),
the xxh3 sidecar and the BitTorrent piece hashes; the snapshot gets relative symlinks and
`refs/<revision>`, exactly as a fetched model. The commit id is deterministic: the sha1 of the
sorted (path, blob id) list, so publishing the same files twice gives the same commit on every
node. The tracker gets each blob's metainfo (agent role) and the manifest (publisher role), signed
with the publisher's Ed25519 key (agent.core.signing), which every agent verifies before planning
from it; a commit's manifest never changes, and only the publisher moves `revision`. The daemon
seeds. A daemon publishes only from its `--publish-root`s and never under a repo id the
origin has (`check_publish_source`, `check_repo_id_unowned`). Other nodes then `agent fetch ID`
(or use the pod annotation) and the daemon's fetch path plans from the tracker's manifest when
the origin does not know the repo (agent.fetch.planning).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cache.layout import BlobDigest, RepoCache, check_repo_id, safe_relpath
from agent.core.errors import (
    AuthError,
    ConfigError,
    DiskSpaceError,
    NotFoundError,
    RefusedError,
    TrackerError,
    UnsafePathError,
    WeightswarmError,
)
from agent.core.hashing import BlobHasher
from agent.core.metainfo import infohash
from agent.core.modelnames import RepoName, as_is
from agent.core.settings import Settings
from agent.core.signing import load_private_key, manifest_payload, sign_manifest
from agent.origin.kinds import open_origin
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

_BLOCK = 4 * 2**20

SeedBlob = Callable[[Path, str, bytes, bool], str]
"""(blob path, blob id, bencoded info, whose piece hashes were computed here from the blob's bytes) ->
infohash: the daemon starts seeding it (agent.swarm.session `Swarm.seed`)."""


@dataclass(frozen=True)
class PublishResult:
    repo_id: str
    revision: str
    commit: str
    snapshot: Path
    files: list[dict[str, Any]]
    """path, size, blob_id, infohash per file (the manifest)."""
    published: bool
    """The tracker has the manifest and metainfo."""
    seeded: int

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "snapshot": str(self.snapshot),
            "files": self.files,
            "published": self.published,
            "seeded": self.seeded,
        }


def commit_for(files: list[tuple[str, str]]) -> str:
    """Deterministic 40-hex commit id of a published snapshot: sha1 of the sorted (path, blob id) list."""
    return hashlib.sha1(json.dumps(sorted(files), separators=(",", ":")).encode()).hexdigest()


def check_publish_source(settings: Settings, directory: Path) -> tuple[Path, Path]:
    """(the real path of `directory`, the `--publish-root` holding it) if this agent may publish
    from it (no roots configured: publishing is off). A daemon's check; the standalone CLI
    publishes what its user can read anyway."""
    roots = settings.daemon.publish_roots
    if not roots:
        raise RefusedError("publishing is off on this agent: start it with --publish-root DIR")
    real = directory.expanduser().resolve()
    for root in roots:
        if real.is_relative_to(root):
            return real, root
    allowed = ", ".join(str(r) for r in roots)
    raise RefusedError(f"{directory} is outside the agent's --publish-root ({allowed})")


def check_can_register(settings: Settings) -> None:
    """Refuse, before a byte is copied, a publish this agent could not register with its tracker:
    the manifest needs the tracker's publisher-role token and the publisher's signing key."""
    daemon = settings.daemon
    if not daemon.publisher_token:
        raise RefusedError("this agent cannot publish: start it with --publisher-token-file")
    if not daemon.publisher_signing_key:
        raise RefusedError(
            "this agent cannot publish: every agent checks a published manifest's signature, and this "
            "one has no key to sign it; pass --publisher-signing-key-file (`agent keygen DIR` makes a pair)"
        )
    load_private_key(daemon.publisher_signing_key)  # an unusable key is a ConfigError now, not after copying


def check_publishable(settings: Settings, repo_id: str, registering: bool, name: RepoName = as_is) -> None:
    """Everything that must hold before a publish copies a byte: a valid repo id, what registering
    with the tracker needs (`registering`), and a repo id the origin does not have."""
    check_repo_id(repo_id)
    if registering:
        check_can_register(settings)
    check_repo_id_unowned(settings, repo_id, name)


def check_repo_id_unowned(settings: Settings, repo_id: str, name: RepoName = as_is) -> None:
    """Refuse a repo id the origin has, so a local publish never shadows a Hub repo (clients asking
    for it would get the local files). A private repo the node's token cannot see looks absent
    (the Hub answers it with RepoNotFound), which no check can tell apart. When the origin cannot
    be asked, refuse unless `daemon.publish_unchecked_ids` (an air-gapped cluster). `name`: how a log
    line names the repo (the daemon's `ModelNames.repo`)."""
    client = open_origin(settings.origin, max_connections=1)
    try:
        client.has_repo(repo_id)
    except NotFoundError:
        return
    except AuthError:
        pass  # it exists, gated or forbidden to this node
    except WeightswarmError as exc:
        if settings.daemon.publish_unchecked_ids:
            log.warning("publishing %s without knowing whether the origin has it: %s", name(repo_id), exc)
            return
        raise RefusedError(
            f"cannot ask the origin whether it has {repo_id} ({exc}); publish under an id the origin "
            "lacks, or start the agent with --publish-unchecked-ids if it has no origin"
        ) from None
    finally:
        client.close()
    raise RefusedError(
        f"the origin {settings.origin.endpoint} has a repo {repo_id}; a local publish must not shadow "
        "it: choose another repo id"
    )


def local_files(directory: Path, boundary: Path | None = None) -> list[tuple[str, Path]]:
    """(repo path, real file) for every regular file below `directory`, hidden files and folders
    skipped. A symlink is followed only when its target is inside `boundary` (default: `directory`;
    a daemon's: the publish root, so a hub-cache snapshot's links into `blobs/` work), else
    `UnsafePathError`: a link must not publish a file from elsewhere, e.g. a mounted secret."""
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory; publish a folder that holds the model files")
    top = directory.resolve()
    fence = boundary.resolve() if boundary is not None else top
    out = []
    for dirpath, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            p = Path(dirpath) / name
            if name.startswith("."):
                continue
            real = p.resolve()
            if not real.is_relative_to(fence):
                raise UnsafePathError(f"{p} links to {real}, outside {fence}; publish real files only")
            if not real.is_file():
                continue
            rel = p.relative_to(top).as_posix()
            safe_relpath(rel)
            out.append((rel, real))
    if not out:
        raise ConfigError(f"{directory} holds no files to publish")
    return out


def _copy_hashed(src: Path, cache: RepoCache) -> tuple[str, BlobDigest, Path]:
    """Copy `src` into a temp in `blobs/` while hashing it; (blob id, digest, temp path)."""
    size = src.stat().st_size
    hasher = BlobHasher(size, is_lfs=True)
    tmp = cache.blobs_dir / f"publish-{uuid.uuid4().hex}.incomplete"
    try:
        # O_NOFOLLOW: `src` is a real path (local_files); a link swapped in since is not followed.
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(_BLOCK):
                hasher.update(chunk)
                fout.write(chunk)
        h = hasher.finish()
        if h.size != size or src.stat().st_size != size:
            raise ConfigError(f"{src} changed while it was being published; publish again")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return h.content_id, BlobDigest(h.size, 0, h.xxh3, h.piece_length, h.pieces), tmp


def publish_directory(
    settings: Settings,
    directory: Path,
    repo_id: str,
    revision: str = "main",
    tracker: TrackerClient | None = None,
    seed: SeedBlob | None = None,
    boundary: Path | None = None,
    name: RepoName = as_is,
) -> PublishResult:
    """`boundary`: where the folder's symlinks may point (`local_files`). With a `tracker`, the
    manifest is signed with `settings.daemon.publisher_signing_key` and registered with the
    publisher-role token (both checked before anything is copied). `name`: how a log line names the
    repo (the daemon's `ModelNames.repo`)."""
    check_repo_id(repo_id)
    safe_relpath(revision)
    if tracker is not None:
        check_can_register(settings)
    directory = directory.expanduser().resolve()
    files = local_files(directory, boundary)
    cache = RepoCache(settings.cache_dir, settings.state_dir, repo_id)
    cache.prepare()
    need = sum(p.stat().st_size for _rel, p in files) + settings.fetch.min_free_bytes
    free = shutil.disk_usage(cache.blobs_dir).free
    if free < need:
        raise DiskSpaceError(str(cache.blobs_dir), need, free)

    entries: list[tuple[str, str, BlobDigest]] = []
    hashed_here: set[str] = set()  # blobs whose recorded piece hashes are the ones just computed
    for rel, path in files:
        blob_id, computed, tmp = _copy_hashed(path, cache)
        digest = computed
        if cache.adopt_blob(blob_id, digest.size):
            tmp.unlink(missing_ok=True)  # the same content is already here (a republish, another repo)
            known = cache.read_sidecar(blob_id)
            # A standalone `agent fetch` records no piece hashes; the ones just computed serve.
            digest = known if known is not None and known.pieces else digest
        else:
            cache.install_blob(blob_id, tmp, digest)
        entries.append((rel, blob_id, digest))
        if digest is computed:
            hashed_here.add(blob_id)
    commit = commit_for([(rel, blob_id) for rel, blob_id, _d in entries])
    for rel, blob_id, _d in entries:
        cache.link_snapshot(commit, rel, blob_id)
    cache.write_ref(revision, commit)

    manifest: list[dict[str, Any]] = []
    seeded = 0
    infos: dict[str, bytes] = {}
    for rel, blob_id, d in entries:
        info = infos.get(blob_id)
        if info is None:
            info = infos[blob_id] = d.encoded_info(blob_id)
            if seed is not None:
                seed(cache.blob_path(blob_id), blob_id, info, blob_id in hashed_here)
                seeded += 1
        manifest.append(
            {"path": rel, "size": d.size, "blob_id": blob_id, "infohash": infohash(info)}
        )
    published = False
    if tracker is not None:
        key = settings.daemon.publisher_signing_key
        assert key is not None  # check_can_register
        signature = sign_manifest(key, manifest_payload(repo_id, commit, manifest))
        try:
            for blob_id, info in infos.items():
                tracker.put_metainfo(blob_id, info)
            tracker.publish_manifest(repo_id, commit, revision, manifest, signature=signature)
            published = True
        except TrackerError as exc:
            log.warning(
                "%s@%s is in the local cache but not on the tracker: %s", name(repo_id), commit[:12], exc
            )
            raise
    return PublishResult(repo_id, revision, commit, cache.snapshot_dir(commit), manifest, published, seeded)
