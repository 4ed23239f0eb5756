"""The origin interface: where a model comes from when no peer has it.

Every kind of origin (an HF-compatible hub, object storage) is one module implementing `Origin` and one
entry in `agent.origin.kinds.ORIGIN_KINDS`, which picks it by the URL scheme of `--origin`:
- resolve a revision to a commit, with its files' sizes and content ids (`revision`: one call);
- say whether a repo is public (`reported_public`) and whether it exists (`has_repo`);
- a file's metadata: commit, content id, size and the URL its bytes come from (`file_metadata`);
- open a byte range of that URL (`open_range`), the unit of the origin engine (agent.origin.ranges);
- a URL a lease holder's libtorrent may use as a web seed, or None (`web_seed_url`);
- its retry policy: bounded retries (`retrying`) and patience with an origin that says "later"
  (`patiently`, `told_to_wait`), which the engine applies to its ranges.

`Origin` is the fetch engine's, sync and with the node's token. The agent's HF-compatible endpoint
(agent.http.hf) asks the origin for its clients instead, async and with each client's own credential:
through the kind's client API (agent.origin.hub_api `ClientApi`: the Hub's `/api/models/...` proxied,
the `resolve` hops, the access checks), which a kind registers beside its `Origin`, or not at all when
it has no Hub API to proxy (object storage: that endpoint then refuses every request). Both read a hub's
answers through agent.origin.answers, the same rules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import urllib3

from agent.core.modelnames import Scrub
from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile

T = TypeVar("T")


class Origin(Protocol):
    """One origin endpoint; thread-safe."""

    endpoint: str
    """Its base URL (what messages name)."""
    settings: OriginSettings

    @property
    def told_to_wait(self) -> bool:
        """Whether some request is waiting out the origin's "later" (429, 5xx) now: no stall."""
        ...

    @property
    def interrupted(self) -> bool:
        """Whether waits must end now (the daemon stopping)."""
        ...

    def close(self) -> None: ...

    def revision(self, repo_id: str, revision: str) -> tuple[str, list[RemoteFile]]:
        """A branch, tag or commit -> (40-hex commit, its files)."""
        ...

    def reported_public(self, repo_id: str) -> bool:
        """Whether the last `revision` of `repo_id` here said it is public (not private, not gated)."""
        ...

    def has_repo(self, repo_id: str) -> None:
        """Return when the origin has `repo_id`; NotFoundError when it does not (AuthError: it has it,
        gated or forbidden to this node)."""
        ...

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata: ...

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        """Where a file's bytes are asked for without a metadata request first (small files)."""
        ...

    def web_seed_url(self, repo_id: str, commit: str, path: str) -> str | None:
        """A URL libtorrent may fetch the file from with no credential, or None (no web seed)."""
        ...

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        """Bytes [start, end) of `url`, unread: 206, or 200 with the whole body from an origin that
        ignores ranges (the engine reads it as one stream). Raises `Retryable` for a passing failure."""
        ...

    def retrying(self, what: str, attempt_fn: Callable[[], T]) -> T: ...

    def patiently(
        self,
        call: Callable[[], T],
        moved: Callable[[], object] = ...,
        pause: Callable[[float], bool] | None = None,
    ) -> T: ...


OriginFactory = Callable[[OriginSettings, int, "threading.Event | None", Scrub], Origin]
"""Builds an origin from its settings, the most connections it may open, an interrupt event and how its
log lines name a model (agent.core.modelnames)."""
