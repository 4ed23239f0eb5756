"""Where one file's bytes are: the origin's download URL, renewed when its signature expires.

The Hub redirects an LFS file to a signed CDN URL that lives about an hour (S3's `X-Amz-Expires=3600`,
CloudFront's `Expires`); a download that outlives it is refused (403, or 400) by the CDN. Resolving the
file again mints a new URL, and each range goes on where it stopped. Bounded: a URL refused right after a
fresh resolve (before any byte came from it, and within `FRESH` seconds) is a real refusal, raised as it
came; so a node whose access was withdrawn gets its error instead of resolving in a loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.origin.answers import CdnRefusedError

log = logging.getLogger(__name__)

FRESH = 60.0
"""Seconds after a resolve during which a refusal of the URL it gave is taken as final (unless bytes came)."""


class FileLocation:
    """The current download URL of one file; thread-safe. `resolve()` gives a fresh URL (a metadata HEAD:
    one resolve at the origin); it is called on first use and on each renewal."""

    def __init__(self, resolve: Callable[[], str], url: str = "", what: str = "") -> None:
        self._resolve = resolve
        self._what = what
        self._lock = threading.Lock()
        self._url = url
        self._minted = time.monotonic()
        self._worked = False

    @property
    def url(self) -> str:
        with self._lock:
            if not self._url:
                self._url = self._resolve()
                self._minted, self._worked = time.monotonic(), False
            return self._url

    def worked(self, url: str) -> None:
        """Bytes came from `url`: a later refusal of it is an expiry, not a refusal."""
        with self._lock:
            if url == self._url:
                self._worked = True

    def moved(self, url: str, target: str) -> None:
        """`url` redirected to `target` on the same host (a small file's resolve-cache URL): ask there."""
        with self._lock:
            if url == self._url and target:
                self._url = target

    def refused(self, url: str, error: CdnRefusedError) -> str:
        """The URL to use after `url` was refused: the one another thread renewed meanwhile, or a new one;
        raises `error` when `url` was fresh (see the module doc)."""
        with self._lock:
            if url != self._url:
                return self._url
            if not self._worked and time.monotonic() - self._minted < FRESH:
                raise error
            log.info("%s: %s refused its download URL (expired?); resolving again", self._what, error.host)
            self._url = self._resolve()
            self._minted, self._worked = time.monotonic(), False
            return self._url
