"""Request rate limits per client and fixed window, counted and announced as huggingface.co does.

The Hub (huggingface.co/docs/hub/rate-limits, September '25 table) counts requests per 5-minute fixed
window in buckets: "api" (the /api/ routes) and "resolvers" (/resolve/ and /api/resolve-cache/), per IP
address for anonymous clients, per user for a token. Every counted response carries the IETF draft-09
headers (huggingface_hub#3553 shows them on a 200, raullenchai/Rapid-MLX#1122 on a resolve's 307):
`RateLimit: "resolvers";r=<remaining>;t=<seconds to the reset>` and
`RateLimit-Policy: "fixed window";"resolvers";q=<quota>;w=<window>`; over the quota the answer is a 429
with the same headers at r=0, which huggingface_hub's `parse_ratelimit_headers` reads to sleep until the
reset. No reference shows the Hub sending `Retry-After`, so it is off unless asked (`retry_after`).

A window starts at a client's first request in that bucket. Every request counts, refused ones too: in a
fixed window that changes nothing a client can see (it stays refused until the reset either way).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wirekit.tokens import bearer

LIMITED = ("api", "resolvers")
_PRUNE_AT = 10_000  # windows kept before the expired ones are dropped


@dataclass(frozen=True)
class RateLimits:
    """Requests allowed per client and window; the defaults are the Hub's documented free tiers."""

    window: float = 300.0
    """Seconds of one fixed window (the Hub: 5 minutes)."""
    api_anonymous: int = 500
    """API requests per window from one IP address without a token."""
    resolvers_anonymous: int = 3000
    """Resolver requests per window from one IP address without a token."""
    api_user: int = 1000
    """API requests per window with one token (a free user)."""
    resolvers_user: int = 5000
    """Resolver requests per window with one token (a free user)."""
    retry_after: bool = False
    """Also send `Retry-After: <seconds>` on a 429 (as some proxies and mirrors do; the Hub does not)."""

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise ValueError(f"window must be positive seconds: {self.window}")
        quotas = (self.api_anonymous, self.resolvers_anonymous, self.api_user, self.resolvers_user)
        if min(quotas) < 0:
            raise ValueError(f"quotas must not be negative: {quotas}")

    def quota(self, bucket: str, user: bool) -> int:
        if bucket == "api":
            return self.api_user if user else self.api_anonymous
        return self.resolvers_user if user else self.resolvers_anonymous


@dataclass(frozen=True)
class Verdict:
    """One request's place in its window."""

    bucket: str
    quota: int
    remaining: int
    reset: int
    """Whole seconds until the window resets (at least 1 while it runs)."""
    window: int
    allowed: bool
    user: bool

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit": f'"{self.bucket}";r={self.remaining};t={self.reset}',
            "RateLimit-Policy": f'"fixed window";"{self.bucket}";q={self.quota};w={self.window}',
        }


class RateLimiter:
    """Fixed windows per (bucket, client); thread-safe."""

    def __init__(self, limits: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], list[float]] = {}  # key -> [start, count]

    def take(self, bucket: str, client: str, authorization: str | None) -> Verdict | None:
        """Count one request; None for a bucket that is not limited."""
        if bucket not in LIMITED:
            return None
        token = bearer(authorization)
        # Tokens are keyed by a digest, so the table never holds one.
        key = f"user:{hashlib.sha256(token).hexdigest()}" if token else f"ip:{client}"
        quota = self.limits.quota(bucket, token is not None)
        window = self.limits.window
        with self._lock:
            now = self._clock()
            if len(self._windows) > _PRUNE_AT:
                self._windows = {k: w for k, w in self._windows.items() if now < w[0] + window}
            state = self._windows.get((bucket, key))
            if state is None or now >= state[0] + window:
                state = self._windows[(bucket, key)] = [now, 0]
            state[1] += 1
            count, reset = int(state[1]), window - (now - state[0])  # exact for the first request
        return Verdict(
            bucket=bucket,
            quota=quota,
            remaining=max(0, quota - count),
            reset=max(1, math.ceil(reset)),
            window=math.ceil(window),
            allowed=count <= quota,
            user=token is not None,
        )
