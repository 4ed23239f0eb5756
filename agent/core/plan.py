"""What a fetch must produce, and the interface of a source of blobs.

A `FetchPlan` (repo, resolved commit, files) can come from the origin's listing or, later,
from a tracker manifest; any `BlobSource` (the origin today, the swarm later) fills a blob's
`.incomplete` file and returns its verified hashes; the engine (agent.fetch.engine) installs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.cache.layout import RepoCache
from agent.core.hashing import BlobHashes
from agent.core.progress import FileProgress


@dataclass(frozen=True)
class FileEntry:
    """One file of the snapshot: where it goes and which blob it is."""

    path: str
    size: int
    blob_id: str
    """sha256 (LFS oid) or git blob sha1: the content address, verified after download."""
    is_lfs: bool


@dataclass(frozen=True)
class FetchPlan:
    repo_id: str
    revision: str
    commit: str
    files: tuple[FileEntry, ...]
    all_paths: frozenset[str] = frozenset()
    """Every path at the commit, including ones --include/--exclude left out (for index checks)."""


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
