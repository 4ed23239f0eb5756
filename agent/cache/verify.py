"""`agent verify [REPO[@REV]]`: re-hash every blob in full and repair what does not match.

The cheap check used everywhere else (size + xxh3 sidecar) trusts the disk; this one reads every
byte again: sha256 for LFS blobs (64-hex ids), the git blob sha1 for small files (40-hex ids). A
snapshot entry whose blob is missing counts as corrupt too. A good blob gets a fresh sidecar (so
later cheap checks agree with the disk again); a corrupt one is deleted (after the daemon stops
seeding it) and fetched again: through the daemon when one answers, else with the origin engine.

Content shared by several repos is one inode (agent.cache.layout): it is re-hashed once, and a corrupt one
is unlinked from every repo that shares it and linked back into each of them once fetched again.
"""

from __future__ import annotations

import contextlib
import glob
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.cache.eviction import CachedRepo, forget_blob_state, parse_ref, repo_id_of, scan_cache
from agent.cache.layout import BlobDigest, RepoCache, blob_homes, same_file, write_atomic
from agent.core.hashing import BlobHasher
from agent.core.settings import Settings

log = logging.getLogger(__name__)

_BLOCK = 4 * 2**20


@dataclass
class BlobCheck:
    repo_id: str
    blob_id: str
    size: int
    ok: bool
    problem: str = ""
    uses: list[tuple[str, str]] = field(default_factory=list)
    """(commit, path) of every snapshot entry that points at this blob."""
    dropped_refs: list[str] = field(default_factory=list)
    """The refs removed with the entries of a blob that could not be fetched again (`drop_entries`)."""


def _select(settings: Settings, ref: str | None) -> list[tuple[CachedRepo, set[str] | None]]:
    """(repo, commits to check or None for every blob of the repo)."""
    repos = scan_cache(settings.cache_dir)
    if ref is None:
        return [(r, None) for r in repos.values()]
    repo_id, rev = parse_ref(ref)
    repo = repos.get(repo_id)
    if repo is None:
        return []
    return [(repo, None if rev is None else set(repo.commit_for(rev)))]


def rehash(cache: RepoCache, blob_id: str) -> tuple[bool, str]:
    """Full re-hash of one blob; refreshes its sidecar when it is intact."""
    path = cache.blob_path(blob_id)
    try:
        st = path.stat()
        size = st.st_size
        hasher = BlobHasher(size, is_lfs=len(blob_id) == 64)
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(_BLOCK):
                hasher.update(chunk)
    except FileNotFoundError:
        return False, "missing"
    got = hasher.finish()
    if got.content_id != blob_id or got.size != size:
        return False, f"content hashes to {got.content_id[:16]}…"
    digest = BlobDigest(st.st_size, st.st_mtime_ns, got.xxh3, got.piece_length, got.pieces)
    write_atomic(cache.sidecar_path(blob_id), digest.to_json(), fsync=False)
    return True, ""


def seedable_digest(cache: RepoCache, blob_id: str) -> BlobDigest | None:
    """The blob's sidecar with BitTorrent piece hashes, re-hashing the blob once if it has none.

    A standalone `agent fetch` skips piece hashes (nothing publishes them) and huggingface_hub
    writes no sidecar at all; such a blob is verified in full and gets a complete sidecar the
    first time it must be seeded. None when the blob is missing or does not match its id.
    """
    digest = cache.read_sidecar(blob_id)
    if digest is not None and digest.pieces:
        return digest
    ok, problem = rehash(cache, blob_id)
    if not ok:
        log.warning("not seeding blob %s: %s", blob_id[:16], problem)
        return None
    return cache.read_sidecar(blob_id)


