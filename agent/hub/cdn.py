"""Where the test hub sends LFS bytes: signed CDN URLs, as the Hub's 302s point to them.

2026 (`SignedUrls.location`): `{cdn}/xet-bridge-us/{repo key}/{xet hash}?X-Amz-Algorithm=AWS4-HMAC-SHA256&
X-Amz-Credential=...&X-Amz-Date=...&X-Amz-Expires=...&X-Amz-SignedHeaders=host&X-Amz-Signature=...&
response-content-disposition=...&x-id=GetObject`, the shape of an S3 presigned GET (the Hub's bridge URLs
carry `X-Amz-Expires=3600`); the signature is our own HMAC of the path and every other parameter under a
per-process secret. `X-Amz-Date` + `X-Amz-Expires` say when the URL dies; it is checked when a request
starts, so a body that began in time runs to its end.

2024 (`SignedUrls.legacy_location`): `{base}/_cdn/{sha256}?repo=&commit=&file=&expires=&sig=` on the hub's
own port, valid a day.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import math
import time
from collections.abc import Iterable
from typing import Literal
from urllib.parse import quote, urlencode

Check = Literal["ok", "expired", "bad"]

_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_SIGNATURE = "X-Amz-Signature"


def xet_hash(sha256: str) -> str:
    """A stand-in for a file's Xet hash (a Merkle hash over its chunks): 64 hex, derived from the sha256 but
    never equal to it, so a client that takes it (or the CDN's ETag) for the LFS oid fails its checks."""
    return hashlib.sha256(b"xet" + bytes.fromhex(sha256)).hexdigest()


def repo_key(repo_id: str) -> str:
    """24 hex standing in the bridge path where the Hub puts the repo's object id."""
    return hashlib.sha1(repo_id.encode()).hexdigest()[:24]


def cdn_path(repo_id: str, sha256: str) -> str:
    """The CDN path of an LFS blob of `repo_id` (the access log shows it; bench.stack maps it back)."""
    return f"/xet-bridge-us/{repo_key(repo_id)}/{xet_hash(sha256)}"


def redirect_body(status: int, location: str) -> bytes:
    """The body the Hub's Express server gives a redirect: a 307 to a 227-character Location had
    Content-Length 262, exactly `Temporary Redirect. Redirecting to <Location>` (Rapid-MLX#1122)."""
    reason = {302: "Found", 307: "Temporary Redirect"}[status]
    return f"{reason}. Redirecting to {location}".encode()


def content_disposition(filename: str) -> str:
    name = filename.rsplit("/", 1)[-1]
    return f"inline; filename*=UTF-8''{quote(name, safe='')}; filename=\"{quote(name, safe=' ')}\";"


class SignedUrls:
    """Makes and checks the signed CDN URLs of one hub process."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, message: str) -> str:
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    # -- 2026: S3-presign style, on the CDN listener --------------------------------------------------

    def location(self, cdn: str, path: str, filename: str, ttl: float, now: float | None = None) -> str:
        now = time.time() if now is None else now
        # A ttl of 0 or less (tests): a URL born expired, dated in the past with no time to live.
        issued = now if ttl > 0 else now + ttl - 1
        stamp = time.strftime(_AMZ_DATE, time.gmtime(issued))
        params = {
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Content-Sha256": "UNSIGNED-PAYLOAD",
            "X-Amz-Credential": f"weightswarm/{stamp[:8]}/us-east-1/s3/aws4_request",
            "X-Amz-Date": stamp,
            "X-Amz-Expires": str(max(0, math.ceil(ttl))),
            "X-Amz-SignedHeaders": "host",
            "response-content-disposition": content_disposition(filename),
            "x-id": "GetObject",
        }
        params[_SIGNATURE] = self._mac(self._canonical(path, params.items()))
        return f"{cdn}{path}?{urlencode(params)}"

    @staticmethod
    def _canonical(path: str, pairs: Iterable[tuple[str, str]]) -> str:
        return path + "\n" + "&".join(f"{k}={v}" for k, v in sorted(pairs) if k != _SIGNATURE)

    def check(self, path: str, pairs: list[tuple[str, str]], now: float | None = None) -> tuple[Check, int]:
        """("ok" | "expired" | "bad", the second it expires or expired; 0 when unknown)."""
        query = dict(pairs)
        try:
            issued = calendar.timegm(time.strptime(query.get("X-Amz-Date", ""), _AMZ_DATE))
            expires = issued + int(query.get("X-Amz-Expires", ""))
        except ValueError:
            return "bad", 0
        if len(query) != len(pairs):  # a parameter given twice: not what we signed
            return "bad", expires
        want = self._mac(self._canonical(path, pairs))
        if not hmac.compare_digest(want, query.get(_SIGNATURE, "")):
            return "bad", expires
        now = time.time() if now is None else now
        return ("expired" if now > expires else "ok"), expires

    # -- 2024: the hub's own `/_cdn/` route ---------------------------------------------------------

    def _legacy_mac(self, sha256: str, repo_id: str, commit: str, path: str, expires: int) -> str:
        return self._mac(f"{sha256}|{repo_id}|{commit}|{path}|{expires}")

    def legacy_location(
        self, base: str, sha256: str, repo_id: str, commit: str, path: str, ttl: float
    ) -> str:
        expires = int(time.time() + ttl)
        params = {
            "repo": repo_id,
            "commit": commit,
            "file": path,
            "expires": str(expires),
            "sig": self._legacy_mac(sha256, repo_id, commit, path, expires),
        }
        return f"{base}/_cdn/{sha256}?{urlencode(params)}"

    def legacy_valid(self, sha256: str, query: dict[str, str]) -> bool:
        try:
            expires = int(query.get("expires", ""))
        except ValueError:
            return False
        want = self._legacy_mac(
            sha256, query.get("repo", ""), query.get("commit", ""), query.get("file", ""), expires
        )
        return expires >= time.time() and hmac.compare_digest(want, query.get("sig", ""))
