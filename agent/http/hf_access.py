"""The HF endpoint's access decisions: P2P must never widen access (docs/security.md).

A file goes out only on one of two decisions, each from a request the agent builds itself (fixed URL,
no client query string, redirects never followed: a 3xx is no decision):
- public: the agent's own anonymous `GET {origin}/api/models/{repo}` says `"private": false` and
  `"gated": false` (on the Hub `gated` is false, "auto" or "manual"; a missing field is not public).
  Kept per repo for `ops.public_ttl` seconds and shared by every client; "not public" is kept for
  `ops.access_ttl`.
- granted: `GET {origin}/api/models/{repo}/auth-check` with the client's own Authorization answers
  200 (as `huggingface_hub.auth_check`). Kept for `ops.access_ttl` seconds under (an HMAC of the
  client's token with a per-process key, repo): never the token itself, never on disk or in logs,
  never for another token, and never for a client without one (an anonymous client gets only what
  is public).
Both are asked through the origin's client API (agent.origin.hub_api: `model_info`, `auth_check`).
Responses to the client's own `/api/models/...` requests are passed through and never decide
anything. A refusal is passed on with the origin's status and `X-Error-Code`, even when the blobs
are cached; a private repo is never revealed (the origin's 401/404 `RepoNotFound`); a 429 is passed on
with its rate-limit headers, so the client backs off. When the origin is unreachable, only a decision
still in its TTL lets cached files out; otherwise 503.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fastapi import Response

from agent.core.modelnames import RepoName, as_is
from agent.http.hf_answers import hub_error, origin_refusal
from agent.origin.hub_api import Answer, ClientApi, Unreachable

log = logging.getLogger(__name__)

_MAX_DECISIONS = 10_000
"""Access decisions kept at most (each kind); beyond, the oldest are dropped (asked again)."""


@dataclass(frozen=True)
class Visibility:
    """What the origin answered the agent's own anonymous model-info request."""

    public: bool
    """Explicitly `private: false` and `gated: false`."""
    private: bool
    gated: str | bool
    refusal: tuple[int, str, str | None]
    """What an anonymous client is told about this repo when it is not public: (status, message,
    X-Error-Code), the origin's own refusal where it gave one."""


def client_credential(authorization: str | None) -> str | None:
    """What identifies a client to the origin: its bearer token, or the whole header for another
    scheme (marked, so that it never equals a bearer token); None for an anonymous client."""
    if not authorization or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return "\0" + authorization.strip()  # a NUL cannot be in a header, hence in a token


