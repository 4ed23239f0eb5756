"""Reading a Hugging Face-compatible hub's answers: file metadata across redirects, listings, rate limits,
errors. Pure functions over status codes and headers, shared by the origin client (urllib3) and the HF
endpoint (httpx).

How the Hub answers in 2026, and so what these functions expect:
- `resolve` of a small (non-LFS) file is a 307 to a relative `/api/resolve-cache/...` URL on the Hub
  itself. The 307's Content-Length is its own short body's, not the file's; the file's ETag (the git
  blob sha1) and length are on the target (huggingface_hub 2.x follows such same-origin redirects on
  its metadata HEAD; huggingface/hf-hub#191 for a client that took the redirect's length).
- `resolve` of an LFS file is a 302 to a signed CDN URL on another host. The 302 carries the metadata
  (`X-Repo-Commit`, `X-Linked-Etag` = the sha256, `X-Linked-Size`) and Xet headers (`X-Xet-Hash`, a
  Merkle hash that is not the sha256, and `Link: rel="xet-auth"`); the CDN's answer carries none of
  them, and its ETag is the store's own. The Xet headers are ignored here: the bytes come over HTTP.
- 429s say when to come back with `RateLimit: "<bucket>";r=<left>;t=<seconds>` (IETF draft 9,
  huggingface.co/docs/hub/rate-limits), not always with Retry-After.
An object store (agent.origin.bucket) says "too many requests" with a 503 and an error code: S3's SlowDown
("Please reduce your request rate"), Azure's ServerBusy. That is a rate limit like a 429, not a store
that is down: a concurrent stream refused with it is met by fewer streams (agent.origin.streams).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from agent.cache.layout import is_blob_id, is_commit
from agent.core.errors import (
    EXIT_FAILURE,
    AuthError,
    NotFoundError,
    OriginError,
    OriginOverloadedError,
    RateLimitedError,
    WeightswarmError,
    snippet,
)

REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_HINT = 600.0
"""Longest wait an origin's Retry-After or RateLimit t= is taken for, seconds (the Hub's window is 300 s);
a larger value is capped, not trusted."""

_RATELIMIT = re.compile(r'"(?P<bucket>[\w-]+)"\s*;\s*r\s*=\s*(?P<r>\d+)\s*;\s*t\s*=\s*(?P<t>\d+)')
_XML_MESSAGE = re.compile(rb"<Message>([^<]{1,200})</Message>")
_THROTTLED = re.compile(rb"<Code>(SlowDown|ServerBusy)</Code>")
"""A 503's error codes that mean "slow down", not "down": S3's and Azure Storage's (see the module)."""

Headers = Mapping[str, str]


class Retryable(Exception):
    """A transient failure: retry after `delay` seconds (None = use backoff), else raise `error`."""

    def __init__(self, error: WeightswarmError, delay: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.delay = delay


class CdnRefusedError(AuthError):
    """The host a download was redirected to (the origin's CDN) refused its signed URL (401, 403 or 400):
    the URL expired (they live about an hour), or access was withdrawn. A URL that worked, or was minted a
    while ago, is renewed by resolving the file again (`agent.origin.location`); one refused right after
    a fresh resolve is a real refusal. Not the origin's refusal of a credential: its exit code is not
    `AuthError`'s (no token would help). `expired`: the host said the URL expired (S3's "Request has
    expired"): a renewal, never a stream limit (agent.origin.streams)."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, host: str, expired: bool = False) -> None:
        super().__init__(message)
        self.host = host
        self.expired = expired


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit, as the origin lists it."""

    path: str
    size: int
    blob_id: str
    """sha256 (the LFS oid) for LFS files, else the git blob sha1; a listing id when not `content_known`."""
    is_lfs: bool
    content_known: bool = True
    """False for an object store's object: its sha256 is computed by the first node to read it."""
    archive: str = ""
    """A registry's tar layer, by its media type: not a file, its files are unpacked from it
    (agent.fetch.layers); "" for a file."""
    content_etag: str | None = None
    """The listed ETag when it is a hash of the bytes (agent.origin.bucket `listed_checksum`), else None."""


@dataclass(frozen=True)
class FileMetadata:
    """What the origin's `resolve` HEAD says about one file, across its same-host redirects."""

    commit: str | None
    blob_id: str | None
    """None from an origin that names no content id (object storage: the listing's ETag is checked)."""
    size: int | None
    """None when no hop said (a proxy's HEAD without Content-Length): the listing's size stands."""
    url: str
    """Where the bytes are: the signed CDN URL for LFS files, else the last same-host URL."""
    web_seed: bool = True
    """Whether `url` may be handed to a web seed, which fetches it with no credential."""


@dataclass(frozen=True)
class Hop:
    """One answer of a redirect chain."""

    status: int
    headers: Headers
    url: str


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port), the port defaulted: what decides whether a redirect stays on the origin."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return parts.scheme, (parts.hostname or "").lower(), port


