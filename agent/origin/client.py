"""The HF-compatible hub as an origin (agent.origin.base `Origin`): a revision with its files, per-file
metadata, ranged GETs.

One urllib3 PoolManager (keep-alive connections reused across ranges and files). Every request is
retried a bounded number of times on 429 (honouring `RateLimit: ...;t=` and Retry-After, spread so
that a cluster's nodes do not all come back at the reset), 5xx and dropped connections, with
full-jitter exponential backoff. How the answers are read: `agent.origin.answers`. HTTP errors become
`agent.core.errors` classes with one-line messages; response bodies are cut short and the token never
appears anywhere but the Authorization header, which is dropped when a redirect leaves the origin's
host (as huggingface_hub does: a CDN must not see the token).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar
from urllib.parse import quote, urljoin

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)
from urllib3.exceptions import HTTPError as Urllib3Error

from agent.cache.layout import is_commit
from agent.core.errors import (
    OriginError,
    OriginOverloadedError,
    OriginUnansweredError,
    OriginUnavailableError,
    RateLimitedError,
    snippet,
)
from agent.core.modelnames import Scrub, as_is
from agent.core.settings import OriginSettings
from agent.origin.answers import (
    REDIRECTS,
    FileMetadata,
    Hop,
    RemoteFile,
    Retryable,
    file_metadata,
    host_of,
    link_next,
    next_hop,
    raise_for_status,
    same_host,
    siblings,
    tree_file,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_MAX_REDIRECTS = 5
_MAX_PAGES = 10_000
_PATIENT_PAUSE = 5.0
"""Most seconds between asks while waiting out an unavailable origin (the retries honoured Retry-After)."""
SPREAD_MAX = 30.0
"""Most seconds added to an origin's "come back in t seconds": nodes told the same reset spread over up to
half of t (at most this), so a cluster does not spend the new window's budget in its first second."""