class AccessCache:
    """Who may read what, as the origin last said: a shared public decision per repo, and grants per
    (keyed hash of the client's token, repo)."""

    def __init__(self, ttl: float, public_ttl: float) -> None:
        self.ttl = ttl
        self.public_ttl = public_ttl
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._granted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._visibility: OrderedDict[str, tuple[Visibility, float]] = OrderedDict()

    def _who(self, credential: str) -> str:
        return hmac.new(self._key, credential.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def _bound(table: OrderedDict[Any, Any], now: float) -> None:
        if len(table) <= _MAX_DECISIONS:
            return
        for key in [k for k, v in table.items() if (v[1] if isinstance(v, tuple) else v) <= now]:
            del table[key]
        while len(table) > _MAX_DECISIONS:
            table.popitem(last=False)

    def grant(self, repo_id: str, credential: str) -> None:
        with self._lock:
            now = time.monotonic()
            key = (self._who(credential), repo_id)
            self._granted.pop(key, None)
            self._granted[key] = now + self.ttl
            self._bound(self._granted, now)

    def revoke(self, repo_id: str, credential: str | None) -> None:
        if credential is None:
            return
        with self._lock:
            self._granted.pop((self._who(credential), repo_id), None)

    def granted(self, repo_id: str, credential: str | None) -> bool:
        if credential is None:  # no token, no grant: anonymous clients get what is public only
            return False
        with self._lock:
            return self._granted.get((self._who(credential), repo_id), 0.0) > time.monotonic()

    def set_visibility(self, repo_id: str, visibility: Visibility) -> None:
        with self._lock:
            now = time.monotonic()
            self._visibility.pop(repo_id, None)
            ttl = self.public_ttl if visibility.public else self.ttl
            self._visibility[repo_id] = (visibility, now + ttl)
            self._bound(self._visibility, now)

    def visibility(self, repo_id: str) -> Visibility | None:
        """The origin's last answer about the repo, while in its TTL; None: ask again."""
        with self._lock:
            known = self._visibility.get(repo_id)
            return known[0] if known is not None and known[1] > time.monotonic() else None

    def allowed(self, repo_id: str, credential: str | None) -> bool:
        known = self.visibility(repo_id)
        return (known is not None and known.public) or self.granted(repo_id, credential)


def redirected(what: str, repo_id: str, status: int, name: RepoName) -> tuple[int, str]:
    """A redirect on an access request: no decision (not followed, so no other URL decides). `name`: how
    the log line names the repo (the answer, for the client who asked, names it)."""
    log.warning("the origin answered the %s of %s with HTTP %d; not followed", what, name(repo_id), status)
    return 502, f"the origin answered the {what} of {repo_id} with a redirect (HTTP {status}); not followed"


def visibility_of(repo_id: str, answer: Answer, name: RepoName = as_is) -> Visibility:
    """The origin's answer to the agent's anonymous model-info request, read strictly: public only
    with `"private": false` and `"gated": false` both present in a 200 JSON object. `name`: as in
    `redirected`."""
    status = answer.status
    info: Any = None
    if status == 200:
        try:
            info = json.loads(answer.body)
        except ValueError:
            info = None
    if isinstance(info, dict):
        private, gated = info.get("private"), info.get("gated")
        if private is False and gated is False:
            return Visibility(True, False, False, (200, "", None))
        if private is False and gated in ("auto", "manual"):
            msg = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return Visibility(False, False, gated, (401, msg, "GatedRepo"))
        log.warning("the origin's model info of %s does not say it is public: tokens only", name(repo_id))
        msg = f"the origin does not say that {repo_id} is public; send a token that may read it"
        return Visibility(False, private is not False, gated or "auto", (403, msg, None))
    if 300 <= status < 400:
        return Visibility(False, True, False, (*redirected("model info", repo_id, status, name), None))
    if status >= 400:  # private or missing: the origin's own refusal, which does not say which
        message = answer.headers.get("x-error-message") or "Repository not found"
        return Visibility(False, True, False, (status, message, answer.headers.get("x-error-code")))
    msg = f"the origin sent no usable model info for {repo_id} (HTTP {status})"
    return Visibility(False, True, False, (502, msg, None))


class _Throttled(Exception):
    """The origin answered an access request with 429: passed on, so the client backs off."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"HTTP {answer.status}")
        self.answer = answer


class OriginAccess:
    """Asks the origin whether a client may read a repo's files, and keeps its answers (`cache`)."""

    def __init__(self, api: ClientApi, cache: AccessCache, name: RepoName) -> None:
        """`api` asks the origin (agent.origin.hub_api: it follows no redirect of these requests); `name`:
        how log lines name a repo (agent.core.modelnames)."""
        self.api = api
        self.cache = cache
        self.name = name

    async def check(self, repo_id: str, authorization: str | None) -> Response | None:
        """None when the client may read the repo's files, else the answer to send it (the origin's
        refusal, or 503 when the origin cannot be asked and no decision is in its TTL)."""
        credential = client_credential(authorization)
        if self.cache.allowed(repo_id, credential):
            return None
        try:
            visibility = self.cache.visibility(repo_id) or await self._ask_visibility(repo_id)
            if visibility.public:
                return None
            if credential is None or authorization is None:
                status, message, code = visibility.refusal
                return hub_error(status, message, code)
            return await self._ask_grant(repo_id, authorization, credential)
        except _Throttled as exc:
            return origin_refusal(exc.answer, "the origin is rate limiting this node; retry later")
        except Unreachable as exc:
            log.warning("origin unreachable for the access check of %s (%s)", self.name(repo_id), exc)
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")

    async def _ask_visibility(self, repo_id: str) -> Visibility:
        """The agent's own anonymous model-info request (fixed URL, no query, no client header)."""
        answer = await self.api.model_info(repo_id)
        if answer.status == 429:
            raise _Throttled(answer)
        visibility = visibility_of(repo_id, answer, self.name)
        self.cache.set_visibility(repo_id, visibility)
        return visibility

    async def _ask_grant(self, repo_id: str, authorization: str, credential: str) -> Response | None:
        """The origin's `auth-check` with the client's own Authorization: 200 grants, nothing else does."""
        answer = await self.api.auth_check(repo_id, authorization)
        status = answer.status
        if status == 429:
            raise _Throttled(answer)
        if status == 200:
            self.cache.grant(repo_id, credential)
            return None
        self.cache.revoke(repo_id, credential)
        if 300 <= status < 400:
            return hub_error(*redirected("auth check", repo_id, status, self.name))
        return origin_refusal(answer, f"the origin refused access to {repo_id}")
