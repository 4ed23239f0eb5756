"""The fetch engine: plan a snapshot, get the missing blobs from a source, make them visible.

    plan (resolve revision -> commit, list, filter, refuse unsafe paths)
      -> skip blobs already complete (size + sidecar; no re-hash), linking those another repo holds
      -> check free disk space up front
      -> per missing blob, `files_at_once` at a time (small files on a lane of their own):
         source.fetch_blob (download + hash + verify) -> safetensors check -> fsync + os.replace
         into blobs/ -> snapshot symlink
      -> index json checks -> refs/<revision> (only when every requested file is in place)

Cache granularity: the key is (repo, resolved commit, path) -> blob id, and a blob is named by
its content hash, so a moved `main` resolves to a new commit whose changed files have new
blob ids: stale bytes are never served. A failure loses only its own file; blobs that
completed stay installed for the next run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from agent.cache.layout import BlobDigest, RepoCache, check_repo_id, safe_relpath, same_file
from agent.cache.listings import ListingIds
from agent.cache.locks import blob_lock
from agent.cache.provenance import Provenance
from agent.core.errors import (
    AuthError,
    CacheError,
    DiskSpaceError,
    IntegrityError,
    NotFoundError,
    WeightswarmError,
)
from agent.core.hashing import BlobHashes
from agent.core.plan import FetchPlan, FetchResult, FileEntry
from agent.core.progress import FileProgress, Progress
from agent.core.settings import FetchSettings, Settings
from agent.fetch.cached import cached_plan, filter_files, plan_or_cached
from agent.fetch.layers import unpack_layers
from agent.fetch.safetensors import check_index, check_safetensors
from agent.origin.client import Origin
from agent.origin.kinds import open_origin
from agent.origin.ranges import OriginSource

log = logging.getLogger(__name__)

_LANE_LOOK = 0.1
"""Seconds between a waiting file's looks at the lane's width."""
_FATAL = (AuthError, CacheError, DiskSpaceError)
"""Failures that would repeat for every other file: once one happens, files not yet started are skipped."""


class _Skipped(Exception):
    """A file not started because an earlier file hit a `_FATAL` error."""


def plan_from_origin(
    client: Origin,
    repo_id: str,
    revision: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> FetchPlan:
    """Resolve with the file list (one origin call), filter. Unsafe paths anywhere in the listing refuse
    the whole plan. A registry's tar layers stay whole: the filters pick among their files once they are
    unpacked (agent.fetch.layers)."""
    check_repo_id(repo_id)
    commit, listing = client.revision(repo_id, revision)
    for f in listing:
        safe_relpath(f.path)
    chosen = [f for f in listing if f.archive] + filter_files([f for f in listing if not f.archive], include,
                                                             exclude)
    if not chosen:
        if include or exclude:
            raise NotFoundError(
                f"{repo_id}@{revision}: no file matches --include {list(include)} / --exclude {list(exclude)}"
            )
        raise NotFoundError(f"{repo_id}@{revision}: the repository has no files")
    files = tuple(
        FileEntry(f.path, f.size, f.blob_id, f.is_lfs, f.content_known, archive=f.archive,
                  content_etag=f.content_etag)
        for f in chosen
    )
    return FetchPlan(repo_id, revision, commit, files, frozenset(f.path for f in listing))


def check_disk_space(cache: RepoCache, missing: Sequence[FileEntry], headroom: int) -> None:
    """Refuse up front when the blobs cannot fit (space already held by partial blobs counts as ours)."""
    needed = 0
    for entry in missing:
        try:
            held = cache.incomplete_path(entry.blob_id).stat().st_blocks * 512
        except FileNotFoundError:
            held = 0
        needed += max(0, entry.size - held)
    if not needed:
        return
    free = shutil.disk_usage(cache.blobs_dir).free
    if free < needed + headroom:
        raise DiskSpaceError(str(cache.blobs_dir), needed + headroom, free)


class BlobSource(Protocol):
    """Fills `cache.incomplete_path(entry.blob_id)` with the verified blob; the engine installs it."""

    name: str

    def fetch_blob(
        self, plan: FetchPlan, entry: FileEntry, cache: RepoCache, progress: FileProgress
    ) -> BlobHashes:
        """Download, hash while writing and verify against `entry.blob_id`; raise on failure.

        On failure the source leaves either a resumable partial (transient errors) or nothing
        (integrity errors); never a file under the final blob name.
        """
        ...

    @property
    def bytes_received(self) -> int:
        """Bytes this source has received over the network so far."""
        ...

    @property
    def bytes_resumed(self) -> int:
        """Bytes of partial blobs reused from earlier runs."""
        ...


class _Lane:
    """Large files at once, in order: `files_at_once`, or more while the download host allows a file fewer
    than `connections_per_file` streams (`per_file()`, agent.origin.streams): the stream budget it freed,
    files_at_once x connections_per_file, goes to more files. On a host that refuses a second stream of a
    file and caps each one's rate, four files at once would bring half what huggingface_hub's eight do."""

    def __init__(self, fetch: FetchSettings, per_file: Callable[[], int] | None) -> None:
        self._fetch, self._per_file = fetch, per_file
        self._cond = threading.Condition()
        self._running = self._next = 0

    @property
    def widest(self) -> int:
        f = self._fetch
        return f.files_at_once * (f.connections_per_file if self._per_file is not None else 1)

    def width(self) -> int:
        f = self._fetch
        if self._per_file is None:
            return f.files_at_once
        return min(self.widest, f.files_at_once * f.connections_per_file // max(1, self._per_file()))

    @contextlib.contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """The `ticket`-th file's turn, once those before it started and the lane has room."""
        with self._cond:
            while ticket != self._next or self._running >= self.width():
                self._cond.wait(_LANE_LOOK)  # a lowered limit widens the lane without a notify
            self._next += 1
            self._running += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()


