"""Keeping the hub cache under its limit: least-recently-used blobs go first, pinned and busy ones never.

What counts: only our own files, the blobs (and partial blobs) under `models--*/blobs/` of the hub
cache; the limit is `ops.cache_max_bytes` and/or `ops.cache_max_disk_percent` of the filesystem
(psutil), whichever asks for more room.

Last use is kept in `<state_dir>/usage.json` (blob id -> unix time), touched when a blob is fetched,
requested or served: atime is unreliable (noatime/relatime mounts), and mtime says when a blob was
written, not when it was read. A blob never touched falls back to its mtime.

Content shared by several repos (one inode, hard-linked into each repo's `blobs/`, see agent.cache.layout)
counts once and is one eviction candidate: it is pinned when any repo using it is, and evicting it
removes it from every repo (only then are its bytes freed). `agent rm` of one repo removes that
repo's link only; the content stays for the others, and the daemon keeps seeding it from their copy.

A partial blob (`blobs/<id>.incomplete`, a fetch that failed or was killed) counts by the disk it
holds and is a candidate too, by its mtime, unless its repo is pinned (a running fetch pins it) or its
blob is protected: after a restart it would otherwise hold its space, uncounted by eviction and unseen
by `agent ls`, until it aged out, and a model that fits once it goes be refused.

Never evicted: blobs of a pinned model (`--pin REPO[@REV]`, plus whatever the `pins` provider
returns: running fetch jobs, pods on this node) and blobs held by a `BlobReaders` hold (an HF
endpoint response in flight).

Evicting a blob also removes, first, the `refs/` entries and the snapshot directories of every
revision that uses it: a snapshot missing one shard is useless to a loader and would make
`huggingface_hub.scan_cache_dir()` report a broken symlink. The revision's other blobs stay (and
age out on their own); a removed revision is fetched again on the next request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from agent.cache.layout import BlobDigest, StateDir, write_atomic
from agent.cache.partials import INCOMPLETE
from agent.core.errors import CacheFullError, NotFoundError
from agent.core.metainfo import infohash
from agent.core.modelnames import RepoName, as_is
from agent.core.settings import OpsSettings, Settings

log = logging.getLogger(__name__)

_FLUSH_EVERY = 5.0
"""Seconds between writes of usage.json while blobs are being touched (a crash loses at most this)."""

Inode = tuple[int, int]
"""(st_dev, st_ino): the same content linked into several repos is one file, counted once."""


# -- what is in the cache -------------------------------------------------------------------------


@dataclass
class CachedSnapshot:
    repo_id: str
    commit: str
    path: Path
    files: dict[str, str]
    """repo path -> blob id (the symlink's target name)."""


@dataclass
class CachedRepo:
    repo_id: str
    root: Path
    blobs: dict[str, int] = field(default_factory=dict)
    """Complete blobs: id -> size."""
    inodes: dict[str, Inode] = field(default_factory=dict)
    """Complete blobs: id -> the file's identity (shared with other repos when linked)."""
    partial_bytes: int = 0
    """Disk held by partial blobs and temp files (allocated blocks: a reservation counts whole)."""
    partials: dict[str, int] = field(default_factory=dict)
    """Partial blobs: id -> the disk its `.incomplete` holds."""
    refs: dict[str, str] = field(default_factory=dict)
    """revision -> commit."""
    snapshots: dict[str, CachedSnapshot] = field(default_factory=dict)

    def commit_for(self, revision: str | None) -> list[str]:
        """Commits a `REPO[@REV]` names here: every snapshot for None, else the ref or the commit itself."""
        if revision is None:
            return sorted(self.snapshots)
        if revision in self.snapshots:
            return [revision]
        commit = self.refs.get(revision)
        return [commit] if commit else []


def repo_id_of(folder: str) -> str | None:
    parts = folder.split("--")
    return "/".join(parts[1:]) if parts[0] == "models" and len(parts) >= 2 else None


def scan_repo(root: Path) -> CachedRepo | None:
    repo_id = repo_id_of(root.name)
    if repo_id is None or not root.is_dir():
        return None
    repo = CachedRepo(repo_id, root)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root / "blobs"):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if "." in entry.name:  # *.incomplete, temp files: ours, counted, never linked
                repo.partial_bytes += st.st_blocks * 512
                if entry.name.endswith(INCOMPLETE) and not entry.name.startswith("."):
                    repo.partials[entry.name.removesuffix(INCOMPLETE)] = st.st_blocks * 512
            else:
                repo.blobs[entry.name] = st.st_size
                repo.inodes[entry.name] = (st.st_dev, st.st_ino)
    refs_dir = root / "refs"
    if refs_dir.is_dir():
        for p in refs_dir.rglob("*"):
            if p.is_file():
                with contextlib.suppress(OSError):
                    repo.refs[p.relative_to(refs_dir).as_posix()] = p.read_text().strip()
    snaps_dir = root / "snapshots"
    if snaps_dir.is_dir():
        for snap in snaps_dir.iterdir():
            files: dict[str, str] = {}
            for dirpath, _dirs, names in os.walk(snap):
                for name in names:
                    p = Path(dirpath) / name
                    with contextlib.suppress(OSError):
                        files[p.relative_to(snap).as_posix()] = os.path.basename(os.readlink(p))
            repo.snapshots[snap.name] = CachedSnapshot(repo_id, snap.name, snap, files)
    return repo


