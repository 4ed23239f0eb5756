"""Planning a daemon fetch: at the origin, which decides who may read what; the tracker's manifest
only where that widens no access (docs/security.md, "Entitlement before bytes").

- The origin plans it: for a repo it does not report public, the request's token must also get a
  file's HEAD answered (a gated repo's listing is public, its files are not). The answer is recorded
  (agent.fetch.entitlement) for when the origin cannot be asked.
- The origin refuses the token (401/403, `AuthError`): the fetch fails with that refusal. Peers hold
  the same bytes, but the origin said no, so no peer is asked.
- The origin does not have the repo (404, `NotFoundError`; a private repo the token cannot see looks
  the same): only a published manifest (a hub-less model, `agent publish`) whose publisher signature
  verifies. An agent-written manifest of a repo the origin says it lacks is refused.
- The origin cannot be asked (unreachable, 5xx, 429 after the retries): a published, verified
  manifest, or an agent-written one of a repo this node recorded the origin's yes for: reported
  public (anyone), or this request's token accepted, within `ENTITLEMENT_TTL`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agent.cache.layout import check_blob_id, is_commit, safe_relpath
from agent.core.errors import AuthError, NotFoundError, OriginError, RateLimitedError, TrackerError
from agent.core.modelnames import Scrub, as_is
from agent.core.plan import FetchPlan, FileEntry
from agent.core.signing import verified_published_manifest
from agent.fetch.cached import filter_files
from agent.fetch.engine import plan_from_origin
from agent.fetch.entitlement import ENTITLEMENT_TTL, Entitlements, NotEntitledError
from agent.origin.answers import RemoteFile
from agent.origin.bucket_url import is_bucket_url
from agent.origin.client import Origin
from agent.origin.oci.reference import is_oci_url
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

_UNREACHABLE = (OriginError, RateLimitedError)
"""The origin could not answer; not a decision about the repo or the token."""


def plan_fetch(
    client: Origin,
    tracker: TrackerClient | None,
    repo_id: str,
    revision: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    entitlements: Entitlements,
    publisher_key: bytes | None,
    scrub: Scrub = as_is,
) -> FetchPlan:
    """The plan for a request running with `client`'s token (module docstring: which source, when).

    `publisher_key`: the publisher's Ed25519 public key (PEM) that hub-less manifests must verify
    with; None refuses them. `scrub`: how the log lines name the model (agent.core.modelnames)."""
    token = client.settings.token
    # A bucket (or registry) model is planned from its listing (manifest) alone, with this node's
    # credentials: no fallback to the tracker, and no entitlement record (those are per repo id and hub
    # token: a bucket's yes must not stand for a Hub repo's).
    hub = not is_bucket_url(client.endpoint) and not is_oci_url(client.endpoint)
    fallback = tracker if hub else None
    try:
        plan = plan_from_origin(client, repo_id, revision, include, exclude)
        public = client.reported_public(repo_id)
        if not public:
            _check_file_access(client, plan)
    except AuthError:
        entitlements.forget(repo_id, token)
        raise
    except NotFoundError as exc:
        if fallback is None:
            raise
        return _published_plan(fallback, repo_id, revision, include, exclude, publisher_key, exc, scrub)
    except _UNREACHABLE as exc:
        if fallback is None:
            raise
        return _plan_without_origin(
            fallback, repo_id, revision, include, exclude, entitlements, token, publisher_key, exc, scrub
        )
    if hub:
        entitlements.record(repo_id, revision, plan.commit, public, token)
    return plan


def _check_file_access(client: Origin, plan: FetchPlan) -> None:
    """The origin serves this token a file of the plan (HEAD, no body, redirects not followed), or
    raises its refusal. The smallest file: any would do, as the Hub gates a repo's files together."""
    entry = min(plan.files, key=lambda e: (e.size, e.path))
    client.file_metadata(plan.repo_id, plan.commit, entry.path)


