"""Bearer tokens: read from a request header, compared in constant time."""

from __future__ import annotations

import hmac


def bearer(authorization: bytes | str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not authorization:
        return None
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    scheme, _, token = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


def matches(given: bytes | None, *accepted: str | None) -> bool:
    """True if `given` equals one of the configured secrets (None entries ignored)."""
    if given is None:
        return False
    ok = False
    for secret in accepted:
        if secret is not None:
            # No short-circuit: check every secret so timing reveals nothing about which matched.
            ok |= hmac.compare_digest(given, secret.encode())
    return ok
