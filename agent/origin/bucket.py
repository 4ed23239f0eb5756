"""Object storage as a kind of origin (agent.origin.base `Kind`): a model stored as a directory in the Hugging
Face layout under a bucket prefix, `s3://bucket/prefix` (S3 and S3-compatible stores: MinIO, Ceph RGW,
R2), `gs://bucket/prefix` or `az://container/prefix`.

One library speaks all three: obstore (Rust's `object_store`, as used by DataFusion and Delta Lake).
It lists, reads object metadata and signs URLs with each cloud's own credential chain: environment
variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`), web identity tokens (IRSA, Azure workload identity) and the
instance metadata servers (GKE workload identity, EC2/EKS roles). One SDK per cloud would be three
credential chains to keep and three dependency trees in the image. The bytes come through the same
HTTP engine as a hub's (agent.origin.session; agent.origin.ranges: parallel ranges, resume, hedging,
relay) on a URL signed for that object (`obstore.sign`), renewed when it expires as a Hub's CDN URL is
(agent.origin.location).
Credentials never leave the node: a signed URL goes only to this node's engine and its libtorrent web
seed, and no credential is logged (a signed URL's query string is never printed).

A prefix has no commits, so one is derived (`listing_commit`): the sha1 of every object's key, size,
ETag and version, so a changed object is a new commit. Content ids (sha256) are not in a listing: the
first node to read an object computes it (`FileEntry.content_known`, agent.fetch.bucket), and each
listing entry has a `listing_id` until then. Every ranged read carries `If-Match` with the listed ETag:
an object replaced after the listing fails with a clear error instead of mixing old and new bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import obstore
import obstore.exceptions as obx
import urllib3
from obstore.store import AzureStore, GCSStore, S3Store, from_url

from agent.cache.layout import safe_relpath
from agent.core.errors import (
    AuthError,
    ConfigError,
    IntegrityError,
    NotFoundError,
    OriginError,
    OriginUnavailableError,
)
from agent.core.hashing import etag_parts
from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile, Retryable
from agent.origin.base import Resolved
from agent.origin.bucket_url import split_bucket_url
from agent.origin.session import HttpSession

SIGNED_URL_TTL = timedelta(hours=1)
"""How long a signed URL lives; an engine that outlives it signs again (agent.origin.location)."""
_ACCESS = re.compile(
    r"\b(AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|403 Forbidden|401 Unauthorized)\b"
)
_ENV_PREFIX = {"s3": "AWS", "gs": "GOOGLE", "az": "AZURE"}
"""Each cloud's environment variables (obstore reads `AWS_*`, `GOOGLE_*`, `AZURE_*` as its SDKs do)."""
MAX_OBJECTS = 100_000
"""Most objects under one prefix: a model has tens; more is a wrong prefix (a whole bucket)."""


@dataclass(frozen=True)
class BucketObject:
    path: str
    """Relative to the prefix, checked as a snapshot path (no `..`, no absolute path)."""
    size: int
    etag: str
    """As listed (the commit and listing ids derive from it); compared without quotes (`bare_etag`)."""
    version: str | None


@dataclass(frozen=True)
class Listing:
    commit: str
    objects: dict[str, BucketObject]


def listing_commit(url: str, objects: dict[str, BucketObject]) -> str:
    """A 40-hex commit for this state of the prefix: any changed, added or removed object changes it."""
    h = hashlib.sha1(f"weightswarm bucket listing\n{url}\n".encode())
    for path in sorted(objects):
        o = objects[path]
        h.update(f"{path}\0{o.size}\0{o.etag}\0{o.version or ''}\n".encode())
    return h.hexdigest()


def listing_id(url: str, obj: BucketObject) -> str:
    """A 64-hex id for one object as listed (`FileEntry.content_known` False): the same object listed
    again gets the same id, so its partial download resumes; never a content id."""
    key = f"weightswarm bucket object\n{url}\n{obj.path}\n{obj.size}\n{obj.etag}\n{obj.version or ''}"
    return hashlib.sha256(key.encode()).hexdigest()


