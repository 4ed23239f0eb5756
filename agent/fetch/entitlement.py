"""Which repos this node proved it may read: the origin's word, kept for when it cannot be asked.

P2P must never widen access (docs/security.md): a gated or private repo reaches a request only after
the origin accepted the token that request runs with. Each time the origin plans a fetch (and, for a
repo it does not report public, answers a file's HEAD to the request's token), `record` notes:

- the repo, and the commit each revision resolved to;
- whether the origin reported the repo public (`private` and `gated` both explicitly false);
- for a repo that is not public, an HMAC-SHA256 of the request's token under a random per-node key,
  never the token (an anonymous request's entry is the HMAC of the empty string).

While the origin is unreachable or rate limiting, `allows` says whether a request may be planned from
the tracker's manifest instead: a repo recorded public, to anyone; another, only to a token that
matches an entry (the node's own token, when it was lent, is one like any other). A refusal by the
origin (`forget`) drops the token's entry at once; every entry expires after `ENTITLEMENT_TTL`.

    <state_dir>/entitlements.json   {"version": 1, "repos": {repo_id: {"public": t | null,
                                     "revisions": {rev: [commit, t]}, "tokens": {hmac: t}}}}
    <state_dir>/entitlements.key    the HMAC key: 32 random bytes, mode 0600

(t: unix time of the origin's answer). Both are written through a temp file and `os.replace`, with
the temp file's mode 0600 (`write_atomic`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from agent.cache.layout import StateDir, is_commit, node_key, write_atomic
from agent.core.errors import RefusedError

log = logging.getLogger(__name__)

ENTITLEMENT_TTL = 7 * 24 * 3600.0
"""Seconds a record of the origin's answer serves while the origin cannot be asked. Bounded so that a
token the Hub has since revoked, or a repo since made gated or private, is cut off even through a long
outage; long enough to ride out one (a weekend), and every plan the origin answers starts it again.
Not a setting: it is part of the trust model (docs/security.md), not a tuning knob."""

MAX_TOKENS_PER_REPO = 256
"""Token entries kept per repo (the HF endpoint's clients each bring their own); the oldest go first."""

_VERSION = 1

Grant = Literal["public", "token"]
"""Why a request may read a repo the origin cannot be asked about."""


class NotEntitledError(RefusedError):
    """The origin cannot be asked, and no unexpired record says this request may read the repo."""


class Entitlements:
    """The records of one state dir; thread-safe (one per daemon, shared by its fetch jobs)."""

    def __init__(self, state: StateDir, clock: Callable[[], float] = time.time) -> None:
        self._path = state.entitlements
        self._clock = clock
        self._lock = threading.Lock()
        self._key = node_key(state.entitlement_key)
        self._repos: dict[str, dict[str, Any]] = _load(self._path)

    def __repr__(self) -> str:  # the key stays out of reprs
        return f"Entitlements({str(self._path)!r})"

    def _digest(self, token: str | None) -> str:
        return hmac.new(self._key, (token or "").encode(), hashlib.sha256).hexdigest()

    def _fresh(self, stamp: object, now: float) -> bool:
        # abs(): a record from "the future" (the clock was set back) expires like any other.
        return isinstance(stamp, int | float) and _stamp(stamp) and abs(now - stamp) < ENTITLEMENT_TTL

    # -- the origin's answers -------------------------------------------------------------

    def record(self, repo_id: str, revision: str, commit: str, public: bool, token: str | None) -> None:
        """The origin planned repo@revision -> commit for a request with `token`, and reported the repo
        public or not (a non-public one also served that token a file's HEAD)."""
        now = self._clock()
        with self._lock:
            entry = self._repos.setdefault(repo_id, _empty())
            entry["revisions"][revision] = [commit, now]
            if public:
                entry["public"] = now
                entry["tokens"] = {}  # anyone may read it: per-token entries would only go stale
            else:
                entry["public"] = None
                tokens = entry["tokens"]
                tokens[self._digest(token)] = now
                excess = len(tokens) - MAX_TOKENS_PER_REPO
                for old in sorted(tokens, key=tokens.__getitem__)[: max(0, excess)]:
                    del tokens[old]
            self._save(now)

    def forget(self, repo_id: str, token: str | None) -> None:
        """The origin refused this token for the repo: it (and a "public" mark) serves no longer."""
        with self._lock:
            entry = self._repos.get(repo_id)
            if entry is None:
                return
            dropped = entry["tokens"].pop(self._digest(token), None) is not None
            if dropped or entry["public"] is not None:
                entry["public"] = None
                self._save(self._clock())

    # -- while the origin cannot be asked --------------------------------------------------

    def allows(self, repo_id: str, token: str | None) -> Grant | None:
        """"public", "token" (this token's entry), or None: the request may not read the repo."""
        now = self._clock()
        with self._lock:
            entry = self._repos.get(repo_id)
            if entry is None:
                return None
            if self._fresh(entry["public"], now):
                return "public"
            if self._fresh(entry["tokens"].get(self._digest(token)), now):
                return "token"
            return None

    def public_repos(self) -> set[str]:
        """Repos the origin last reported public (fresh records): their blobs may go to stock
        BitTorrent clients where the agent runs with --interop-public (agent.swarm.gate)."""
        now = self._clock()
        with self._lock:
            return {r for r, entry in self._repos.items() if self._fresh(entry["public"], now)}

    def commit_for(self, repo_id: str, revision: str) -> str | None:
        """The commit the origin last resolved repo@revision to, while that record is fresh."""
        now = self._clock()
        with self._lock:
            seen = self._repos.get(repo_id, _empty())["revisions"].get(revision)
        if seen is None or not self._fresh(seen[1], now):
            return None
        return str(seen[0])

    # -- the file -------------------------------------------------------------------------

    def _save(self, now: float) -> None:
        """Drop what expired, then write the rest (a failed write leaves the file as it was)."""
        for repo_id in list(self._repos):
            entry = self._repos[repo_id]
            if not self._fresh(entry["public"], now):
                entry["public"] = None
            entry["tokens"] = {k: t for k, t in entry["tokens"].items() if self._fresh(t, now)}
            entry["revisions"] = {r: v for r, v in entry["revisions"].items() if self._fresh(v[1], now)}
            if entry["public"] is None and not entry["tokens"]:
                del self._repos[repo_id]
        data = json.dumps({"version": _VERSION, "repos": self._repos}, sort_keys=True).encode()
        try:
            write_atomic(self._path, data)
        except OSError as exc:
            # The fetch itself is fine; only an origin outage would miss this record.
            log.warning("cannot write %s: %s", self._path, exc.strerror)


def _stamp(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _empty() -> dict[str, Any]:
    return {"public": None, "revisions": {}, "tokens": {}}


def _load(path: Path) -> dict[str, dict[str, Any]]:
    """The records on disk; anything unreadable counts as none (fail closed: only the origin grants)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return {}
    repos: dict[str, dict[str, Any]] = {}
    raw = data.get("repos") if isinstance(data, dict) and data.get("version") == _VERSION else None
    if not isinstance(raw, dict):
        log.warning("ignoring %s: not a version-%d entitlement file", path, _VERSION)
        return {}
    for repo_id, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        public = entry.get("public")
        tokens = entry.get("tokens")
        revisions = entry.get("revisions")
        repos[str(repo_id)] = {
            "public": public if isinstance(public, int | float) else None,
            "tokens": {
                str(k): t for k, t in (tokens if isinstance(tokens, dict) else {}).items() if _stamp(t)
            },
            "revisions": {
                str(r): [v[0], v[1]]
                for r, v in (revisions if isinstance(revisions, dict) else {}).items()
                if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and is_commit(v[0])
                and _stamp(v[1])
            },
        }
    return repos
