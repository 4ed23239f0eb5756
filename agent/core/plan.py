"""What a fetch must produce: a `FetchPlan` (repo, resolved commit, files), from the origin's listing
or a tracker manifest, and the `FetchResult`. Sources of blobs (`agent.fetch.engine.BlobSource`)
fill the plan's blobs; the engine installs them."""

from __future__ import annotations

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
    """sha256 (LFS oid) or git blob sha1: the content address, verified after download."""
    is_lfs: bool

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
