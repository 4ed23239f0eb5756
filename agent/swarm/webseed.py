"""The origin as a lease holder's web seed (BEP 19): the hosts it may reach, and a URL that outlives its
signature.

A lease holder fetches a blob whose metainfo is known from the origin's download URL: for an LFS file the
signed CDN URL the Hub redirects to, which expires (about an hour on huggingface.co). A download that
outlives it is refused by the CDN, and libtorrent reports that as a `url_seed_alert` whose
`error_message()` is the HTTP status and reason ("403 Forbidden"; web_peer_connection::handle_error in
libtorrent 2.0 and 2.1, whose `error` is then empty). It also marks that web seed as lacking the file, so
nothing more would come from it: the blob stalled, and the origin engine pulled the rest.

`Renewal` watches for such a refusal (400, 401 or 403) and resolves the file again (one metadata request
at the origin), then swaps the torrent's web seed for the new URL (`Swarm.swap_web_seed`: libtorrent's
`remove_url_seed`, `add_url_seed`); the pieces the torrent has stay, and the new URL is asked for the
rest. Bounded as the origin engine's renewal is (agent.origin.location, which the fetch layer's
`WebSeedOrigin` wraps): a URL refused before any byte came from it, right after it was resolved, is a
real refusal, raised as `WebSeedRefused`, and the lease holder falls back as for any failed web seed.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import Protocol
from urllib.parse import urlsplit

from agent.core.errors import SwarmError, WeightswarmError
from agent.swarm.status import BlobStatus, WebSeed

log = logging.getLogger(__name__)

REFUSALS = frozenset({400, 401, 403})
"""HTTP statuses of a signed URL the CDN no longer takes (S3 says 403, or 400 for a malformed expiry)."""
_STATUS = re.compile(r"\s*(\d{3})\b")
_SECRET_HEADERS = ("authorization", "proxy-authorization", "cookie")


def http_status(reason: str) -> int | None:
    """The HTTP status of a web seed failure, from the `url_seed_alert` message libtorrent builds for an
    HTTP error ("<status> <reason>"); None for other failures (a refused connection, a timeout)."""
    match = _STATUS.match(reason)
    return int(match.group(1)) if match else None


def check_credentials(ws: WebSeed, blob_id: str) -> None:
    """Refuse a web seed that carries credentials: libtorrent sends its headers (and the URL's userinfo)
    again to a redirect's target on another host (see agent.swarm.session's module doc)."""
    if "@" in urlsplit(ws.url).netloc or any(k.lower() in _SECRET_HEADERS for k in ws.headers):
        raise SwarmError(
            f"web seed for blob {blob_id} carries credentials (URL or headers); resolve the "
            "origin's redirect first and pass the signed CDN URL without them"
        )


def _addresses_of(host: str) -> frozenset[str]:
    """The addresses `host` resolves to now (none when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return frozenset()
    return frozenset(str(info[4][0]) for info in infos)


class WebSeedHosts:
    """Web seed host names -> their addresses, which the peer gate's IP filter admits (the filter blocks
    every address that is not an agent's, and libtorrent applies it to web seeds too)."""

    def __init__(self) -> None:
        self._hosts: dict[str, frozenset[str]] = {}

    def add(self, url: str) -> bool:
        """Take in the host of `url`; whether it is new (the filter must be built again)."""
        host = urlsplit(url).hostname
        if not host or host in self._hosts:
            return False
        self._hosts[host] = _addresses_of(host)
        return True

    def refresh(self) -> bool:
        """Look the hosts up again (a CDN's addresses change); whether any new address came."""
        changed = False
        for host, known in list(self._hosts.items()):
            addresses = _addresses_of(host)
            if addresses - known:
                self._hosts[host] = known | addresses
                changed = True
        return changed

    def addresses(self) -> frozenset[str]:
        return frozenset().union(*self._hosts.values())


class WebSeedOrigin(Protocol):
    """Where a lease holder's web seed fetches a blob: the origin's current download URL of it, with no
    credentials (agent.fetch.sources.swarm_source builds one around agent.origin.location.FileLocation)."""

    def __call__(self) -> str:
        """The current URL (resolved at the origin on first use)."""
        ...

    def worked(self, url: str) -> None:
        """Bytes came from `url`: a later refusal of it is an expiry."""
        ...

    def refused(self, url: str, reason: str) -> str:
        """The URL to use after `url` was refused (`reason`: "403 Forbidden"); raises a WeightswarmError
        naming the host that refused when `url` was fresh (a real refusal) or no new one can be had."""
        ...


class _Swarm(Protocol):
    def status(self, infohash: str) -> BlobStatus: ...

    def swap_web_seed(self, infohash: str, old: str, new: WebSeed) -> None: ...


class WebSeedRefused(SwarmError):
    """The origin's download host refused the web seed's URL for real (see the module doc)."""


class Renewal:
    """The web seed of one downloading torrent, renewed when its URL is refused (see the module doc).
    `look` is called with each status the lease holder's wait loop reads (one thread)."""

    def __init__(self, swarm: _Swarm, infohash: str, origin: WebSeedOrigin, what: str) -> None:
        self._swarm = swarm
        self._infohash = infohash
        self._origin = origin
        self._what = what
        self.url = origin()
        """The URL the torrent's web seed has now (the one it was started with)."""
        self._retired: set[str] = set()
        self._bytes_at = swarm.status(infohash).bytes_from_web_seeds
        """The torrent's web seed bytes when `url` was put in."""
        self._worked = False
        self._refusals_seen = 0

    def look(self, st: BlobStatus) -> bool:
        """Renew the web seed if `st` shows its URL refused since the last look; whether it was swapped.
        Raises WebSeedRefused for a real refusal."""
        if not self._worked and st.bytes_from_web_seeds > self._bytes_at:
            # Counted as they arrive, so bytes that came before a refusal are in the same status.
            self._worked = True
            self._origin.worked(self.url)
        refusal = st.web_seed_refusal
        if refusal is None or refusal.count == self._refusals_seen:
            return False
        self._refusals_seen = refusal.count
        if refusal.url in self._retired or refusal.status not in REFUSALS:
            return False  # a late word about a URL swapped out already
        try:
            new = self._origin.refused(self.url, refusal.reason)
        except WeightswarmError as exc:
            raise WebSeedRefused(str(exc)) from None
        log.info("%s: web seed URL refused (%s); swapped for a renewed one", self._what, refusal.reason)
        self._swarm.swap_web_seed(self._infohash, self.url, WebSeed(new))
        self._retired.add(self.url)
        self._retired.discard(new)
        self.url, self._bytes_at, self._worked = new, st.bytes_from_web_seeds, False
        return True
