"""Bearer tokens, their roles, and announce passkeys, compared in constant time.

Secrets come from files (the chart mounts a Secret); they are never echoed back, never
logged, and the comparison time does not depend on how much of a guess was right.

Roles (docs/security.md says what each may do to the others):
- agent (--token-file): every node holds it. Metainfo, origin leases, manifests of hub models,
  all reads. It may not write a repo the publisher has published.
- publisher (--publisher-token-file): the operator. Manifests of hub-less models (which mark
  the repo published), all reads; no metainfo, no leases.
- reader (--read-token-file): reads only.
Announce and scrape take none of these: they need the announce passkey.
"""

from __future__ import annotations

import enum

from tracker.announce import query_passkey
from tracker.settings import TrackerSettings
from wirekit.tokens import matches


class Role(enum.Enum):
    AGENT = "agent"
    PUBLISHER = "publisher"
    READER = "reader"

    @property
    def option(self) -> str:
        """The `tracker serve` option whose file holds this role's token."""
        return _OPTIONS[self]


_OPTIONS = {
    Role.AGENT: "--token-file",
    Role.PUBLISHER: "--publisher-token-file",
    Role.READER: "--read-token-file",
}


def role_of(given: bytes | None, settings: TrackerSettings) -> Role | None:
    """The role whose token `given` is; None for a missing or unknown token (-> 401).

    A tracker started with --insecure-no-token and no agent token treats every caller as an
    agent (everything open, as that flag promises); a configured publisher token still selects
    the publisher role, so publishing works the same in development.
    """
    found: Role | None = None
    for role, secret in (
        (Role.AGENT, settings.token),
        (Role.PUBLISHER, settings.publisher_token),
        (Role.READER, settings.read_token),
    ):
        # Every configured secret is compared (settings keeps them distinct): no timing hint.
        if matches(given, secret):
            found = role
    if found is None and settings.token is None and settings.insecure_no_token:
        return Role.AGENT
    return found


def interop_passkey_ok(settings: TrackerSettings, path_passkey: str, raw_query: bytes) -> bool:
    """Whether an announce/scrape carries the interop passkey (a stock client's; never an agent's)."""
    if settings.interop_passkey is None:
        return False
    given = path_passkey.encode("utf-8", "surrogateescape") if path_passkey else query_passkey(raw_query)
    return matches(given, settings.interop_passkey)


def passkey_ok(settings: TrackerSettings, path_passkey: str, raw_query: bytes) -> bool:
    """Whether an announce/scrape carries the announce passkey (in the path, else `?passkey=`).

    True for every request when no passkey is configured (only with --insecure-no-token).
    """
    if settings.announce_passkey is None:
        return True
    given = path_passkey.encode("utf-8", "surrogateescape") if path_passkey else query_passkey(raw_query)
    return matches(given, settings.announce_passkey)
