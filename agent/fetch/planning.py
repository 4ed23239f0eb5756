"""Planning a daemon fetch when the origin cannot: from the tracker's manifest (`/v1/resolve` +
`/v1/manifests`). This is how a model published with `agent publish` (no hub at all) reaches other
nodes, and how a node fetches a model the cluster already has while the origin is down.

The origin stays first: it is the authority on what `main` means for a Hub repo. The tracker is
asked only when the origin does not know the repo (404/401), refuses, or cannot be reached.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.cache.layout import safe_relpath
from agent.core.errors import AuthError, NotFoundError, OriginError, RateLimitedError, TrackerError
from agent.core.plan import FetchPlan, FileEntry
from agent.fetch.engine import filter_files, plan_from_origin
from agent.origin.client import OriginClient, RemoteFile
from agent.swarm.tracker_client import TrackerClient

log = logging.getLogger(__name__)

_FALLBACK = (NotFoundError, AuthError, OriginError, RateLimitedError)


def plan_from_tracker(
    tracker: TrackerClient,
    repo_id: str,
    revision: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> FetchPlan | None:
    """The plan from the tracker's manifest of repo@revision, or None when the tracker has none."""
    commit = revision if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision) else None
    if commit is None:
        commit = tracker.resolve(repo_id, revision)
        if commit is None:
            return None
    manifest = tracker.get_manifest(repo_id, commit)
    if manifest is None:
        return None
    listing = []
    for f in manifest.get("files", []):
        path, blob_id = str(f["path"]), str(f["blob_id"]).lower()
        safe_relpath(path)
        # A 64-hex id is a sha256 (an LFS oid, or `agent publish`), a 40-hex one a git blob sha1.
        listing.append(RemoteFile(path, int(f["size"]), blob_id, len(blob_id) == 64))
    chosen = filter_files(listing, include, exclude)
    if not chosen:
        raise NotFoundError(f"{repo_id}@{revision}: no file of the tracker's manifest matches the filters")
    files = tuple(FileEntry(f.path, f.size, f.blob_id, f.is_lfs) for f in chosen)
    return FetchPlan(repo_id, revision, commit, files, frozenset(f.path for f in listing), from_tracker=True)


def plan_fetch(
    client: OriginClient,
    tracker: TrackerClient | None,
    repo_id: str,
    revision: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> FetchPlan:
    """The origin's plan; failing that (unknown repo, refused, unreachable), the tracker's manifest."""
    try:
        return plan_from_origin(client, repo_id, revision, include, exclude)
    except _FALLBACK as exc:
        if tracker is None:
            raise
        try:
            plan = plan_from_tracker(tracker, repo_id, revision, include, exclude)
        except TrackerError as tracker_exc:
            log.info("tracker has no plan for %s@%s either: %s", repo_id, revision, tracker_exc)
            raise exc from None
        if plan is None:
            raise
        log.info(
            "%s@%s: the origin cannot plan it (%s); using the tracker's manifest of %s",
            repo_id,
            revision,
            exc,
            plan.commit[:12],
        )
        return plan
