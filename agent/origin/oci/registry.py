"""The OCI distribution API for one repository: manifests (an image index picks the artifact), blobs with
Range, and the redirects registries answer blob GETs with (307 to a signed S3/GCS URL), followed without
the registry's credentials. Requests go through a `Send` (the adapter's connection pool, its retries);
a 401 with a challenge is met once (agent.origin.oci.auth) and the request sent again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import urllib3

from agent.core.errors import AuthError, IntegrityError, NotFoundError, OriginError
from agent.origin.answers import raise_for_status
from agent.origin.oci.auth import MAX_TOKEN_BYTES, Authorizer
from agent.origin.oci.reference import OciRef
from agent.origin.session import read_capped, release

Send = Callable[[str, str, dict[str, str]], urllib3.BaseHTTPResponse]
"""method, URL, headers -> the answer unread, redirects not followed; raises the adapter's `Retryable`
for a connection that failed."""

MAX_MANIFEST_BYTES = 4 << 20
"""The distribution spec lets registries refuse manifests over 4 MiB; a model's has a few hundred layers."""
_MAX_REDIRECTS = 5
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class Manifest:
    digest: str
    """`sha256:…` of the manifest's bytes: the snapshot's commit derives from it."""
    body: dict[str, Any]


def base_url(ref: OciRef, plain_http: tuple[str, ...]) -> str:
    """HTTPS always; plain HTTP only for a registry the operator named (`--oci-plain-http HOST:PORT`)."""
    return f"{'http' if ref.registry in plain_http else 'https'}://{ref.registry}"


class Registry:
    """One repository of one registry."""

    def __init__(self, ref: OciRef, base: str, send: Send, auth: Authorizer) -> None:
        self.ref = ref
        self.base = base.rstrip("/")
        self._send = send
        self._auth = auth

    def __repr__(self) -> str:
        return f"Registry({self.ref.registry!r}, {self.ref.repository!r})"

    def _url(self, kind: str, reference: str) -> str:
        return f"{self.base}/v2/{self.ref.repository}/{kind}/{reference}"

    def call(
        self, method: str, url: str, what: str, headers: dict[str, str] | None = None
    ) -> urllib3.BaseHTTPResponse:
        """One request to the registry with its auth (a challenge met once); a 2xx or 3xx, unread, else the
        mapped error."""
        for _ in range(2):
            sent = self._auth.header()
            full = dict(headers or {})
            if sent:
                full["Authorization"] = sent
            resp = self._send(method, url, full)
            if resp.status != 401:
                break
            challenge = resp.headers.get("WWW-Authenticate", "")
            release(resp)
            if not challenge:
                raise AuthError(f"{what}: the registry {self.ref.registry} refused (401) with no challenge")
            self._auth.challenged(challenge, sent, what)
        if resp.status >= 400:
            body = resp.read(4096) if method != "HEAD" else b""
            release(resp)
            if resp.status == 401:
                raise AuthError(f"{what}: the registry {self.ref.registry} refused this node's credentials")
            if resp.status == 403:
                raise AuthError(f"{what}: the registry {self.ref.registry} forbids this node's credentials")
            if resp.status == 404:
                raise NotFoundError(f"{what}: not in {self.ref.registry}/{self.ref.repository}")
            raise_for_status(resp.status, resp.headers, _errors_only(body), what, url, self.base)
        return resp

    # --- manifests ----------------------------------------------------------------------------------

    def manifest(self, reference: str, what: str) -> Manifest:
        """The manifest `reference` (tag or digest) names, its bytes checked against its digest; an image
        index is followed to the model artifact it lists (the one whose artifactType is ModelPack's, else
        its only manifest)."""
        found = self._manifest(reference, what)
        if found.body.get("mediaType") in INDEX_TYPES or "manifests" in found.body:
            found = self._manifest(_pick(found.body, what), what)
            if "manifests" in found.body:
                raise OriginError(f"{what}: an image index lists another index; refused")
        return found

    def _manifest(self, reference: str, what: str) -> Manifest:
        accept = ", ".join((*MANIFEST_TYPES, *INDEX_TYPES))
        resp = self.call("GET", self._url("manifests", reference), what, {"Accept": accept})
        try:
            body = read_capped(resp, MAX_MANIFEST_BYTES, what)
        finally:
            release(resp)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        # The bytes are named by their digest: a pinned one must match, and a tag's answer says its own.
        claimed = reference if reference.startswith("sha256:") else resp.headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise IntegrityError(f"{what}: the manifest's bytes are {digest}, not {claimed[:80]}; refused")
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise OriginError(f"{what}: the registry's manifest is not a JSON object")
        return Manifest(digest, parsed)

    # --- blobs --------------------------------------------------------------------------------------

    def blob_url(self, digest: str) -> str:
        return self._url("blobs", digest)

    def blob_size(self, digest: str, what: str) -> int | None:
        """HEAD of a blob with this node's credentials (the entitlement to its bytes); its size if said."""
        resp = self.call("HEAD", self.blob_url(digest), what)
        release(resp)
        if resp.status in _REDIRECTS:
            return None  # the storage URL says the size; the manifest's stands
        length = resp.headers.get("Content-Length", "")
        return int(length) if length.isdigit() else None

    def open_blob(self, digest: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        """Bytes [start, end) of a blob, unread; a redirect to storage followed with the Range and no
        credential (a signed URL carries its own, and a storage host must not see the registry's)."""
        headers = {"Range": f"bytes={start}-{end - 1}"}
        url = self.blob_url(digest)
        resp = self.call("GET", url, what, headers)
        for _ in range(_MAX_REDIRECTS):
            if resp.status not in _REDIRECTS:
                return resp
            location = resp.headers.get("Location")
            release(resp)
            if not location:
                raise OriginError(f"{what}: the registry redirected with no Location")
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("https", "http"):
                raise OriginError(f"{what}: the registry redirected to a {urlsplit(url).scheme!r} URL")
            resp = self._send("GET", url, headers)
            if resp.status >= 400:
                body = resp.read(4096)
                release(resp)
                raise_for_status(resp.status, resp.headers, _errors_only(body), what, url, self.base)
        raise OriginError(f"{what}: too many redirects from the registry")


def _pick(index: dict[str, Any], what: str) -> str:
    """The digest of the model artifact an image index lists."""
    listed = index.get("manifests") or []
    entries = [m for m in listed if isinstance(m, dict) and isinstance(m.get("digest"), str)]
    models = [m for m in entries if m.get("artifactType") == MODEL_ARTIFACT]
    chosen = models or (entries if len(entries) == 1 else [])
    if len(chosen) != 1:
        raise OriginError(f"{what}: the image index lists {len(entries)} manifests and no single ModelPack "
                          f"artifact ({MODEL_ARTIFACT}); pin one with @sha256:DIGEST")
    return str(chosen[0]["digest"])


def _errors_only(body: bytes) -> bytes:
    """The distribution spec's error codes and messages of a body, nothing else of it."""
    try:
        errors = json.loads(body).get("errors")
        said = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors[:3] if isinstance(e, dict))
    except (ValueError, AttributeError, TypeError):
        return b""
    return said[:200].encode()


def token_getter(send: Send) -> Callable[[str, dict[str, str]], tuple[int, bytes]]:
    """A token service GET over `send`, its answer capped (agent.origin.oci.auth `TokenGet`)."""

    def get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        resp = send("GET", url, {**headers, "Accept": "application/json"})
        try:
            ok = resp.status == 200
            body = read_capped(resp, MAX_TOKEN_BYTES, "the registry's token service") if ok else b""
        finally:
            release(resp)
        return resp.status, body

    return get