class BucketOrigin:
    """One bucket prefix. Listing, metadata and signing through obstore; ranges over HTTP on signed URLs.
    `settings.endpoint` is the bucket URL; the hub token is never sent to a store. Thread-safe."""

    def __init__(self, settings: OriginSettings, max_connections: int = 16) -> None:
        self.http = HttpSession(dataclasses.replace(settings, token=None), max_connections)
        self.endpoint = self.url = self.http.endpoint
        self.scheme, self.bucket, self.prefix = split_bucket_url(self.url)
        store = from_url(
            self.url,
            client_options={
                "connect_timeout": timedelta(seconds=settings.connect_timeout),
                "timeout": timedelta(seconds=max(settings.read_timeout, 30.0)),
                # Client options replace what the environment says of them, so this one is read here.
                "allow_http": os.environ.get(f"{_ENV_PREFIX[self.scheme]}_ALLOW_HTTP", "").lower()
                in ("1", "true"),
            },
        )
        if not isinstance(store, S3Store | GCSStore | AzureStore):
            raise ConfigError(f"{self.url!r}: not an object store obstore can sign URLs for")
        self._store = store
        self._lock = threading.Lock()
        self._listings: dict[str, Listing] = {}
        self._etag_of: dict[str, str] = {}
        """signed URL -> the ETag its ranges must match (If-Match)."""

    def __repr__(self) -> str:
        return f"BucketOrigin({self.url!r})"

    def close(self) -> None:
        self.http.close()

    # --- listing -------------------------------------------------------------------------------------

    def listing(self, what: str) -> Listing:
        """Every object under the prefix now (with this node's credentials: the entitlement check)."""
        objects: dict[str, BucketObject] = {}
        try:
            for batch in obstore.list(self._store, chunk_size=1000):
                for meta in batch:
                    obj = listed_object(meta, what)
                    if obj is not None:
                        objects[obj.path] = obj
                    if len(objects) > MAX_OBJECTS:
                        raise OriginError(f"{what}: more than {MAX_OBJECTS} objects under the prefix")
        except Exception as exc:  # noqa: BLE001 - obstore raises its own classes; mapped in one place
            raise _mapped(exc, what) from None
        if not objects:
            raise NotFoundError(f"{what}: no object under {self.url} (check the bucket and prefix)")
        found = Listing(listing_commit(self.url, objects), objects)
        with self._lock:
            self._listings[found.commit] = found
        return found

    def resolve(self, repo_id: str, revision: str) -> Resolved:
        """The prefix as it is now: `main` (or the commit it derives to) is the only revision. Never public:
        a bucket's readers are whoever its credentials allow, so each node lists it itself."""
        found = self.listing(f"{repo_id} ({self.url})")
        if revision not in ("main", found.commit):
            raise NotFoundError(
                f"{repo_id}@{revision}: a bucket prefix has one revision, main "
                f"(now commit {found.commit[:12]})"
            )
        files = [
            RemoteFile(
                o.path, o.size, listing_id(self.url, o), is_lfs=True, content_known=False,
                content_etag=listed_checksum(self.scheme, o.etag, o.size),
            )
            for o in found.objects.values()
        ]
        return Resolved(found.commit, files)

    def list_files(self, repo_id: str, commit: str, page: str) -> tuple[list[RemoteFile], str | None]:
        raise OriginError(f"{repo_id}: a bucket listing has no further pages")  # `resolve` lists them all

    def has_repo(self, repo_id: str) -> None:
        self.listing(f"{repo_id} ({self.url})")

    # --- one object ------------------------------------------------------------------------------------

    def _listed(self, commit: str, path: str, what: str) -> BucketObject:
        with self._lock:
            found = self._listings.get(commit)
        if found is None:
            found = self.listing(what)
            if found.commit != commit:
                raise IntegrityError(
                    f"{what}: the prefix changed since it was planned (commit {commit[:12]} is gone)"
                )
        obj = found.objects.get(path)
        if obj is None:
            raise NotFoundError(f"{what}: not in the listing of {self.url}")
        return obj

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        """The object's current metadata (HEAD with this node's credentials), checked against the
        listing the plan came from, and a signed URL for its bytes."""
        what = f"{repo_id}/{path}"
        obj = self._listed(commit, path, what)
        key = _key(self.prefix, path)

        try:
            head: dict[str, Any] = dict(obstore.head(self._store, path))
        except Exception as exc:  # noqa: BLE001
            raise _mapped(exc, what) from None
        if head.get("size") != obj.size or not same_etag(str(head.get("e_tag") or ""), obj.etag):
            raise IntegrityError(
                f"{what}: {self.scheme}://{self.bucket}/{key} changed since it was listed (ETag or size); "
                "fetch again to plan the new state"
            )
        return FileMetadata(commit=None, blob_id=None, size=obj.size, url=self._sign(path, obj, what))

    def _sign(self, path: str, obj: BucketObject, what: str) -> str:
        try:
            url = obstore.sign(self._store, "GET", path, SIGNED_URL_TTL)
        except Exception as exc:  # noqa: BLE001
            raise _mapped(exc, what) from None
        with self._lock:
            self._etag_of[url] = obj.etag
        return url

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        what = f"{repo_id}/{path}"
        return self._sign(path, self._listed(commit, path, what), what)

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        with self._lock:
            etag = self._etag_of.get(url)
        headers = {"Range": f"bytes={start}-{end - 1}"}
        if etag:
            headers["If-Match"] = quoted_etag(etag)
        try:
            return self.http.request("GET", url, what, headers)
        except OriginError as exc:
            if "answered 412" in str(exc):
                raise IntegrityError(
                    f"{what}: the object changed since it was listed (its ETag no longer matches); "
                    "nothing of it was kept; fetch again to plan the new state"
                ) from None
            raise


