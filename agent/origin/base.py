"""The origin interface: where a model comes from when no peer has it.

A kind of origin (an HF-compatible hub, object storage) is one module with a class implementing `Kind`,
named by URL scheme in agent.origin.kinds `ORIGIN_KINDS` and imported only when an origin of that scheme
is opened. A kind answers what it holds, each call one attempt:
- `resolve` a reference (a branch, tag or commit) to an immutable 40-hex commit, with its files (path,
  size, content id) when the same answer lists them; `list_files` pages through the rest;
- `has_repo`: whether it holds a repo at all;
- `file_metadata`: one file's content id and size as it says now, and the URL its bytes come from;
  `download_url`: that URL without asking first (small files);
- `open_range`: bytes [start, end) of such a URL, as an HTTP answer (agent.origin.session
  `HttpSession.request` makes one).
A passing failure (429, 5xx, a dropped connection) is raised as agent.origin.answers `Retryable`; every
other as an `agent.core.errors` class. Retries, patience with an origin that says "later", and the
parallel hedged range reader are not a kind's: agent.origin.client `Origin` wraps any kind with them
(as kraken's `lib/backend/throttle.go` wraps any backend), and agent.origin.ranges reads through it.
No kind subclasses another: what two kinds share (HTTP, agent.origin.session) they hold.

The agent's HF-compatible endpoint (agent.http.hf) asks the origin for its clients instead, async and with
each client's own credential: through a kind's client API (agent.origin.hub_api `ClientApi`), which only a
kind that speaks the Hub's API registers (object storage registers none: that endpoint then refuses every
request). Both read a hub's answers through agent.origin.answers, the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import urllib3

from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile


@dataclass(frozen=True)
class Resolved:
    """A reference resolved: the commit, and what the same answer said of it."""

    commit: str
    """40 hex: the immutable id every later call names."""
    files: list[RemoteFile]
    """The files the answer listed (all of them unless `next_page`)."""
    public: bool = False
    """The origin said anyone may read it (the Hub's `private` and `gated` both false): no per-file
    access check. False when unsure."""
    next_page: str | None = None
    """More files: `list_files(repo_id, commit, next_page)` (a mirror that leaves a revision's files out)."""


class Kind(Protocol):
    """One origin endpoint of one kind; thread-safe. Every call is one attempt (see the module doc)."""

    endpoint: str
    """Its base URL, no trailing slash (what messages name)."""

    def close(self) -> None: ...

    def resolve(self, repo_id: str, revision: str) -> Resolved:
        """A branch, tag or commit -> its commit and files (NotFoundError: no such repo or revision)."""
        ...

    def list_files(self, repo_id: str, commit: str, page: str) -> tuple[list[RemoteFile], str | None]:
        """One page of the files at `commit` (`page`: a `Resolved.next_page` or the last call's next page)
        and the next page, None at the end. Only called on a `next_page` a kind gave."""
        ...

    def has_repo(self, repo_id: str) -> None:
        """Return when the origin has `repo_id`; NotFoundError when it does not (AuthError: it has it,
        gated or forbidden to this node)."""
        ...

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        """The file as the origin says now (checked against what it listed, where it can) and the URL its
        bytes come from (`FileMetadata.web_seed`: whether a web seed may use that URL)."""
        ...

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        """Where a file's bytes are asked for without a metadata request first (small files)."""
        ...

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        """Bytes [start, end) of `url`, unread: 206, or 200 with the whole body from an origin that
        ignores ranges (the engine reads it as one stream). Raises `Retryable` for a passing failure."""
        ...


KindFactory = Callable[[OriginSettings, int], Kind]
"""Builds a kind's origin from its settings and the most connections it may open at once."""
