"""Errors a person can act on.

Every expected failure is a `WeightswarmError`: it carries typed fields, builds its own
one-line message, and maps to a process exit code. The CLI prints `str(error)` and exits;
no traceback for an expected failure. Messages never contain tokens, and response
bodies are cut short (`snippet`) before they reach a message or a log.
"""

from __future__ import annotations

# The generic codes are the tracker's too: one definition (the agent may import tracker.errors).
from clikit import EXIT_FAILURE as EXIT_FAILURE
from clikit import EXIT_USAGE as EXIT_USAGE
from clikit import ExpectedError

EXIT_NOT_FOUND = 3
EXIT_AUTH = 4
EXIT_DISK = 5
EXIT_INTEGRITY = 6
EXIT_TIMEOUT = 7
EXIT_ORIGIN = 8
"""The origin could not be reached (refused, unknown host, silent) or kept failing (5xx, 429)."""
EXIT_AGENT = 9
"""The agent daemon could not be reached, or refused or failed the request."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT); SIGTERM exits 143, as a shell reports a process ended by either."""

_MAX_SNIPPET = 200


def snippet(body: bytes | str | None, limit: int = _MAX_SNIPPET) -> str:
    """A short, single-line, printable excerpt of a response body for an error message."""
    if not body:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mib(n: int) -> str:
    """Bytes as MiB for a message: 1,234.5 MiB."""
    return f"{n / 2**20:,.1f} MiB"


class WeightswarmError(ExpectedError):
    """Base of every expected failure of the agent (message and exit code: see `ExpectedError`)."""


class ConfigError(WeightswarmError):
    """A setting or argument is invalid."""

    exit_code = EXIT_USAGE


class NotFoundError(WeightswarmError):
    """The repo, revision or file does not exist (or is hidden from this token)."""

    exit_code = EXIT_NOT_FOUND


class AuthError(WeightswarmError):
    """The origin refused the token (401/403)."""

    exit_code = EXIT_AUTH


class RateLimitedError(WeightswarmError):
    """The origin kept answering 429 after the bounded retries."""

    exit_code = EXIT_ORIGIN


class BusyError(WeightswarmError):
    """The node, or this client, already has as many fetch jobs running as it may (HTTP 429)."""


class RefusedError(WeightswarmError):
    """The caller may not do this here (publish outside --publish-root, a repo id the origin owns)."""

    exit_code = EXIT_AUTH


class OriginError(WeightswarmError):
    """The origin failed in a way retries did not fix (5xx, dropped connections, bad answers)."""

    exit_code = EXIT_ORIGIN


class OriginUnavailableError(OriginError):
    """The origin kept failing in a way that passes (5xx, refused or dropped connections) through the
    bounded retries: a daemon job waits it out (`OriginSettings.patience`)."""


class OriginUnansweredError(OriginUnavailableError):
    """No answer at all to a request: the connection was refused, the host name is unknown, or the server
    accepted and sent nothing within the read timeout. Its retries stop at `OriginSettings.answer_within`."""


class OriginOverloadedError(OriginUnavailableError):
    """The origin itself kept answering 5xx: it is reachable and says "later" (so would it to any node)."""


class IntegrityError(WeightswarmError):
    """Downloaded bytes do not match what the origin or the manifest promised."""

    exit_code = EXIT_INTEGRITY


class OriginLengthError(IntegrityError):
    """The origin lists a file at more bytes than it sends: its answers end early, at the same byte or
    each bringing only a little more (agent.origin.headway)."""


class OriginStalledError(OriginError):
    """A blob brought less than the rate floor over a whole window (agent.origin.headway)."""


class UnsafePathError(WeightswarmError):
    """A repo path would escape the snapshot directory."""

    exit_code = EXIT_INTEGRITY

    def __init__(self, path: str) -> None:
        super().__init__(f"refusing unsafe path in repo listing: {path!r}")
        self.path = path


class DiskSpaceError(WeightswarmError):
    """Not enough free space for what must be written."""

    exit_code = EXIT_DISK

    def __init__(self, directory: str, needed: int, free: int) -> None:
        super().__init__(
            f"not enough disk space in {directory}: need {_mib(needed)}, "
            f"{_mib(free)} free; free space or choose another --cache-dir"
        )
        self.directory = directory
        self.needed = needed
        self.free = free


class CacheError(WeightswarmError):
    """The cache directory cannot be used (permissions, not a directory, ...)."""

    exit_code = EXIT_DISK


class WaitTimeoutError(WeightswarmError):
    """A bounded wait ran out."""

    exit_code = EXIT_TIMEOUT


class TrackerError(WeightswarmError):
    """The tracker answered, but refused or failed the request (4xx other than 404, bad answers)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TrackerUnavailableError(TrackerError):
    """The tracker cannot be reached (connection refused, timeout, 5xx): fall back to the origin."""


class DaemonError(WeightswarmError):
    """The local agent daemon refused or failed a request, or cannot be reached."""

    exit_code = EXIT_AGENT


class SwarmError(WeightswarmError):
    """The BitTorrent layer refused a request (bad metainfo, missing blob, unknown torrent)."""


class AnnotationError(WeightswarmError):
    """A pod's `weightswarm.io/models` annotation (or an `org/name[@rev]` argument) is malformed."""

    exit_code = EXIT_USAGE

    def __init__(self, entry: str, reason: str) -> None:
        shown = snippet(entry, 100) or "''"
        super().__init__(f"bad model reference {shown!r}: {reason}; expected 'org/name[@rev], ...'")
        self.entry = entry
        self.reason = reason


class CacheFullError(WeightswarmError):
    """A requested model cannot fit under the cache limit even after evicting everything unpinned."""

    exit_code = EXIT_DISK

    def __init__(self, repo_id: str, needed: int, room: int, limit: str) -> None:
        super().__init__(
            f"{repo_id} needs {_mib(needed)} more in the cache, but only {_mib(room)} "
            f"can be freed under {limit}; raise the limit, unpin models (--pin) or `agent rm` some"
        )
        self.repo_id = repo_id
        self.needed = needed
        self.room = room
