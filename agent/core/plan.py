"""What a fetch must produce: a `FetchPlan` (repo, resolved commit, files), from the origin's listing
or a tracker manifest, and the `FetchResult`. Sources of blobs (`agent.fetch.engine.BlobSource`)
fill the plan's blobs; the engine installs them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

SMALL_FILE_BYTES = 16 * 2**20
"""Files under this size (configs, tokenizers, small shards) take a moment each, mostly round trips: a
fetch runs them on a lane of their own beside the large ones, and the swarm neither relays them nor
spreads their origin leases over nodes (their holder has them whole in a moment)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of the snapshot: where it goes and which blob it is."""

    path: str
    size: int
    blob_id: str
    """sha256 (LFS oid) or git blob sha1: the content address, verified after download. For an object
    whose content id nobody computed yet (object storage), a listing id instead: see `content_known`."""
    is_lfs: bool
    content_known: bool = True
    """False: `blob_id` only names this listing of the object (agent.origin.bucket `listing_id`); the
    download learns the sha256 and the blob is installed under it (`FetchResult.files` has it)."""
    archive: str = ""
    """A registry's tar layer, by its media type: `blob_id` is the layer's sha256, and the plan's files
    are unpacked from it before the snapshot is made (agent.fetch.layers); "" for a file."""
    content_etag: str | None = None
    """The object's ETag as this node's own listing gave it, when it is a hash of the bytes (S3's MD5, or
    its parts' MD5s: agent.core.hashing `etag_parts`), for an object whose sha256 is not known yet: what
    relayed bytes are checked by (agent.fetch.bucket)."""

    @property
    def small(self) -> bool:
        return self.size < SMALL_FILE_BYTES


@dataclass(frozen=True)
class FetchPlan:
    repo_id: str
    revision: str
    commit: str
    files: tuple[FileEntry, ...]
    all_paths: frozenset[str] = frozenset()
    """Every path at the commit, including ones --include/--exclude left out (for index checks)."""
    from_tracker: bool = False
    """Planned from the tracker's manifest (the origin could not): the tracker has it already."""
    from_cache: bool = False
    """Planned from what the cache holds (the origin could not be asked): nothing to publish."""

    def identified(self, content_ids: dict[str, str]) -> FetchPlan:
        """This plan with the content ids a download learnt (listing id -> sha256) in place."""
        files = tuple(
            FileEntry(e.path, e.size, content_ids[e.blob_id], e.is_lfs) if not e.content_known else e
            for e in self.files
        )
        return dataclasses.replace(self, files=files)


@dataclass(frozen=True)
class FetchResult:
    snapshot_path: Path
    commit: str
    files: tuple[FileEntry, ...]
    bytes_from_origin: int
    """Bytes received from the origin in this run (0 when everything was cached)."""
    bytes_cached: int
    """Bytes of requested files that were already complete (or partially, resumed) in the cache."""
    downloaded: tuple[str, ...]
    """Paths whose blobs this run downloaded."""