def same_host(a: str, b: str) -> bool:
    return origin_of(a) == origin_of(b)


def host_of(url: str) -> str:
    return urlsplit(url).netloc


def next_hop(hop: Hop) -> str | None:
    """The URL a metadata request follows next: a redirect's target on the same origin (the token may go
    along), else None (the answer is final; a CDN's signed URL is where the bytes are)."""
    if hop.status not in REDIRECTS:
        return None
    location = hop.headers.get("Location") or hop.headers.get("location")
    if not location:
        raise OriginError(f"redirect without Location from {host_of(hop.url)}")
    target = urljoin(hop.url, location)
    if urlsplit(target).scheme not in ("http", "https"):
        raise OriginError(f"redirect to a non-HTTP URL from {host_of(hop.url)}")
    return target if same_host(hop.url, target) else None


def _etag(value: str | None) -> str:
    return (value or "").strip().removeprefix("W/").strip('"').lower()


def file_metadata(hops: list[Hop], what: str) -> FileMetadata:
    """The metadata of a `resolve` HEAD from its chain of answers, read as huggingface_hub reads it: the
    commit and the linked ETag and size from the first hop that has them; the ETag and Content-Length of a
    non-redirect answer only (a redirect's length is its own body's). Every value is checked before it is
    used in a URL, a path or a reservation."""
    commit = linked = linked_size = None
    for hop in hops:
        h = hop.headers
        commit = commit or h.get("X-Repo-Commit") or h.get("x-repo-commit")
        linked = linked or h.get("X-Linked-Etag") or h.get("x-linked-etag")
        linked_size = linked_size or h.get("X-Linked-Size") or h.get("x-linked-size")
    last = hops[-1]
    final = last.status not in REDIRECTS
    blob_id = _etag(linked) or (_etag(last.headers.get("ETag") or last.headers.get("etag")) if final else "")
    length = last.headers.get("Content-Length") or last.headers.get("content-length")
    size_s = linked_size or (length if final else None)
    if commit is not None:
        commit = commit.strip().lower()
        if not is_commit(commit):
            raise OriginError(f"{what}: origin sent a malformed commit id {snippet(commit, 48)!r}")
    if not is_blob_id(blob_id):
        shown = f" ({snippet(blob_id, 48)!r})" if blob_id else ""
        raise OriginError(f"{what}: origin gave no usable ETag for the file{shown}")
    size: int | None = None
    if size_s is not None:
        size_s = size_s.strip()
        if not size_s.isdigit():
            raise OriginError(f"{what}: origin sent a malformed size {snippet(size_s, 32)!r}")
        size = int(size_s)
    if final:
        url = last.url
    else:
        url = urljoin(last.url, last.headers.get("Location") or last.headers.get("location") or "")
    return FileMetadata(commit, blob_id, size, url)


def retry_hint(headers: Headers) -> float | None:
    """Seconds the origin asked to wait: `RateLimit: ...;r=0;t=N` (the Hub's 429s) or `Retry-After`,
    the longer; None when it said neither. Capped at `MAX_HINT`."""
    hints: list[float] = []
    limit = headers.get("RateLimit") or headers.get("ratelimit")
    for match in _RATELIMIT.finditer(limit or ""):  # one item per bucket (RFC 9651 list)
        if int(match.group("r")) == 0:
            hints.append(float(match.group("t")))
    after = headers.get("Retry-After") or headers.get("retry-after")
    if after:
        try:
            hints.append(max(0.0, float(after)))
        except ValueError:
            pass  # an HTTP date: rare from hubs; the backoff applies instead
    return min(MAX_HINT, max(hints)) if hints else None