class OriginClient:
    """Talks to one hub endpoint. Thread-safe (urllib3 pools are)."""

    def __init__(
        self,
        settings: OriginSettings,
        max_connections: int = 16,
        interrupt: threading.Event | None = None,
        scrub: Scrub = as_is,
    ) -> None:
        """`scrub`: how log lines name the model (a daemon's job: as metrics do, agent.core.modelnames)."""
        self.settings = settings
        self.scrub = scrub
        self._interrupt = interrupt or threading.Event()
        """Set when the waits of `patiently` must end now (the daemon stopping)."""
        self.endpoint = settings.endpoint.rstrip("/")
        # A third of the bound at most per try: a silent server is asked three times and said so.
        self._timeout = urllib3.Timeout(
            connect=min(settings.connect_timeout, settings.answer_within / 3),
            read=min(settings.read_timeout, settings.answer_within / 3),
        )
        self._pool = urllib3.PoolManager(
            num_pools=8,
            # Room for the hedges (agent.origin.hedging) beside the workers' connections: a full pool
            # discards a connection coming back, and says so in a warning each time.
            maxsize=2 * max(1, max_connections),
            block=False,
            retries=False,
            timeout=self._timeout,
        )
        self._public: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._told = 0
        """Requests waiting out the origin's 429 or 5xx now (`told_to_wait`)."""

    def __repr__(self) -> str:
        return f"OriginClient({self.endpoint!r})"

    def close(self) -> None:
        self._pool.clear()

    # --- plumbing --------------------------------------------------------------------------------

    def headers_for(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"User-Agent": self.settings.user_agent, "Accept-Encoding": "identity"}
        if self.settings.token and same_host(url, self.endpoint):
            headers["Authorization"] = f"Bearer {self.settings.token}"
        headers.update(extra or {})
        return headers

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
        """Whether a request of this client is waiting (between retries, or out of patience) because the
        origin answered 429 or 5xx (a Retry-After of 5 s over 6 retries is longer than a stall). A lease
        holder then reports no stall (agent.fetch.sources.policy): another node taking its lease over would be
        told the same, and both would then pull the blob (1.5 x S measured through a 30-s rate limit).
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
        holder's partial blob and its lease; failing hands the lease to a node that starts the blob over
        (measured at 1.5 x S of origin egress through 503 bursts). `pause(seconds)` waits between asks
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

    def request(
        self,
        method: str,
        url: str,
        what: str,
        headers: dict[str, str] | None = None,
        follow_redirects: bool = True,
    ) -> urllib3.BaseHTTPResponse:
        """One request (no retries): follows redirects itself so the token stays on the origin host.

        Returns the response unread (preload_content=False) for 2xx/3xx-not-followed, its `url` the URL
        that answered; raises `Retryable` for transient failures and a mapped `WeightswarmError` for the
        rest (`CdnRefusedError` when a host the origin redirected to refused).
        """
        for _ in range(_MAX_REDIRECTS + 1):
            resp = self._send(method, url, what, headers)
            if follow_redirects and resp.status in REDIRECTS:
                location = resp.headers.get("Location")
                resp.drain_conn()
                release(resp)
                if not location:
                    raise OriginError(f"{what}: redirect without Location from {host_of(url)}")
                url = urljoin(url, location)
                continue
            if resp.status >= 400:
                body = resp.read(4096) if method != "HEAD" else b""
                release(resp)
                raise_for_status(resp.status, resp.headers, body, what, url, self.endpoint)
            resp.url = url
            return resp
        raise OriginError(f"{what}: too many redirects")

    def _send(
        self, method: str, url: str, what: str, headers: dict[str, str] | None
    ) -> urllib3.BaseHTTPResponse:
        # A pooled keep-alive connection the server has since closed fails at once; that is not
        # an origin failure, so one immediate resend on a fresh connection comes before backoff.
        for fresh_try in (False, True):
            try:
                return self._pool.request(
                    method,
                    url,
                    headers=self.headers_for(url, headers),
                    redirect=False,
                    preload_content=False,
                    decode_content=False,
                )
            except Urllib3Error as exc:
                stale = isinstance(exc, ProtocolError) and not fresh_try
                if not stale:
                    raise _unanswered(what, url, exc, self._timeout) from None
        raise AssertionError("unreachable")

    def get_json(self, url: str, what: str) -> tuple[object, urllib3.BaseHTTPResponse]:
        def attempt() -> tuple[object, urllib3.BaseHTTPResponse]:
            resp = self.request("GET", url, what, {"Accept": "application/json"})
            try:
                body = read_capped(resp, self.settings.max_json_bytes, what)
            except Urllib3Error as exc:
                raise _unavailable(f"{what}: connection dropped", exc) from None
            finally:
                release(resp)
            try:
                return json.loads(body), resp
            except ValueError:
                raise OriginError(f"{what}: origin sent invalid JSON: {snippet(body, 80)}") from None

        return self.retrying(what, attempt)

    # --- the hub API -----------------------------------------------------------------------------

    def revision(self, repo_id: str, revision: str) -> tuple[str, list[RemoteFile]]:
        """Revision (branch, tag or commit) -> (40-hex commit, its files), in one API call: the revision
        with its files' metadata (`?blobs=true`: size, git blob id, LFS sha256, as huggingface_hub's
        `model_info(files_metadata=True)` asks). The tree listing only for an origin that leaves them out.
        Each node plans from the origin itself: a plan shared through the tracker would let one
        compromised node choose the bytes every node installs."""
        url = f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}?blobs=true"
        data, _ = self.get_json(url, f"{repo_id}@{revision}")
        sha = data.get("sha") if isinstance(data, dict) else None
        if not isinstance(sha, str) or not is_commit(sha.lower()):
            raise OriginError(f"{repo_id}@{revision}: origin did not return a commit sha")
        assert isinstance(data, dict)
        self._public[repo_id] = data.get("private") is False and data.get("gated") is False
        commit = sha.lower()
        files = siblings(data, repo_id)
        if files is None:
            what = self.scrub(f"{repo_id}@{revision}")
            log.info("%s: the revision lists no file metadata; asking for the tree", what)
            files = self._tree(repo_id, commit)
        return commit, files

    def reported_public(self, repo_id: str) -> bool:
        """Whether this client's last `revision` of `repo_id` was told the repo is public: `private` and
        `gated` both explicitly false (a missing or null field, or a gating mode, is not public; see
        docs/security.md). False when it was not resolved here."""
        return self._public.get(repo_id, False)

    def _tree(self, repo_id: str, commit: str) -> list[RemoteFile]:
        """Every file at `commit` (recursive tree listing, following `Link: rel="next"` pages)."""
        url: str | None = f"{self.endpoint}/api/models/{repo_id}/tree/{commit}?recursive=true"
        files: list[RemoteFile] = []
        for _ in range(_MAX_PAGES):
            if url is None:
                return files
            data, resp = self.get_json(url, f"{repo_id}@{commit[:12]} file list")
            if not isinstance(data, list):
                raise OriginError(f"{repo_id}: file list is not a JSON array")
            files.extend(f for f in (tree_file(item, repo_id) for item in data) if f is not None)
            nxt = link_next(resp.headers.get("Link"))
            url = urljoin(url, nxt) if nxt else None
            if url is not None and not same_host(url, self.endpoint):
                raise OriginError(f"{repo_id}: the file list's next page is on another host ({host_of(url)})")
        raise OriginError(f"{repo_id}: file list has more than {_MAX_PAGES} pages")

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        """The file's `resolve` URL (a small file's 307 leads to its bytes)."""
        return f"{self.endpoint}/{repo_id}/resolve/{commit}/{quote(path)}"

    def web_seed_url(self, repo_id: str, commit: str, path: str) -> str | None:
        """The file's download URL after its redirects (an LFS file's signed CDN URL): no token needed."""
        return self.patiently(lambda: self.file_metadata(repo_id, commit, path)).url

    def has_repo(self, repo_id: str) -> None:
        """The model info of `repo_id` answers (NotFoundError: the Hub's RepoNotFound)."""
        self.get_json(f"{self.endpoint}/api/models/{repo_id}", f"{repo_id} at the origin")

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        return self.request("GET", url, what, {"Range": f"bytes={start}-{end - 1}"})

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        """HEAD /resolve/, following redirects on the origin's own host (a small file's 307 to its
        resolve-cache URL) but not to another (an LFS file's 302 to the CDN, whose URL is the answer)."""
        what = f"{repo_id}/{path}"

        def attempt() -> FileMetadata:
            url: str | None = self.download_url(repo_id, commit, path)
            hops: list[Hop] = []
            while url is not None:
                if len(hops) > _MAX_REDIRECTS:
                    raise OriginError(f"{what}: too many redirects")
                resp = self.request("HEAD", url, what, follow_redirects=False)
                release(resp)
                hops.append(Hop(resp.status, resp.headers, url))
                url = next_hop(hops[-1])
            return file_metadata(hops, what)

        return self.retrying(what, attempt)


def _unavailable(what: str, exc: BaseException) -> Retryable:
    return Retryable(OriginUnavailableError(f"{what} ({_reason(exc)})"))


def _unanswered(what: str, url: str, exc: BaseException, timeout: urllib3.Timeout) -> Retryable:
    """A request that got no answer, in words a person can act on (never the URL's query: a signed CDN
    URL carries credentials)."""
    host = host_of(url)
    if isinstance(exc, NameResolutionError):
        said = f"the host name of {host} is not known (DNS)"
    elif isinstance(exc, NewConnectionError):  # a ConnectTimeoutError too, but one that came at once
        cause = "refused the connection" if "refused" in str(exc).lower() else "cannot be connected to"
        said = f"{host} {cause}"
    elif isinstance(exc, ConnectTimeoutError):
        said = f"{host} accepted no connection within {timeout.connect_timeout:g}s"
    elif isinstance(exc, ReadTimeoutError):
        said = f"{host} accepted the connection but sent nothing in {timeout.read_timeout:g}s"
    elif isinstance(exc, ProtocolError):
        said = f"{host} closed the connection without an answer"
    else:
        said = f"no answer from {host} ({_reason(exc)})"
    return Retryable(OriginUnansweredError(f"{what}: origin not answering: {said}"))


def _reason(exc: BaseException) -> str:
    """A short cause without URLs' query strings (signed CDN URLs carry credentials)."""
    reason = getattr(exc, "reason", None) or exc
    return type(reason).__name__


def read_capped(resp: urllib3.BaseHTTPResponse, cap: int, what: str) -> bytes:
    """A whole API answer of at most `cap` bytes: refused by its Content-Length before a byte is read, or
    once more than `cap` came (a hostile origin's endless JSON must not fill the agent's memory)."""
    length = resp.headers.get("Content-Length", "")
    if length.strip().isdigit() and int(length) > cap:
        raise OriginError(f"{what}: the origin's answer is {int(length)} bytes, more than the {cap} allowed")
    parts: list[bytes] = []
    got = 0
    while got <= cap:
        data = resp.read(min(1 << 20, cap + 1 - got))
        if not data:
            return b"".join(parts)
        parts.append(data)
        got += len(data)
    raise OriginError(f"{what}: the origin's answer is more than the {cap} bytes allowed")


def read_body_into(resp: urllib3.BaseHTTPResponse, view: memoryview) -> int:
    """Fill `view` from the raw body; fewer bytes only at its end, 0 once it is complete.

    Reads from the socket straight into the caller's buffer. `resp.read(n)` costs, per block,
    a zeroed bytearray plus a bytes copy in http.client and an allocation: measured at loopback
    rates that was a large share of `agent fetch`'s CPU, which on a 2-core node competes with
    hashing. urllib3's own byte count is bypassed, so callers decide keep-alive themselves
    (`body_complete`). A dropped connection or a read timeout surfaces as a Retryable.
    """
    raw = getattr(resp, "_fp", None)
    if not isinstance(raw, http.client.HTTPResponse):  # not urllib3's usual response: the portable path
        try:
            data = resp.read(len(view))
        except Urllib3Error as exc:
            raise _unavailable("connection dropped", exc) from None
        view[: len(data)] = data
        return len(data)
    try:
        return raw.readinto(view)
    except (OSError, http.client.HTTPException) as exc:
        raise _unavailable("connection dropped", exc) from None


def release(resp: urllib3.BaseHTTPResponse) -> None:
    """Hand a response's connection back to the pool when its body is over; close it otherwise.

    http.client keeps a HEAD's response open until it is read or collected, and a refused one lives on in
    its error's traceback while the client backs off. The next request on that connection (another
    thread's range) was then sent and answered but failed on the client (ResponseNotReady) and was sent
    again: a range the origin served twice (a daemon test's egress, 1.08 x S).
    """
    try:
        if body_complete(resp):
            raw = getattr(resp, "_fp", None)
            if isinstance(raw, http.client.HTTPResponse):
                raw.close()  # what reading its empty rest would do: the connection is idle again
        else:
            resp.close()
        resp.release_conn()
    except Exception:  # noqa: BLE001 - cleanup must not mask the real error
        pass


def body_complete(resp: urllib3.BaseHTTPResponse) -> bool:
    """Whether every body byte was read through `read_body_into` (the connection can be reused)."""
    raw = getattr(resp, "_fp", None)
    if isinstance(raw, http.client.HTTPResponse):
        return raw.length == 0
    return not resp.length_remaining
