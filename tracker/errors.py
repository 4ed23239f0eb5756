"""Errors a person can act on (the tracker's own; it must not import `agent`).

A `TrackerError` builds a one-line message and maps to an exit code; the CLI prints it
and exits, never a traceback. Messages never contain tokens or passkeys.
"""

from __future__ import annotations

from clikit import EXIT_FAILURE as EXIT_FAILURE
from clikit import EXIT_USAGE as EXIT_USAGE
from clikit import ExpectedError


class TrackerError(ExpectedError):
    """Base of every expected tracker failure."""


class ConfigError(TrackerError):
    """A setting, option or secret file cannot be used."""

    exit_code = EXIT_USAGE


class StoreUnavailableError(TrackerError):
    """The store (SQLite file or Redis) cannot be reached or opened."""


class ValidationError(TrackerError):
    """A client sent something the tracker refuses (bad metainfo, unsafe manifest path, ...)."""


class ConflictError(TrackerError):
    """A write disagrees with what is already stored (e.g. a second info dict for one blob)."""


class PublishedRepoError(TrackerError):
    """An agent-role write of a manifest (or ref) for a repo the publisher has published."""

    def __init__(self, repo_id: str) -> None:
        super().__init__(
            f"{repo_id} is a published model: only the publisher-role token (--publisher-token-file) "
            "may write its manifests and refs"
        )
        self.repo_id = repo_id


class ManifestConflictError(ConflictError):
    """A second manifest of one repo@commit with other files: a commit's manifest never changes."""

    def __init__(self, repo_id: str, commit: str) -> None:
        super().__init__(
            f"{repo_id}@{commit} already has a manifest with other files: a commit's manifest never "
            "changes (publish the new files, which get a new commit)"
        )
        self.repo_id = repo_id
        self.commit = commit


class QuarantinedMetainfoError(ConflictError):
    """A re-publish of an info dict that a node reported wrong for this blob (while its hold lasts)."""

    def __init__(self, blob_id: str, infohash: str) -> None:
        super().__init__(
            f"the info dict {infohash} of blob {blob_id} was reported wrong and is quarantined: publish "
            "one computed from bytes verified end to end"
        )
        self.blob_id = blob_id
        self.infohash = infohash