def raise_for_status(status: int, headers: Headers, body: bytes, what: str, url: str, endpoint: str) -> None:
    """Map an HTTP error to an `agent.core.errors` class (transient ones as `Retryable`). `url` is what was
    asked; an answer from a host other than `endpoint`'s is the CDN's, and says so."""
    code = headers.get("X-Error-Code") or headers.get("x-error-code") or ""
    message = headers.get("X-Error-Message") or headers.get("x-error-message")
    xml = _XML_MESSAGE.search(body) if not message else None
    detail = snippet(message or (xml.group(1) if xml else body), 120)
    suffix = f": {detail}" if detail else ""
    if status == 429:
        limited = RateLimitedError(f"{what}: origin is rate limiting (429) and kept refusing")
        raise Retryable(limited, retry_hint(headers))
    if status == 503 and (throttled := _THROTTLED.search(body)):
        limited = RateLimitedError(f"{what}: the store asks to slow down (503 {throttled.group(1).decode()})")
        raise Retryable(limited, retry_hint(headers))
    if status in RETRY_STATUSES:
        raise Retryable(OriginOverloadedError(f"{what}: origin error {status}{suffix}"), retry_hint(headers))
    if not same_host(url, endpoint) and status in (400, 401, 403):
        host = host_of(url)
        raise CdnRefusedError(
            f"{what}: the origin's download host {host} refused the signed URL ({status}{suffix}); "
            "the origin itself granted access",
            host,
            expired="expired" in detail.lower(),
        )
    if status == 401 and not code and "credential" in detail.lower():
        raise AuthError(f"{what}: the origin refused the token (invalid credentials); check --token/HF_TOKEN")
    if code == "RepoNotFound" or (status == 401 and not code):
        raise NotFoundError(f"{what}: repository not found (or it is private: pass --token){suffix}")
    if code == "RevisionNotFound":
        raise NotFoundError(f"{what}: revision not found{suffix}")
    if code == "EntryNotFound" or status == 404:
        raise NotFoundError(f"{what}: not found{suffix}")
    if status in (401, 403):
        raise AuthError(
            f"{what}: access refused by the origin ({status} {code or 'forbidden'}); "
            f"check --token / HF_TOKEN and that it was granted access{suffix}"
        )
    raise OriginError(f"{what}: origin answered {status}{suffix}")


def siblings(info: object, repo_id: str) -> list[RemoteFile] | None:
    """The files of a `revision?blobs=true` answer, or None when it lacks their sizes and ids (a mirror
    that ignores `blobs`): then the tree listing is asked."""
    items = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(items, list) or not all(isinstance(s, dict) and "size" in s for s in items):
        return None
    files = []
    for item in items:
        lfs = item.get("lfs")
        if isinstance(lfs, dict) and lfs.get("sha256"):
            size = lfs.get("size", item.get("size"))
            files.append(_checked(repo_id, item, item.get("rfilename"), size, lfs["sha256"], True))
        elif item.get("blobId"):
            size = item.get("size")
            files.append(_checked(repo_id, item, item.get("rfilename"), size, item["blobId"], False))
        else:
            return None
    return files


def tree_file(item: object, repo_id: str) -> RemoteFile | None:
    """One entry of a tree listing page; None for a directory."""
    if not isinstance(item, dict) or item.get("type") != "file":
        return None
    lfs = item.get("lfs")
    if isinstance(lfs, dict) and lfs.get("oid"):
        return _checked(repo_id, item, item.get("path"), lfs.get("size", item.get("size")), lfs["oid"], True)
    return _checked(repo_id, item, item.get("path"), item.get("size"), item.get("oid"), False)


def _checked(
    repo_id: str, item: dict[str, object], path: object, size: object, blob_id: object, lfs: bool
) -> RemoteFile:
    bid = str(blob_id).lower() if isinstance(blob_id, str) else ""
    if (
        not isinstance(path, str)
        or not path
        or not isinstance(size, int)
        or isinstance(size, bool)
        or size < 0
        or not is_blob_id(bid)
        or (lfs and len(bid) != 64)
    ):
        raise OriginError(f"{repo_id}: malformed entry in the file list: {snippet(json.dumps(item), 80)}")
    return RemoteFile(path, size, bid, lfs)


def link_next(link: str | None) -> str | None:
    """The `rel="next"` target of an RFC 8288 Link header."""
    if not link:
        return None
    for part in link.split(","):
        segs = part.split(";")
        if any(s.strip().replace(" ", "") in ('rel="next"', "rel=next") for s in segs[1:]):
            return segs[0].strip().strip("<>")
    return None