class FetchEngine:
    """Runs one plan against one source into one cache. `per_file`: the streams a file may have now, when
    the source learns download hosts' limits (`_Lane`)."""

    def __init__(
        self,
        settings: Settings,
        source: BlobSource,
        progress: Progress,
        per_file: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.progress = progress
        self.per_file = per_file
        self._abort = False
        self.found: set[str] = set()
        """Blobs another writer of the cache installed while this run waited for their lock."""

    def run(self, plan: FetchPlan) -> FetchResult:
        cache = RepoCache(self.settings.cache_dir, self.settings.state_dir, plan.repo_id)
        listings = ListingIds(self.settings.state_dir)
        plan = listings.resolve(plan)
        if in_place(cache, plan):
            # Nothing to write (the cache may be mounted read-only): the ref is moved where it can be, as
            # huggingface_hub does.
            with contextlib.suppress(OSError):
                cache.write_ref(plan.revision, plan.commit)
            size = sum({e.blob_id: e.size for e in plan.files}.values())
            return FetchResult(cache.snapshot_dir(plan.commit), plan.commit, plan.files, 0, size, ())
        cache.prepare()
        unique: dict[str, FileEntry] = {}
        for entry in plan.files:
            unique.setdefault(entry.blob_id, entry)
        # Content another repo of this cache already holds is linked, not downloaded again.
        missing = [e for e in unique.values() if not cache.adopt_blob(e.blob_id, e.size)]
        cached_bytes = sum(e.size for e in unique.values()) - sum(e.size for e in missing)
        check_disk_space(cache, missing, self.settings.fetch.min_free_bytes)

        # Files whose blob is already complete are linked now: their snapshot entries are valid.
        missing_ids = {e.blob_id for e in missing}
        for entry in plan.files:
            if entry.blob_id not in missing_ids:
                cache.link_snapshot(plan.commit, entry.path, entry.blob_id)

        errors: list[tuple[FileEntry, BaseException]] = []
        installed: dict[str, str] = {}
        """The plan's blob id -> the content id installed (the same, unless the plan had a listing id)."""
        if missing:
            self.progress.set_total(sum(e.size for e in missing))
            # Largest first: the long poles start early. Small files have a lane of their own: behind
            # `files_at_once` shards they waited for a shard to finish, then went one after another,
            # each a few round trips (in a swarm a lease, a torrent, a peer), a visible part of a cold
            # start (benchmarks.md, "Faults during a cold fetch (8 nodes)").
            order = sorted(missing, key=lambda e: -e.size)
            large = [e for e in order if not e.small]
            small = [e for e in order if e.small]

            def pool(entries: list[FileEntry], name: str, most: int) -> ThreadPoolExecutor:
                return ThreadPoolExecutor(max(1, min(most, len(entries))), name)

            lane = _Lane(self.settings.fetch, self.per_file)
            with (
                pool(large, "fetch-file", lane.widest) as large_pool,
                pool(small, "fetch-small", self.settings.fetch.files_at_once) as small_pool,
            ):
                run = self._in_lane
                futures = [(e, large_pool.submit(run, lane, n, plan, cache, e)) for n, e in enumerate(large)]
                futures += [(e, small_pool.submit(self._fetch_one, plan, cache, e)) for e in small]
                for entry, fut in futures:
                    exc = fut.exception()
                    if exc is None:
                        installed[entry.blob_id] = fut.result()
                    elif not isinstance(exc, _Skipped):
                        # One summary line reaches the user (stderr); the per-file detail is for logs.
                        log.info("%s failed: %s", entry.path, exc)
                        errors.append((entry, exc))
            self.progress.close()
        for entry in plan.files:
            if entry.blob_id in installed:
                cache.link_snapshot(plan.commit, entry.path, installed[entry.blob_id])
        if errors:
            raise _summarise(errors, len(missing))
        listings.record({e.blob_id: installed[e.blob_id] for e in plan.files if not e.content_known})
        plan = plan.identified(installed)

        self._check_indexes(plan, cache)
        cache.write_ref(plan.revision, plan.commit)
        found_bytes = sum(e.size for e in missing if e.blob_id in self.found)
        return FetchResult(
            snapshot_path=cache.snapshot_dir(plan.commit),
            commit=plan.commit,
            files=plan.files,
            bytes_from_origin=self.source.bytes_received,
            bytes_cached=cached_bytes + self.source.bytes_resumed + found_bytes,
            downloaded=tuple(e.path for e in missing if e.blob_id not in self.found),
        )

    def _in_lane(self, lane: _Lane, ticket: int, plan: FetchPlan, cache: RepoCache, entry: FileEntry) -> str:
        with lane.turn(ticket):
            return self._fetch_one(plan, cache, entry)

    def _fetch_one(self, plan: FetchPlan, cache: RepoCache, entry: FileEntry) -> str:
        """The blob of `entry` installed; returns its content id."""
        if self._abort:
            raise _Skipped()
        fp = self.progress.start_file(entry.path, entry.size)
        try:
            # The lock huggingface_hub takes too (agent.cache.locks): another writer of this cache
            # downloading the blob finishes it while this one waits, then this one links it.
            with blob_lock(cache.cache_dir, cache.repo_id, entry.blob_id):
                if entry.content_known and cache.adopt_blob(entry.blob_id, entry.size):
                    self.found.add(entry.blob_id)
                    fp.finish()
                    return entry.blob_id
                hashes = self.source.fetch_blob(plan, entry, cache, fp)
                install_downloaded(cache, entry, hashes, self.settings.fetch.verify_safetensors)
        except BaseException as exc:
            self._abort = self._abort or isinstance(exc, _FATAL)
            fp.fail()
            raise
        fp.finish()
        return hashes.content_id

    def _check_indexes(self, plan: FetchPlan, cache: RepoCache) -> None:
        if not self.settings.fetch.verify_safetensors:
            return
        present = {e.path for e in plan.files}
        for entry in plan.files:
            if entry.path.endswith(".safetensors.index.json"):
                check_index(cache.snapshot_file(plan.commit, entry.path), entry.path, present, plan.all_paths)


def in_place(cache: RepoCache, plan: FetchPlan) -> bool:
    """Every file of the plan linked in its snapshot to a complete blob of its content id."""
    return all(
        e.content_known
        and cache.blob_is_complete(e.blob_id, e.size)
        and same_file(cache.snapshot_file(plan.commit, e.path), cache.blob_path(e.blob_id))
        for e in plan.files
    )


def install_downloaded(cache: RepoCache, entry: FileEntry, hashes: BlobHashes, check: bool) -> None:
    """Install a hash-verified `blobs/<id>.incomplete` (safetensors checked first); drop its record."""
    incomplete = cache.incomplete_path(entry.blob_id)
    if check and entry.path.endswith(".safetensors"):
        try:
            check_safetensors(incomplete, entry.path)
        except IntegrityError:
            # The bytes are exactly what the origin published, but no loader could use
            # them: nothing is installed, so no snapshot ever points at a broken shard.
            cache.discard_partial(entry.blob_id)
            raise
    if not entry.content_known and cache.adopt_blob(hashes.content_id, hashes.size):
        # Bytes whose id the download just learnt, which another repo of this cache holds (a Hub repo's
        # shard): linked from there, one copy on disk.
        cache.discard_partial(entry.blob_id)
        return
    # mtime is filled in by install_blob once the blob has its final name. Under its content id, which
    # is the plan's unless the plan only had a listing id (`FileEntry.content_known`).
    digest = BlobDigest(hashes.size, 0, hashes.xxh3, hashes.piece_length, hashes.pieces)
    cache.install_blob(hashes.content_id, incomplete, digest)
    cache.partial_record_path(entry.blob_id).unlink(missing_ok=True)


def _summarise(errors: list[tuple[FileEntry, BaseException]], attempted: int) -> BaseException:
    """One error for the CLI: the first failure itself when alone, else a count plus the first."""
    entry, first = errors[0]
    if not isinstance(first, WeightswarmError):
        return first
    if len(errors) == 1:
        return first
    kind = type(first)
    others = ", ".join(e.path for e, _ in errors[1:4]) + ("…" if len(errors) > 4 else "")
    try:
        err = kind.__new__(kind)
        message = f"{len(errors)} of {attempted} files failed; first: {first} (also: {others})"
        WeightswarmError.__init__(err, message)
        return err
    except TypeError:
        return first


def fetch_snapshot(
    settings: Settings,
    repo_id: str,
    revision: str = "main",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Progress | None = None,
    before_exit: list[Callable[[], None]] | None = None,
) -> FetchResult:
    """Library entry point: the snapshot of `repo_id@revision` in `settings.cache_dir`, verified.

    `before_exit`: a list the caller runs if the process must exit mid-fetch (Ctrl-C); the fetch puts
    the saving of its resume records there."""
    f = settings.fetch
    client = open_origin(settings.origin, max_connections=f.connections_per_file * f.files_at_once)
    try:
        cached = cached_plan(settings, repo_id, revision, include, exclude)
        plan = plan_or_cached(
            settings.origin,
            client,
            cached,
            lambda origin, _cached: plan_from_origin(origin, repo_id, revision, include, exclude),
            f"{repo_id}@{revision}",
        )
        # Standalone: nothing here publishes metainfo, so no piece sha1s (a large part of the hashing CPU);
        # the daemon's path (agent.fetch.job) keeps OriginSource's default and computes them.
        source = OriginSource(client, f, piece_hashes=False)

        def save_records() -> None:
            # Every open blob's record as of now: all it wrote resumes, not only up to the last periodic
            # record (`RECORD_EVERY` a blob, 4 MiB: a whole small fetch).
            for save in list(source.savers.values()):
                save()

        if before_exit is not None:
            before_exit.append(save_records)
        shown = progress or Progress(quiet=True)

        def fetch_layers(layers: FetchPlan, where: Settings) -> None:
            FetchEngine(where, source, shown, source.streams_per_file).run(layers)

        # Nothing here seeds a registry's tar layer, so it goes once unpacked.
        plan = unpack_layers(settings, plan, include, exclude, fetch_layers, keep=False)
        engine = FetchEngine(settings, source, shown, source.streams_per_file)
        result = engine.run(plan)
        if not plan.from_cache:
            fetched = dataclasses.replace(plan, files=result.files)
            Provenance(settings.state_dir).record(client.endpoint, fetched)
        return result
    finally:
        client.close()