def _published_plan(
    tracker: TrackerClient,
    repo_id: str,
    revision: str,
    include: Sequence[str],
    exclude: Sequence[str],
    publisher_key: bytes | None,
    origin_exc: NotFoundError,
    scrub: Scrub,
) -> FetchPlan:
    """The origin has no such repo: a hub-less model's published, signature-verified manifest, or the
    origin's answer."""
    found = _tracker_manifest(tracker, repo_id, revision, None, origin_exc, scrub)
    if found is None:
        raise origin_exc
    commit, manifest = found
    if manifest.get("published") is not True:
        log.warning("%s", scrub(
            f"{repo_id}@{revision}: the tracker has an agent-written manifest, but the origin does not "
            f"serve the repo to this request ({origin_exc}); refused"
        ))
        raise origin_exc
    files = verified_published_manifest(manifest, publisher_key, repo_id, commit)
    what = scrub(f"{repo_id}@{revision}")
    log.info("%s: a published model (signature verified), commit %s", what, commit[:12])
    return _plan_from_files(repo_id, revision, commit, files, include, exclude)


def _plan_without_origin(
    tracker: TrackerClient,
    repo_id: str,
    revision: str,
    include: Sequence[str],
    exclude: Sequence[str],
    entitlements: Entitlements,
    token: str | None,
    publisher_key: bytes | None,
    origin_exc: OriginError | RateLimitedError,
    scrub: Scrub,
) -> FetchPlan:
    """The origin cannot be asked: a published, verified manifest, or the manifest of a repo this
    node recorded the origin's yes for (to anyone, or to this token)."""
    recorded = entitlements.commit_for(repo_id, revision)
    found = _tracker_manifest(tracker, repo_id, revision, recorded, origin_exc, scrub)
    if found is None:
        raise origin_exc
    commit, manifest = found
    if manifest.get("published") is True:
        files = verified_published_manifest(manifest, publisher_key, repo_id, commit)
        why = "a published model, signature verified"
    else:
        grant = entitlements.allows(repo_id, token)
        if grant is None:
            days = ENTITLEMENT_TTL / 86400
            raise NotEntitledError(
                f"{repo_id}@{revision}: the origin cannot be asked ({origin_exc}), and it has not "
                f"accepted this token for the repo on this node in the last {days:g} days (nor reported "
                f"it public); peers are not asked for what the origin did not allow: retry once it answers"
            )
        files = [f for f in manifest.get("files", []) if isinstance(f, dict)]
        why = "the origin reported it public" if grant == "public" else "the origin accepted this token"
    log.info("%s", scrub(
        f"{repo_id}@{revision}: the origin cannot be asked ({origin_exc}); planning commit {commit[:12]} "
        f"from the tracker's manifest ({why})"
    ))
    return _plan_from_files(repo_id, revision, commit, files, include, exclude)


def _tracker_manifest(
    tracker: TrackerClient,
    repo_id: str,
    revision: str,
    recorded_commit: str | None,
    origin_exc: Exception,
    scrub: Scrub,
) -> tuple[str, dict[str, Any]] | None:
    """(commit, manifest) of repo@revision at the tracker, or None (the tracker has none or fails).

    A revision that is not a commit resolves at the tracker, else to `recorded_commit` (what the origin
    last resolved it to for this node)."""
    try:
        commit = revision if is_commit(revision) else tracker.resolve(repo_id, revision) or recorded_commit
        manifest = tracker.get_manifest(repo_id, commit) if commit else None
    except TrackerError as exc:
        log.info("%s", scrub(
            f"{repo_id}@{revision}: the tracker cannot plan it either ({exc}); origin: {origin_exc}"
        ))
        return None
    if commit is None or manifest is None or not is_commit(commit):
        return None
    return commit, manifest


def _plan_from_files(
    repo_id: str,
    revision: str,
    commit: str,
    files: Sequence[Mapping[str, Any]],
    include: Sequence[str],
    exclude: Sequence[str],
) -> FetchPlan:
    listing = []
    for f in files:
        try:
            path, blob_id, size = str(f["path"]), str(f["blob_id"]).lower(), int(f["size"])
        except (KeyError, TypeError, ValueError):
            raise TrackerError(f"{repo_id}@{commit[:12]}: malformed file in the tracker's manifest") from None
        safe_relpath(path)
        check_blob_id(blob_id)
        # A 64-hex id is a sha256 (an LFS oid, or `agent publish`), a 40-hex one a git blob sha1.
        listing.append(RemoteFile(path, size, blob_id, len(blob_id) == 64))
    chosen = filter_files(listing, include, exclude)
    if not chosen:
        raise NotFoundError(f"{repo_id}@{revision}: no file of the tracker's manifest matches the filters")
    entries = tuple(FileEntry(f.path, f.size, f.blob_id, f.is_lfs) for f in chosen)
    every_path = frozenset(f.path for f in listing)
    return FetchPlan(repo_id, revision, commit, entries, every_path, from_tracker=True)
