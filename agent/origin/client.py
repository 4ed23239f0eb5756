"""`Origin`: any kind of origin (agent.origin.base `Kind`) as the fetch engine uses it, with the retries and
the patience every kind gets from this one place.

Every call of a kind is retried a bounded number of times on a `Retryable` failure: 429 (honouring
`RateLimit: ...;t=` and Retry-After, spread so that a cluster's nodes do not all come back at the reset),
5xx and dropped connections, with full-jitter exponential backoff (`retrying`). Beyond those, `patiently`
waits out an origin that stays unavailable, for as long as the settings' patience allows without
progress. The range engine (agent.origin.ranges) applies both to each of its ranges.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import urllib3

from agent.core.errors import (
    OriginError,
    OriginOverloadedError,
    OriginUnansweredError,
    OriginUnavailableError,
    RateLimitedError,
)
from agent.core.modelnames import Scrub, as_is
from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile, Retryable
from agent.origin.base import Kind

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PAGES = 10_000
"""Most pages of one file listing (`Kind.list_files`)."""
_PATIENT_PAUSE = 5.0
"""Most seconds between asks while waiting out an unavailable origin (the retries honoured Retry-After)."""
SPREAD_MAX = 30.0
"""Most seconds added to an origin's "come back in t seconds": nodes told the same reset spread over up to
half of t (at most this), so a cluster does not spend the new window's budget in its first second."""