def scan_cache(cache_dir: Path) -> dict[str, CachedRepo]:
    repos: dict[str, CachedRepo] = {}
    if cache_dir.is_dir():
        for root in sorted(cache_dir.glob("models--*")):
            repo = scan_repo(root)
            if repo is not None:
                repos[repo.repo_id] = repo
    return repos


def own_bytes(repos: dict[str, CachedRepo]) -> int:
    """Bytes our files take: each inode once, however many repos link it, plus partial blobs."""
    files = {r.inodes[b]: size for r in repos.values() for b, size in r.blobs.items()}
    return sum(files.values()) + sum(r.partial_bytes for r in repos.values())


def holders(repos: dict[str, CachedRepo], blob_id: str) -> list[CachedRepo]:
    """The repos whose `blobs/` hold this content."""
    return [r for r in repos.values() if blob_id in r.blobs]


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`org/name[@rev]` -> (repo_id, rev or None)."""
    repo_id, _, rev = ref.strip().partition("@")
    return repo_id, rev or None


def pinned_blobs(repos: dict[str, CachedRepo], pins: Iterable[str]) -> set[str]:
    """Blob ids a pinned `REPO[@REV]` uses (pinned for every repo that shares them)."""
    keys: set[str] = set()
    for pin in pins:
        repo_id, rev = parse_ref(pin)
        repo = repos.get(repo_id)
        if repo is None:
            continue
        for commit in repo.commit_for(rev):
            snap = repo.snapshots.get(commit)
            if snap is not None:
                keys.update(snap.files.values())
    return keys


# -- last use and readers ----------------------------------------------------------------------------


class UsageLog:
    """Last-use time per blob id, persisted in the state dir (atime is not to be trusted)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._dirty = False
        self._flushed = 0.0
        try:
            raw = json.loads(path.read_bytes())
            self._last = {str(k): float(v) for k, v in raw.items()}
        except (FileNotFoundError, ValueError, AttributeError, TypeError):
            pass

    def touch(self, blob_ids: Iterable[str], when: float | None = None) -> None:
        now = time.time() if when is None else when
        with self._lock:
            for b in blob_ids:
                self._last[b] = now
            self._dirty = True
            due = time.monotonic() - self._flushed > _FLUSH_EVERY
        if due:
            self.flush()

    def last_used(self, blob_id: str) -> float | None:
        with self._lock:
            return self._last.get(blob_id)

    def forget(self, blob_ids: Iterable[str]) -> None:
        with self._lock:
            for b in blob_ids:
                self._last.pop(b, None)
            self._dirty = True

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            data = json.dumps(self._last, sort_keys=True).encode()
            self._dirty = False
            self._flushed = time.monotonic()
        try:
            write_atomic(self.path, data, fsync=False)
        except OSError as exc:
            log.warning("cannot save blob usage times to %s: %s", self.path, exc.strerror)


