"""Which files a request wants, and a revision the cache holds whole: served when the origin cannot be
asked, as huggingface_hub does (a branch by its `refs/` entry, a commit by its snapshot).

`cached_plan` is local and cheap (a ref, the snapshot's links, each blob's size and sidecar). When it
finds the revision complete, the origin is asked once, with a short connect timeout and no retries
(`quick`): an origin that refuses, times out or answers 5xx costs about a second, not the 8-13 s of
retries a download deserves; with `HF_HUB_OFFLINE=1` it is not asked at all. What "complete" means
comes from the commit's record (agent.cache.provenance: every path the origin listed) where this node
fetched it, else from the snapshot alone (a cache huggingface_hub wrote): every entry resolves to a
blob of this repo.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
from collections.abc import Callable, Sequence

from agent.cache.layout import RepoCache, is_blob_id, is_commit, same_file
from agent.cache.provenance import Provenance
from agent.core.errors import NotFoundError, OriginError, RateLimitedError
from agent.core.modelnames import Scrub, as_is
from agent.core.plan import FetchPlan, FileEntry
from agent.core.settings import OriginSettings, Settings
from agent.origin.answers import RemoteFile
from agent.origin.client import Origin
from agent.origin.kinds import open_origin

log = logging.getLogger(__name__)

QUICK_CONNECT = 3.0
"""Seconds to connect when the cache holds the revision whole: a Hub that does not answer by then is
treated as down (huggingface_hub's HEAD waits 10 s, then serves the cache)."""
QUICK_READ = 10.0
"""Seconds for the answer to that one planning call (huggingface_hub's `etag_timeout`)."""
MAX_SNAPSHOT_ENTRIES = 100_000
"""Entries of a snapshot read at most to judge it without a record (far above any model's file count)."""


def _matches(path: str, patterns: Sequence[str]) -> bool:
    # As huggingface_hub's filter_repo_objects: a pattern ending in "/" means everything below it.
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def wanted(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    return (not include or _matches(path, include)) and not (exclude and _matches(path, exclude))


def filter_files(
    files: Sequence[RemoteFile], include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> list[RemoteFile]:
    return [f for f in files if wanted(f.path, include, exclude)]


def quick(origin: OriginSettings) -> OriginSettings:
    """`origin` for one planning call whose failure the cache covers: one attempt, short timeouts, no
    patience."""
    return dataclasses.replace(
        origin,
        max_retries=1,
        patience=0.0,
        connect_timeout=min(origin.connect_timeout, QUICK_CONNECT),
        read_timeout=min(origin.read_timeout, QUICK_READ),
    )


def cached_plan(
    settings: Settings,
    repo_id: str,
    revision: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    scrub: Scrub = as_is,
) -> FetchPlan | None:
    """The plan of `repo_id@revision` when every wanted file is in place in the cache, else None
    (`scrub`: a daemon job's, for the log line of an unreadable record)."""
    cache = RepoCache(settings.cache_dir, settings.state_dir, repo_id)
    commit = revision if is_commit(revision) else cache.read_ref(revision)
    if commit is None or not is_commit(commit) or not (cache.snapshots_dir / commit).is_dir():
        return None
    record = Provenance(settings.state_dir, scrub).listing(repo_id, commit)
    if record is not None:
        paths, known = record
        chosen_paths = [p for p in paths if wanted(p, include, exclude)]
        if any(p not in known for p in chosen_paths):
            return None  # the origin listed it, and this node never fetched it
        listing = [RemoteFile(p, size, blob_id, len(blob_id) == 64) for p, (blob_id, size) in known.items()]
        every = frozenset(paths)
    else:
        found = _snapshot_files(cache, commit)
        if found is None:
            return None
        listing, every = found, frozenset(f.path for f in found)
    chosen = filter_files(listing, include, exclude)
    if not chosen:
        return None
    for f in chosen:
        linked = same_file(cache.snapshot_file(commit, f.path), cache.blob_path(f.blob_id))
        if not linked or not cache.blob_is_complete(f.blob_id, f.size):
            return None
    files = tuple(FileEntry(f.path, f.size, f.blob_id, f.is_lfs) for f in chosen)
    return FetchPlan(repo_id, revision, commit, files, every, from_cache=True)


def _snapshot_files(cache: RepoCache, commit: str) -> list[RemoteFile] | None:
    """Every entry of the snapshot as a file of the repo, or None when one points at nothing (or not at
    a blob of this repo: then the snapshot alone cannot say what it holds)."""
    root = cache.snapshot_dir(commit)
    blobs = os.path.realpath(cache.blobs_dir)
    files: list[RemoteFile] = []
    for here, _dirs, names in os.walk(root):
        for name in names:
            entry = os.path.join(here, name)
            target = os.path.realpath(entry)
            blob_id = os.path.basename(target)
            if os.path.dirname(target) != blobs or not is_blob_id(blob_id) or not os.path.isfile(target):
                return None
            path = os.path.relpath(entry, root).replace(os.sep, "/")
            files.append(RemoteFile(path, os.path.getsize(target), blob_id, len(blob_id) == 64))
            if len(files) > MAX_SNAPSHOT_ENTRIES:
                return None
    return files


def served_from_cache(plan: FetchPlan, why: str, scrub: Scrub = as_is) -> FetchPlan:
    """`plan`, said in one line where the user looks (the CLI shows warnings on stderr; the daemon's log
    names the model as its metrics do: `scrub`)."""
    log.warning("%s", scrub(
        f"{plan.repo_id}@{plan.revision}: {why}; serving commit {plan.commit[:12]} from the cache "
        f"({len(plan.files)} files)"
    ))
    return plan


Ask = Callable[[Origin, bool], FetchPlan]
"""Plan with this origin client; True: a complete cached plan stands by (skip slow fallbacks)."""

_UNREACHABLE = (OriginError, RateLimitedError)


def plan_or_cached(
    origin: OriginSettings,
    main: Origin,
    cached: FetchPlan | None,
    ask: Ask,
    what: str,
    scrub: Scrub = as_is,
) -> FetchPlan:
    """Ask the origin (through `main`, or a quick client when `cached` stands by); the cached plan when
    the origin cannot be asked (unreachable, 5xx, 429, `HF_HUB_OFFLINE`)."""
    if origin.offline:
        if cached is None:
            raise NotFoundError(
                f"{what} is not complete in the cache, and HF_HUB_OFFLINE is set: unset it to download"
            )
        return served_from_cache(cached, "HF_HUB_OFFLINE is set", scrub)
    if cached is None:
        return ask(main, False)
    planner = open_origin(quick(origin), 1, scrub=scrub)
    try:
        return ask(planner, True)
    except NotFoundError:
        return ask(main, False)  # the slow path may still know it (a hub-less model's published manifest)
    except _UNREACHABLE as exc:
        return served_from_cache(cached, f"the origin cannot be asked ({exc})", scrub)
    finally:
        planner.close()