def bare_etag(etag: str) -> str:
    """An ETag without its quotes. The same object's ETag comes in two shapes: Azure's List Blobs gives
    it bare (`0x8D88739958C9830`) and its Get Blob Properties quoted (`"0x8D88739958C9830"`, "if the
    request version is 2011-08-18 or newer, the ETag value will be in quotes"); fake-gcs-server's GCS
    XML listing is bare and its HEAD quoted too; S3 quotes both.
    A weak `W/` one is no object's: it stays as it is, and matches no strong one."""
    etag = etag.strip()
    return etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag


def quoted_etag(etag: str) -> str:
    """The ETag as If-Match takes it (RFC 9110's entity-tag is quoted): a bare listed one in quotes."""
    etag = etag.strip()
    return etag if etag.startswith(('"', "W/")) else f'"{etag}"'


def listed_checksum(scheme: str, etag: str, size: int) -> str | None:
    """An object's ETag when it is a hash of its bytes a receiver can check (agent.core.hashing
    `etag_parts`), else None. S3's ETag of an object written by one PUT is the hex MD5 of its bytes; one
    written in N parts is `<md5 of the parts' md5s>-N`, checkable when the parts are of a common size.
    Azure's (`0x8D…`) is no hash. GCS's XML API gives a non-composite object's MD5. An SSE-KMS or SSE-C
    object's ETag is no MD5 either, yet looks like one: relayed bytes then fail the check, and the node
    takes the object by its sha256 once the reader published it."""
    bare = bare_etag(etag).lower()
    return bare if scheme in ("s3", "gs") and etag_parts(size, bare) is not None else None


def same_etag(a: str, b: str) -> bool:
    """Whether two ETags name the same version of an object, quoted or not (`bare_etag`)."""
    return bare_etag(a) == bare_etag(b)


def _key(prefix: str, path: str) -> str:
    return f"{prefix}/{path}" if prefix else path


def listed_object(meta: Any, what: str) -> BucketObject | None:
    """One listed object, or None for a directory marker; a key that is no safe path refuses the listing."""
    path = str(meta["path"])
    if path.endswith("/") and int(meta["size"]) == 0:
        return None
    try:
        safe_relpath(path)
    except Exception:  # noqa: BLE001 - CacheError or ValueError: the same refusal
        raise IntegrityError(f"{what}: the prefix holds an unsafe key {path[:200]!r}; refused") from None
    return BucketObject(path, int(meta["size"]), str(meta.get("e_tag") or ""), meta.get("version"))


_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")
_CODE = re.compile(r"<Code>([\w.-]{1,64})</Code>|\"code\"\s*:\s*\"?([\w.-]{1,64})")
_MESSAGE = re.compile(r"<Message>([^<]{1,300})</Message>|\"message\"\s*:\s*\"([^\"]{1,300})\"")
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|GOOG)[A-Z0-9]{12,}\b")


def store_reason(text: str, fallback: str) -> str:
    """What a store's error says a person may read: the status, and the body's error code and message
    only. The rest of a body (S3's names the access key id, the string it signed, request ids; a body
    may even begin with the key id) and any URL's query never reach a job error, a pod's status or a log."""
    status = _STATUS.search(text)
    if status is None:  # no answer at all (a refused connection, a timeout): obstore's own words
        first = text.splitlines()[0] if text else fallback
        return _KEY_ID.sub("[key id]", re.sub(r"\?\S*", "", first))[:300]
    parts = [f"HTTP {status.group(1) or status.group(2)}"]
    code, message = _CODE.search(text), _MESSAGE.search(text)
    if code:
        parts.append(code.group(1) or code.group(2))
    out = " ".join(parts)
    if message:
        # Its first line: Azure's goes on with its request id and time on lines of their own.
        said = (message.group(1) or message.group(2)).strip().partition("\n")[0]
        out += f": {said}"
    return _KEY_ID.sub("[key id]", out)


def _mapped(exc: Exception, what: str) -> Exception:
    """obstore's errors as ours: refused credentials, a missing bucket, a passing failure (retried)."""
    text = str(exc)
    first = store_reason(text, type(exc).__name__)
    if isinstance(exc, obx.PermissionDeniedError | obx.UnauthenticatedError) or _ACCESS.search(text):
        return AuthError(f"{what}: the store refused this node's credentials ({first})")
    if isinstance(exc, obx.NotFoundError) or "NoSuchBucket" in text:
        return NotFoundError(f"{what}: {first}")
    if isinstance(exc, obx.InvalidPathError):
        return IntegrityError(f"{what}: the prefix holds a key that is no safe path ({first}); refused")
    if isinstance(exc, obx.GenericError | OSError | TimeoutError):
        return Retryable(OriginUnavailableError(f"{what}: {first}"))
    return OriginError(f"{what}: {first}")