class BlobReaders:
    """Reference counts of blobs being read or served; eviction skips a held blob, and a reader waits
    for an eviction of its blob that already started (then finds the blob gone and fetches it again)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count: dict[str, int] = {}
        self._evicting: set[str] = set()

    def acquire(self, blob_id: str) -> None:
        with self._cond:
            while blob_id in self._evicting:
                self._cond.wait(1.0)
            self._count[blob_id] = self._count.get(blob_id, 0) + 1

    def release(self, blob_id: str) -> None:
        with self._cond:
            n = self._count.get(blob_id, 0) - 1
            if n > 0:
                self._count[blob_id] = n
            else:
                self._count.pop(blob_id, None)

    @contextlib.contextmanager
    def hold(self, blob_id: str) -> Iterator[None]:
        self.acquire(blob_id)
        try:
            yield
        finally:
            self.release(blob_id)

    def held(self) -> set[str]:
        with self._cond:
            return set(self._count)

    @contextlib.contextmanager
    def evicting(self, blob_id: str) -> Iterator[bool]:
        """Claim `blob_id` for deletion: yields False (and claims nothing) when a reader holds it."""
        with self._cond:
            if self._count.get(blob_id) or blob_id in self._evicting:
                claimed = False
            else:
                self._evicting.add(blob_id)
                claimed = True
        try:
            yield claimed
        finally:
            if claimed:
                with self._cond:
                    self._evicting.discard(blob_id)
                    self._cond.notify_all()


# -- deleting ---------------------------------------------------------------------------------------


def forget_blob_state(state_dir: Path, blob_id: str) -> None:
    """Drop the agent's own state of a deleted blob: its digest sidecar and libtorrent resume data."""
    state = StateDir(state_dir)
    sidecar = state.sidecar(blob_id)
    try:
        d = BlobDigest.from_json(sidecar.read_bytes())
        state.resume_file(infohash(d.encoded_info(blob_id))).unlink(missing_ok=True)
    except (FileNotFoundError, ValueError, KeyError):
        pass
    sidecar.unlink(missing_ok=True)
    state.partial_record(blob_id).unlink(missing_ok=True)


def drop_snapshot(repo: CachedRepo, commit: str) -> None:
    """Refs first (a reader resolving `main` then finds nothing, not half a snapshot), then the links."""
    for rev, target in list(repo.refs.items()):
        if target == commit:
            (repo.root / "refs" / rev).unlink(missing_ok=True)
            del repo.refs[rev]
    snap = repo.snapshots.pop(commit, None)
    if snap is not None:
        shutil.rmtree(snap.path, ignore_errors=True)


@dataclass(frozen=True)
class Removed:
    repo_id: str
    snapshots: tuple[str, ...]
    blobs: tuple[str, ...]
    """Blobs removed from this repo."""
    bytes_freed: int
    shared: tuple[str, ...] = ()
    """Those of `blobs` that other repos still hold (and the node still seeds)."""
    partials: tuple[str, ...] = ()
    """Partial blobs removed (their disk is in `bytes_freed`)."""


BlobLeaving = Callable[[str, Path | None], None]
"""Called before a repo's file of a blob is deleted: (blob id, a complete copy that stays in another
repo, or None). The daemon stops seeding the blob, or moves its torrent to the copy that stays."""


def _unlink_blob(
    repos: dict[str, CachedRepo], repo: CachedRepo, blob_id: str, state_dir: Path, leaving: BlobLeaving | None
) -> int:
    """Delete one repo's file of a blob; the bytes this frees (none while another repo links the inode)."""
    size = repo.blobs.pop(blob_id, 0)
    inode = repo.inodes.pop(blob_id, None)
    others = holders(repos, blob_id)
    stays = others[0].root / "blobs" / blob_id if others else None
    if leaving is not None:
        leaving(blob_id, stays)
    if stays is None:
        forget_blob_state(state_dir, blob_id)
    (repo.root / "blobs" / blob_id).unlink(missing_ok=True)
    return 0 if any(r.inodes.get(blob_id) == inode for r in others) else size


def remove_model(
    settings: Settings,
    repo_id: str,
    revision: str | None = None,
    readers: BlobReaders | None = None,
    leaving: BlobLeaving | None = None,
    name: RepoName = as_is,
) -> Removed:
    """`agent rm REPO[@REV]`: the revision(s), then every blob of the repo no remaining revision uses.

    Content another repo shares stays for that repo (only this repo's link goes), still seeded. `name`:
    how a log line names the repo (the daemon's `ModelNames.repo`: its logs are shipped)."""
    repos = scan_cache(settings.cache_dir)
    repo = repos.get(repo_id)
    commits = repo.commit_for(revision) if repo else []
    if repo is None or (revision is not None and not commits):
        shown = f"{repo_id}@{revision}" if revision else repo_id
        raise NotFoundError(f"{shown} is not in the cache {settings.cache_dir}; see `agent ls`")
    for commit in commits:
        drop_snapshot(repo, commit)
    still_used = {b for s in repo.snapshots.values() for b in s.files.values()}
    readers = readers or BlobReaders()
    freed, gone, kept = 0, [], []
    for blob_id in sorted(set(repo.blobs) - still_used):
        with readers.evicting(blob_id) as claimed:
            if not claimed:
                log.warning("%s: blob %s is being served; left in place", name(repo_id), blob_id[:12])
                continue
            freed += _unlink_blob(repos, repo, blob_id, settings.state_dir, leaving)
            gone.append(blob_id)
            if holders(repos, blob_id):
                kept.append(blob_id)
    partials: list[str] = []
    if revision is None:  # partial blobs of a removed repo go too, and say what they held
        for blob_id, held in sorted(repo.partials.items()):
            with readers.evicting(blob_id) as claimed:
                if claimed:
                    freed += _unlink_partial(repo, blob_id, settings.state_dir, held)
                    partials.append(blob_id)
    if not repo.snapshots and not repo.blobs and revision is None:
        shutil.rmtree(repo.root, ignore_errors=True)
    return Removed(repo_id, tuple(commits), tuple(gone), freed, tuple(kept), tuple(partials))


