"""What the HF endpoint tells its clients: errors in the Hub's format, and the one filter on what passes
from the origin's answers to a client.

From an origin answer only a short list of headers is passed on (`PASSED_HEADERS`: content type, the
Hub's error code and message, the commit, the request id, and the rate-limit headers a client backs off
by), and `Link` rel="next" pages of `/api/models` listings, pointed at the endpoint.

Nothing Xet goes out, on any route (`for_client`, applied to every answer of the HF router): no
`X-Xet-*` header, no `Link` with a `xet-*` rel, no `xetHash` in a listing, no Xet token route. A
huggingface_hub with hf_xet that sees any of them downloads from the Xet CAS hosts with its own token,
past the node: nothing would be shared, and the origin's egress would be one copy per client again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from fastapi import Response
from fastapi.responses import JSONResponse

from agent.origin.hub_api import Answer

PASSED_HEADERS = frozenset(
    {
        "content-type",
        "x-error-code",
        "x-error-message",
        "x-repo-commit",
        "x-request-id",
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
    }
)
REFUSAL_HEADERS = frozenset({"x-request-id", "retry-after", "ratelimit", "ratelimit-policy"})
"""What a refusal of the agent's own access request passes on: the rate-limit headers of a 429 make the
client back off (huggingface_hub waits for `RateLimit` t= or `Retry-After`)."""

XET_ROUTES = frozenset({"xet-read-token", "xet-write-token"})
"""`/api/models/{repo}/{route}/{rev}`: the Hub's answers carry a CAS URL and access token."""

_LINK_ENTRY = re.compile(r"<[^>]*>[^,<]*")
_XET_REL = re.compile(r"""\brel\s*=\s*"?[^";,]*\bxet-""", re.IGNORECASE)
_XET_HASH = "xetHash"


def hub_error(
    status: int,
    message: str,
    code: str | None = None,
    commit: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error as the Hub sends it, so huggingface_hub raises its usual exception class."""
    h = {"X-Error-Message": "".join(c if " " <= c <= "~" else "?" for c in message), **(headers or {})}
    if code:
        h["X-Error-Code"] = code
    if commit:
        h["X-Repo-Commit"] = commit
    return JSONResponse({"error": message}, status_code=status, headers=h)


def passed(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of an origin answer that a client may see when the answer is passed on."""
    return {k: v for k, v in headers.items() if k.lower() in PASSED_HEADERS}


def origin_refusal(answer: Answer, fallback: str) -> JSONResponse:
    """The origin's refusal of a request, in the Hub's format (its status, code, message, and the
    rate-limit headers of a 429)."""
    h = answer.headers
    kept = {k: v for k, v in h.items() if k.lower() in REFUSAL_HEADERS}
    message = h.get("x-error-message") or fallback
    return hub_error(answer.status, message, h.get("x-error-code"), headers=kept)


def without_xet_links(link: str) -> str:
    """A `Link` header's entries other than Xet's (`xet-auth`, `xet-reconstruction-info`, ...)."""
    return ", ".join(e.strip() for e in _LINK_ENTRY.findall(link) if not _XET_REL.search(e))


def without_xet_hashes(body: bytes) -> bytes:
    """A JSON answer without its `xetHash` fields (tree listings have one per file: huggingface_hub's
    snapshot_download caches the listing and downloads such files from Xet without asking `resolve`)."""
    if _XET_HASH.encode() not in body:
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    return json.dumps(_strip(doc)).encode()


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k != _XET_HASH}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def for_client(resp: Response) -> Response:
    """The answer as it goes to the client: whatever built it, no Xet header or link leaves."""
    headers = resp.headers
    for name in {k for k in headers if k.lower().startswith("x-xet-")}:
        del headers[name]
    link = headers.get("link")
    if link is not None:
        kept = without_xet_links(link)
        del headers["link"]
        if kept:
            headers["Link"] = kept
    return resp
