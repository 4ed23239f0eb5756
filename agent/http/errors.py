"""One mapping from the agent's errors to HTTP statuses, for every route of the local API.

(The HF-compatible endpoint answers in the Hub's own error format instead: `agent.http.hf_answers.hub_error`.)
"""

from __future__ import annotations

from fastapi import HTTPException

from agent.core.errors import (
    AuthError,
    BusyError,
    CacheFullError,
    ConfigError,
    DiskSpaceError,
    NotFoundError,
    RateLimitedError,
    RefusedError,
    WeightswarmError,
)

_STATUS: tuple[tuple[type[WeightswarmError], int], ...] = (
    (NotFoundError, 404),
    (AuthError, 403),
    (RateLimitedError, 429),
    (BusyError, 429),
    (RefusedError, 403),
    (CacheFullError, 507),
    (DiskSpaceError, 507),
    (ConfigError, 400),
)
"""Most specific first; anything else the request asked for and cannot be done is a 400."""


def http_error(exc: WeightswarmError) -> HTTPException:
    """The HTTP answer for an expected failure: its status and its one-line message."""
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 400)
    return HTTPException(status, str(exc))