def _unlink_partial(repo: CachedRepo, blob_id: str, state_dir: Path, held: int) -> int:
    """Delete a repo's partial blob and its resume record; the disk this frees."""
    (repo.root / "blobs" / (blob_id + INCOMPLETE)).unlink(missing_ok=True)
    StateDir(state_dir).partial_record(blob_id).unlink(missing_ok=True)
    repo.partials.pop(blob_id, None)
    return held


# -- the policy -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evicted:
    repo_ids: tuple[str, ...]
    """Every repo the blob was removed from (content shared by repos goes from all at once)."""
    blob_id: str
    size: int
    last_used: float


def _disk_percent(o: OpsSettings) -> float | None:
    """The disk-percent limit, None when off (unset or 100: a full disk is the only limit)."""
    p = o.cache_max_disk_percent
    return p if p is not None and p < 100 else None


class Evictor:
    """Runs eviction passes for one daemon (or one CLI invocation). Thread-safe: one pass at a time."""

    def __init__(
        self,
        settings: Settings,
        usage: UsageLog,
        readers: BlobReaders,
        pins: Callable[[], Iterable[str]] = lambda: (),
        leaving: BlobLeaving | None = None,
        on_evict: Callable[[Evicted], None] | None = None,
        name: RepoName = as_is,
    ) -> None:
        """`name`: how a log line names a repo (the daemon's `ModelNames.repo`)."""
        self.settings = settings
        self._name = name
        self.usage = usage
        self.readers = readers
        self._pins = pins
        self._leaving = leaving
        self._on_evict = on_evict
        self.cannot_fit_hooks: list[Callable[[CacheFullError], None]] = []
        """Called when a model cannot fit: the daemon counts it; the pod reporter emits a Warning event."""
        self._lock = threading.Lock()

    @property
    def limited(self) -> bool:
        o = self.settings.ops
        return o.cache_max_bytes is not None or _disk_percent(o) is not None

    def pins(self) -> list[str]:
        return [*self.settings.ops.pins, *self._pins()]

    def excess(self, repos: dict[str, CachedRepo], extra: int = 0) -> tuple[int, str]:
        """(bytes that must go so that `extra` more bytes fit, the limit that asks for the most)."""
        o = self.settings.ops
        worst, why = 0, "no limit"
        if o.cache_max_bytes is not None:
            over = own_bytes(repos) + extra - o.cache_max_bytes
            worst, why = over, f"--cache-max-bytes {o.cache_max_bytes}"
        percent = _disk_percent(o)
        if percent is not None:
            du = psutil.disk_usage(str(self.settings.cache_dir))
            over = int(du.used + extra - du.total * percent / 100)
            if over > worst or why == "no limit":
                worst, why = over, f"--cache-max-disk-percent {percent:g}"
        return max(0, worst), why

    def candidates(self, repos: dict[str, CachedRepo], protect: set[str]) -> list[tuple[float, str, int]]:
        """Evictable blobs, least recently used first: (last use, blob id, bytes it frees)."""
        pinned = pinned_blobs(repos, self.pins()) | protect
        busy = self.readers.held()
        files: dict[str, dict[Inode, int]] = {}
        home: dict[str, Path] = {}
        for repo in repos.values():
            for blob_id, size in repo.blobs.items():
                if blob_id in pinned or blob_id in busy:
                    continue
                files.setdefault(blob_id, {})[repo.inodes[blob_id]] = size
                home.setdefault(blob_id, repo.root / "blobs" / blob_id)
        out = []
        for blob_id, sizes in files.items():
            last = self.usage.last_used(blob_id)
            if last is None:
                with contextlib.suppress(OSError):
                    last = home[blob_id].stat().st_mtime
            out.append((last or 0.0, blob_id, sum(sizes.values())))
        in_use = {parse_ref(pin)[0] for pin in self.pins()}  # a running fetch pins the repo it writes
        for repo in repos.values():
            for blob_id, held in repo.partials.items():
                if repo.repo_id in in_use or blob_id in protect or blob_id in busy:
                    continue
                key = blob_id + INCOMPLETE  # keyed by file name: never a complete blob's id
                with contextlib.suppress(OSError):
                    out.append((os.stat(repo.root / "blobs" / key).st_mtime, key, held))
        out.sort()
        return out

    def run_once(self, extra: int = 0, protect: set[str] | None = None) -> list[Evicted]:
        """Evict until `extra` more bytes fit under the limits (or nothing evictable is left)."""
        if not self.limited:
            return []
        with self._lock:
            repos = scan_cache(self.settings.cache_dir)
            need, _why = self.excess(repos, extra)
            if need <= 0:
                return []
            evicted = self._evict(repos, need, protect or set())
        self.usage.flush()
        return evicted

    def _evict(self, repos: dict[str, CachedRepo], need: int, protect: set[str]) -> list[Evicted]:
        evicted: list[Evicted] = []
        freed = 0
        for last, blob_id, size in self.candidates(repos, protect):
            if freed >= need:
                break
            if blob_id.endswith(INCOMPLETE):
                users: list[CachedRepo] | None = self._evict_partial(repos, blob_id.removesuffix(INCOMPLETE))
            else:
                users = self._evict_blob(repos, blob_id)
            if users is None:
                continue
            freed += size
            self.usage.forget([blob_id])
            item = Evicted(tuple(r.repo_id for r in users), blob_id, size, last)
            evicted.append(item)
            log.info(
                "evicted %s %s of %s (%d bytes, last used %s)",
                "partial blob" if blob_id.endswith(INCOMPLETE) else "blob",
                blob_id[:12],
                ", ".join(map(self._name, item.repo_ids)),
                size,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last)) if last else "never",
            )
            if self._on_evict is not None:
                self._on_evict(item)
        return evicted

    def _evict_partial(self, repos: dict[str, CachedRepo], blob_id: str) -> list[CachedRepo]:
        users = [r for r in repos.values() if blob_id in r.partials]
        for repo in users:
            _unlink_partial(repo, blob_id, self.settings.state_dir, 0)
        return users

    def _evict_blob(self, repos: dict[str, CachedRepo], blob_id: str) -> list[CachedRepo] | None:
        """Remove a complete blob from every repo; None when a reader holds it."""
        with self.readers.evicting(blob_id) as claimed:
            if not claimed:
                return None
            if self._leaving is not None:
                self._leaving(blob_id, None)
            users = holders(repos, blob_id)
            for repo in users:
                for commit in [c for c, s in repo.snapshots.items() if blob_id in s.files.values()]:
                    drop_snapshot(repo, commit)
                repo.blobs.pop(blob_id, None)
                repo.inodes.pop(blob_id, None)
                (repo.root / "blobs" / blob_id).unlink(missing_ok=True)
            forget_blob_state(self.settings.state_dir, blob_id)
        return users

    def make_room(self, repo_id: str, needed: int, protect: set[str]) -> list[Evicted]:
        """Before a fetch of `needed` new bytes: evict what must go, or refuse with `CacheFullError`
        (without evicting anything) when even every unpinned blob would not be enough."""
        if not self.limited or needed <= 0:
            return []
        with self._lock:
            repos = scan_cache(self.settings.cache_dir)
            need, why = self.excess(repos, needed)
            if need <= 0:
                return []
            room = sum(size for _last, _key, size in self.candidates(repos, protect))
            if room < need:
                error = CacheFullError(repo_id, needed, room, why)
                for hook in self.cannot_fit_hooks:
                    try:
                        hook(error)
                    except Exception:
                        log.exception("cannot-fit hook failed")
                raise error
            evicted = self._evict(repos, need, protect)
        self.usage.flush()
        return evicted

    def loop(self, stop: threading.Event) -> None:
        """The supervised background task: a pass every `ops.eviction_interval` seconds until `stop`."""
        while not stop.wait(self.settings.ops.eviction_interval):
            self.run_once()
            self.usage.flush()
