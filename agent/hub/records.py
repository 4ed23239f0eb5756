"""What the test hub saw: one record per request, and the kind of request the Hub counts it as."""

from __future__ import annotations

from typing import NamedTuple

BUCKETS = ("api", "resolvers", "cdn")
"""The kinds `HubServer.counts()` always reports: the Hub's two rate-limited buckets and the CDN's bytes."""


class RequestRecord(NamedTuple):
    """One request as the server saw it (path without the query string, which is `query`)."""

    method: str
    path: str
    range: str | None
    status: int
    query: str = ""
    authorized: bool = False
    """Whether it carried an Authorization header (never the header itself)."""
    client: str = ""
    """The client's address."""
    bucket: str = ""
    """"api", "resolvers" (the Hub's rate-limit buckets), "cdn" (signed LFS URLs, not counted by the Hub),
    "pages" (anything else on the main port: the Hub's web pages; none is served here) or "" (internal)."""


def bucket_for(path: str, cdn: bool) -> str:
    """The bucket of a request for `path` (no query string); `cdn`: it came to the CDN listener.

    As huggingface.co/docs/hub/rate-limits: every URL with a `/resolve/` segment and the "Resolve a
    file" endpoint (`/api/resolve-cache/...`) are resolvers, the other `/api/` routes are the API."""
    if cdn or path.startswith("/_cdn/"):
        return "cdn"
    if path.startswith("/_weightswarm/"):
        return ""
    if path.startswith("/api/resolve-cache/"):
        return "resolvers"
    if path.startswith("/api/"):
        return "api"
    parts = path.split("/")[1:]
    if len(parts) >= 5 and parts[2] == "resolve":
        return "resolvers"
    return "pages"
