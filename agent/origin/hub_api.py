"""The origin as the agent's HF-compatible endpoint (agent.http.hf) reaches it for its clients: async, and
with each client's own credential, never the node's.

`ClientApi` is what that endpoint asks of an origin; `HubClientApi` asks it of an HF-compatible hub over
httpx. What the endpoint needs is the Hub's own API (it proxies it to unmodified huggingface_hub
clients), so a kind of origin that has none (object storage) registers no client API in
agent.origin.kinds, and the endpoint then refuses every request in the Hub's error format.

What a request may carry is decided before it gets here: the endpoint checks a client's path and query
(agent.http.hf_paths) and passes the origin-relative path it built from the checked parts; nothing here
adds a client's header other than its Authorization, and no redirect is followed to another host (a
CDN must not see a client's token).

Every method raises `Unreachable` when the origin cannot be asked (a transport error), answers 5xx or
sends more than `OriginSettings.max_json_bytes`:
the endpoint then answers from the node's cache where it may. Any other answer, a refusal or a 429
included, is returned for the endpoint to pass on or to decide by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from agent.core.errors import OriginError
from agent.core.settings import OriginSettings
from agent.origin.answers import Headers, Hop, next_hop

_Query = list[tuple[str, str | int | float | bool | None]]
"""httpx's type of query parameters (a list is invariant: a list of string pairs is not one)."""

MAX_HOPS = 5
"""Same-host redirects a `resolve` HEAD follows at most (the Hub uses one)."""


class Unreachable(Exception):
    """The origin could not be asked (a transport error, or a 5xx answer)."""


@dataclass(frozen=True)
class Answer:
    """One answer of the origin, read whole."""

    status: int
    headers: Headers
    """Looked up case-insensitively (an `httpx.Headers`)."""
    body: bytes


class ClientApi(Protocol):
    """The origin's Hub API, asked on behalf of one client of the HF endpoint; safe to share between
    requests and event loops."""

    endpoint: str
    """The origin's base URL, no trailing slash: what the origin's own `Link` pages name."""

    async def get(self, path: str, params: Sequence[tuple[str, str]], authorization: str | None) -> Answer:
        """`GET {endpoint}{path}` for a client's checked `/api/models/...` request: `path` is
        origin-relative and quoted, `params` only the query parameters the Hub documents for that route,
        `authorization` the client's own header (None: anonymous). Redirects are not followed."""
        ...

    async def resolve_hops(self, path: str, authorization: str | None) -> list[Hop]:
        """The answers to a `resolve` HEAD of `path` (origin-relative and quoted): redirects on the
        origin's own host are followed with the client's Authorization (a small file's 307 to
        `/api/resolve-cache/...`), one to another host is not (an LFS file's 302 to the CDN: its headers
        are the metadata). Ends at the first answer that is not followed, a refusal included;
        OriginError past `MAX_HOPS` redirects or for a redirect without a usable Location."""
        ...

    async def model_info(self, repo_id: str) -> Answer:
        """The agent's own anonymous model info of a checked repo id (`GET /api/models/{repo}`): a fixed
        URL, no query, no client header; what decides whether a repo is public."""
        ...

    async def auth_check(self, repo_id: str, authorization: str) -> Answer:
        """`GET /api/models/{repo}/auth-check` with the client's own Authorization: 200 grants it the
        repo's files."""
        ...


ClientApiFactory = Callable[[OriginSettings], ClientApi]
"""Builds an origin's client API from its settings."""


class HubClientApi:
    """`ClientApi` for an HF-compatible hub: one short-lived httpx client per call (the endpoint's
    routes may run on more than one event loop), the origin settings' timeouts and User-Agent, no
    proxy from the environment, no compression (a body is passed on as it came)."""

    def __init__(self, settings: OriginSettings) -> None:
        self.settings = settings
        self.endpoint = settings.endpoint.rstrip("/")
        self._timeout = httpx.Timeout(settings.read_timeout, connect=settings.connect_timeout)

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, follow_redirects=False, trust_env=False)

    def _headers(self, authorization: str | None) -> dict[str, str]:
        h = {"User-Agent": self.settings.user_agent, "Accept-Encoding": "identity"}
        if authorization:
            h["Authorization"] = authorization
        return h

    async def _get(
        self, path: str, params: Sequence[tuple[str, str]] | None, authorization: str | None
    ) -> Answer:
        query: _Query | None = None if params is None else [*params]
        url, headers = self.endpoint + path, self._headers(authorization)
        cap = self.settings.max_json_bytes
        try:
            async with (
                self._client() as client,
                client.stream("GET", url, params=query, headers=headers) as resp,
            ):
                if resp.status_code >= 500:
                    raise Unreachable(f"HTTP {resp.status_code}")
                length = resp.headers.get("content-length", "")
                if length.strip().isdigit() and int(length) > cap:
                    raise Unreachable(f"an answer of {int(length)} bytes, more than the {cap} allowed")
                parts: list[bytes] = []
                got = 0
                async for data in resp.aiter_raw():
                    got += len(data)
                    if got > cap:  # an endless answer is no answer: it never reaches memory whole
                        raise Unreachable(f"an answer of more than the {cap} bytes allowed")
                    parts.append(data)
        except httpx.TransportError as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from exc
        return Answer(resp.status_code, resp.headers, b"".join(parts))

    async def get(self, path: str, params: Sequence[tuple[str, str]], authorization: str | None) -> Answer:
        return await self._get(path, params, authorization)

    async def model_info(self, repo_id: str) -> Answer:
        return await self._get(f"/api/models/{repo_id}", None, None)

    async def auth_check(self, repo_id: str, authorization: str) -> Answer:
        return await self._get(f"/api/models/{repo_id}/auth-check", None, authorization)

    async def resolve_hops(self, path: str, authorization: str | None) -> list[Hop]:
        url = self.endpoint + path
        hops: list[Hop] = []
        try:
            async with self._client() as client:
                next_url: str | None = url
                while next_url is not None:
                    if len(hops) > MAX_HOPS:
                        raise OriginError(f"the origin redirected {url} more than {MAX_HOPS} times")
                    resp = await client.head(next_url, headers=self._headers(authorization))
                    if resp.status_code >= 500:
                        raise Unreachable(f"HTTP {resp.status_code}")
                    hops.append(Hop(resp.status_code, resp.headers, next_url))
                    next_url = next_hop(hops[-1]) if resp.status_code < 400 else None
        except httpx.TransportError as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from exc
        return hops