class Origin:
    """One origin of any kind, its calls retried; thread-safe."""

    def __init__(
        self,
        kind: Kind,
        settings: OriginSettings,
        interrupt: threading.Event | None = None,
        scrub: Scrub = as_is,
    ) -> None:
        """`settings`: the retry policy's, and what planning reads (the token); `interrupt`: set when the
        waits of `patiently` must end now (the daemon stopping); `scrub`: how log lines name the model (a
        daemon's job: as metrics do, agent.core.modelnames)."""
        self.kind = kind
        self.settings = settings
        self.endpoint = kind.endpoint
        self.scrub = scrub
        self._interrupt = interrupt or threading.Event()
        self._public: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._told = 0
        """Requests waiting out the origin's 429 or 5xx now (`told_to_wait`)."""

    def __repr__(self) -> str:
        return f"Origin({self.kind!r})"

    def close(self) -> None:
        self.kind.close()

    # --- what a kind holds, retried ----------------------------------------------------------------

    def revision(self, repo_id: str, revision: str) -> tuple[str, list[RemoteFile]]:
        """A branch, tag or commit -> (40-hex commit, its files): `Kind.resolve`, and its further pages."""
        found = self.retrying(f"{repo_id}@{revision}", lambda: self.kind.resolve(repo_id, revision))
        self._public[repo_id] = found.public
        files, page = list(found.files), found.next_page
        if page is not None:
            what = self.scrub(f"{repo_id}@{revision}")
            log.info("%s: the revision lists no file metadata; asking for the tree", what)
        for _ in range(MAX_PAGES):
            if page is None:
                return found.commit, files
            one_page = functools.partial(self.kind.list_files, repo_id, found.commit, page)
            more, page = self.retrying(f"{repo_id}@{found.commit[:12]} file list", one_page)
            files.extend(more)
        raise OriginError(f"{repo_id}: file list has more than {MAX_PAGES} pages")

    def reported_public(self, repo_id: str) -> bool:
        """Whether this origin's last `revision` of `repo_id` was told the repo is public (`Resolved.public`).
        False when it was not resolved here."""
        return self._public.get(repo_id, False)

    def has_repo(self, repo_id: str) -> None:
        """Return when the origin has `repo_id`; NotFoundError when it does not (AuthError: it has it,
        gated or forbidden to this node)."""
        self.retrying(f"{repo_id} at the origin", lambda: self.kind.has_repo(repo_id))

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        return self.retrying(f"{repo_id}/{path}", lambda: self.kind.file_metadata(repo_id, commit, path))

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        """Where a file's bytes are asked for without a metadata request first (small files)."""
        return self.retrying(f"{repo_id}/{path}", lambda: self.kind.download_url(repo_id, commit, path))

    def web_seed_url(self, repo_id: str, commit: str, path: str) -> str | None:
        """A URL libtorrent may fetch the file from with no credential (an LFS file's signed CDN URL), or
        None when the kind's URLs need one."""
        meta = self.patiently(lambda: self.file_metadata(repo_id, commit, path))
        return meta.url if meta.web_seed else None

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        """One attempt (the range engine retries it with the reading of its body: `retrying`)."""
        return self.kind.open_range(url, start, end, what)

    # --- retries and patience ----------------------------------------------------------------------

    def backoff(self, attempt: int, hint: float | None) -> float:
        """Full jitter (AWS style): uniform(0, base*2^attempt), capped at backoff_max. When the origin said
        when to come back (`retry_hint`, at most `MAX_HINT`), then, plus a spread of up to half of it
        (`SPREAD_MAX` at most): asking sooner only spends the budget it is refusing."""
        if hint is not None:
            return hint + random.uniform(0, min(SPREAD_MAX, hint / 2))
        return random.uniform(0, min(self.settings.backoff_max, self.settings.backoff_base * 2**attempt))

    def retrying(self, what: str, attempt_fn: Callable[[], T]) -> T:
        """Run `attempt_fn` until it stops raising `Retryable`, at most `max_retries` attempts; while the
        origin answers nothing at all, for at most `answer_within` seconds. Every retry of an unanswered
        request is said at WARNING (the CLI shows warnings): the user sees the wait and why."""
        attempts = max(1, self.settings.max_retries)
        began = time.monotonic()
        for attempt in range(attempts):
            try:
                return attempt_fn()
            except Retryable as exc:
                delay = self.backoff(attempt, exc.delay)
                unanswered = isinstance(exc.error, OriginUnansweredError)
                spent = time.monotonic() - began
                if unanswered and (attempt + 1 >= attempts or spent + delay >= self.settings.answer_within):
                    raise OriginUnansweredError(
                        f"{exc.error} ({attempt + 1} {'try' if attempt == 0 else 'tries'} in {spent:.0f}s); "
                        "check the origin URL "
                        f"(--origin or HF_ENDPOINT, now {self.endpoint}), or wait longer with "
                        f"--origin-timeout (now {self.settings.answer_within:g}s)"
                    ) from None
                if attempt + 1 >= attempts:
                    raise exc.error from None
                level = logging.WARNING if delay >= _PATIENT_PAUSE or unanswered else logging.INFO
                log.log(level, "%s; retry %d of %d in %.1fs", exc.error, attempt + 1, attempts - 1, delay)
                with self._waiting(exc.error):
                    time.sleep(delay)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _waiting(self, error: BaseException) -> Iterator[None]:
        """A wait between asks; counted in `told_to_wait` when the origin itself said "later"."""
        told = isinstance(error, RateLimitedError | OriginOverloadedError)
        with self._lock:
            self._told += told
        try:
            yield
        finally:
            with self._lock:
                self._told -= told

    @property
    def interrupted(self) -> bool:
        """The daemon is stopping: no more waiting out the origin."""
        return self._interrupt.is_set()

    @property
    def told_to_wait(self) -> bool:
        """Whether a request of this origin is waiting (between retries, or out of patience) because it
        answered 429 or 5xx (a Retry-After of 5 s over 6 retries is longer than a stall). A lease
        holder then reports no stall (agent.fetch.sources.policy): another node taking its lease over would be
        told the same, and both would then pull the blob (benchmarks.md, "Faults during a cold fetch").
        Refused or dropped connections do not count: they may be this node's own trouble."""
        with self._lock:
            return self._told > 0

    def patiently(
        self,
        call: Callable[[], T],
        moved: Callable[[], object] = lambda: None,
        pause: Callable[[float], bool] | None = None,
    ) -> T:
        """`call()` (requests with their bounded retries) again while the origin stays unavailable (429,
        5xx, refused or dropped connections), for up to `settings.patience` seconds without progress: a
        change of `moved()` (a range's position) starts the count again. Waiting in place keeps a lease
        holder's partial blob and its lease; failing hands the lease to a node that starts the blob over,
        and the origin sends it again. `pause(seconds)` waits between asks
        and says whether to go on (False: raise the error now); `interrupt` ends the waits too."""
        patience = self.settings.patience
        mark, since = moved(), time.monotonic()
        while True:
            try:
                return call()
            except (RateLimitedError, OriginUnavailableError) as exc:
                now = time.monotonic()
                if moved() != mark:
                    mark, since = moved(), now
                left = since + patience - now
                if left <= 0:
                    raise
                wait = min(_PATIENT_PAUSE, left)
                said = self.scrub(str(exc))
                log.warning("%s; asking again in %.0fs (patience %.0fs left)", said, wait, left)
                with self._waiting(exc):
                    if self._interrupt.wait(wait) if pause is None else not pause(wait):
                        raise
                if self.interrupted:
                    raise