def verify_cache(
    settings: Settings, ref: str | None = None, on_blob: Callable[[BlobCheck], None] | None = None
) -> list[BlobCheck]:
    """Re-hash the blobs of `ref` (`REPO[@REV]`, or the whole cache); one BlobCheck per blob."""
    checks: list[BlobCheck] = []
    seen: dict[tuple[int, int], tuple[bool, str]] = {}
    """Results by inode: content linked into several repos is read once."""
    for repo, commits in _select(settings, ref):
        cache = RepoCache(settings.cache_dir, settings.state_dir, repo.repo_id)
        uses: dict[str, list[tuple[str, str]]] = {}
        for commit, snap in repo.snapshots.items():
            if commits is None or commit in commits:
                for path, blob_id in snap.files.items():
                    uses.setdefault(blob_id, []).append((commit, path))
        wanted = set(uses) | (set(repo.blobs) if commits is None else set())
        for blob_id in sorted(wanted):
            inode = repo.inodes.get(blob_id)
            if inode is not None and inode in seen:
                ok, problem = seen[inode]
            else:
                ok, problem = rehash(cache, blob_id)
                if inode is not None:
                    seen[inode] = (ok, problem)
            check = BlobCheck(
                repo.repo_id, blob_id, repo.blobs.get(blob_id, 0), ok, problem, uses.get(blob_id, [])
            )
            checks.append(check)
            if on_blob is not None:
                on_blob(check)
    return checks


Refetch = Callable[[str, str, list[str]], None]
"""(repo_id, commit, [path glob, ...]) -> fetch those files into the cache again (raises on failure)."""


def repair(
    settings: Settings, bad: list[BlobCheck], refetch: Refetch, forget: Callable[[str], None] | None = None
) -> list[BlobCheck]:
    """Delete corrupt blobs, fetch their files again, re-hash them; the checks that are still bad."""
    todo: dict[tuple[str, str], list[str]] = {}
    relink: list[tuple[str, str, int]] = []
    """(repo id, blob id, size) of links to a corrupt inode that other repos shared."""
    for check in bad:
        if forget is not None:
            forget(check.blob_id)
        cache = RepoCache(settings.cache_dir, settings.state_dir, check.repo_id)
        blob = cache.blob_path(check.blob_id)
        for home in blob_homes(settings.cache_dir, check.blob_id):
            other = repo_id_of(home.parent.parent.name)
            if home != blob and other and same_file(home, blob):
                home.unlink(missing_ok=True)  # the same corrupt bytes, seen through another repo
                relink.append((other, check.blob_id, check.size))
        blob.unlink(missing_ok=True)
        forget_blob_state(settings.state_dir, check.blob_id)
        for commit, path in check.uses:
            todo.setdefault((check.repo_id, commit), []).append(glob.escape(path))
    for (repo_id, commit), paths in todo.items():
        try:
            refetch(repo_id, commit, sorted(set(paths)))
        except Exception as exc:  # reported below as still corrupt; one failure must not stop the rest
            log.warning("re-fetching %s@%s failed: %s", repo_id, commit[:12], exc)
    for repo_id, blob_id, size in relink:
        if not RepoCache(settings.cache_dir, settings.state_dir, repo_id).adopt_blob(blob_id, size):
            log.warning("%s: blob %s was corrupt and is gone; fetch the repo again", repo_id, blob_id[:12])
    still = []
    for check in bad:
        if not check.uses:  # no snapshot needs it: deleting it was the repair
            check.ok, check.problem = True, "deleted (no snapshot uses it)"
            continue
        cache = RepoCache(settings.cache_dir, settings.state_dir, check.repo_id)
        ok, problem = rehash(cache, check.blob_id)
        if not ok:
            check.problem = problem
            drop_entries(cache, check)
            still.append(check)
        else:
            check.ok, check.problem = True, ""
    return still


def drop_entries(cache: RepoCache, check: BlobCheck) -> None:
    """Remove the snapshot entries that name the gone blob, and every ref to their commits: a reader
    (huggingface_hub with HF_HUB_OFFLINE, vLLM) then finds the revision missing, not a path to nothing.
    The blob, its partial and its state are removed too."""
    cache.blob_path(check.blob_id).unlink(missing_ok=True)
    cache.discard_partial(check.blob_id)
    commits = set()
    for commit, path in check.uses:
        entry = cache.snapshot_file(commit, path)
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
        commits.add(commit)
    if not cache.refs_dir.is_dir():
        return
    for ref in sorted(cache.refs_dir.rglob("*")):
        if ref.is_file() and ref.read_text().strip() in commits:
            ref.unlink(missing_ok=True)
            check.dropped_refs.append(ref.relative_to(cache.refs_dir).as_posix())
