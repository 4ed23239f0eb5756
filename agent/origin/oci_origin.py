"""An OCI registry as an origin kind (agent.origin.base `Kind`): the thin adapter over the registry client
(agent.origin.oci). `settings.endpoint` is the `oci://` reference; the hub token is never sent.

A revision is the reference's manifest: its digest is the commit (`commit_of`), its raw layers the files,
each with its digest as content id (known before the first byte, as a Hub model's LFS oids are: the
daemon plans and shares it as a Hub model, leases and relay included). Every request carries this
node's own registry credentials (the docker config); the bytes come through the HTTP engine
(agent.origin.ranges) from the blob URL, a redirect to storage followed per range.
"""

from __future__ import annotations

import dataclasses
import threading

import urllib3

from agent.core.errors import IntegrityError, NotFoundError, OriginError
from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile
from agent.origin.base import Resolved
from agent.origin.oci.auth import Authorizer, credentials_for
from agent.origin.oci.modelpack import Layer, layers_of
from agent.origin.oci.reference import commit_of, parse_oci_url
from agent.origin.oci.registry import Registry, base_url, token_getter
from agent.origin.session import HttpSession


class OciOrigin:
    """One `oci://REGISTRY/REPOSITORY:TAG` (or `@sha256:…`). Thread-safe; each call one attempt (the
    wrapper, agent.origin.client `Origin`, retries)."""

    def __init__(self, settings: OriginSettings, max_connections: int = 16) -> None:
        self.http = HttpSession(dataclasses.replace(settings, token=None), max_connections)
        self.endpoint = self.http.endpoint
        self.ref = parse_oci_url(self.endpoint)
        plain = self.ref.registry in settings.oci_plain_http
        credentials = credentials_for(self.ref.registry, settings.oci_auth_file)

        def send(method: str, url: str, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
            return self.http.send(method, url, f"{self.ref.registry}", headers)

        auth = Authorizer(self.ref.registry, credentials, plain, token_getter(send))
        self.registry = Registry(self.ref, base_url(self.ref, settings.oci_plain_http), send, auth)
        self._lock = threading.Lock()
        self._layers: dict[str, dict[str, Layer]] = {}
        self._digest_of: dict[str, str] = {}
        """blob URL -> its sha256 (`open_range` is handed URLs)."""

    def __repr__(self) -> str:
        return f"OciOrigin({self.ref.url!r})"

    def close(self) -> None:
        self.http.close()

    def _plan(self, what: str) -> tuple[str, dict[str, Layer]]:
        found = self.registry.manifest(self.ref.reference, what)
        commit = commit_of(found.digest)
        layers = {layer.path: layer for layer in layers_of(found.body, what)}
        tars = [p for p, layer in layers.items() if layer.archive]
        if tars:
            raise OriginError(
                f"{what}: tar layers ({tars[0][:100]!r}) are not read yet; push the files as raw layers"
            )
        with self._lock:
            self._layers[commit] = layers
        return commit, layers

    def resolve(self, repo_id: str, revision: str) -> Resolved:
        """The reference's manifest now: the URL's tag (or `main`, or the commit it resolves to). Never
        public: a registry's readers are whoever its credentials allow, so each node reads it itself."""
        commit, layers = self._plan(f"{repo_id} ({self.ref.url})")
        if revision not in ("main", self.ref.revision, commit):
            raise NotFoundError(f"{repo_id}@{revision}: {self.ref.url} resolves to commit {commit[:12]}, "
                                f"its revision is {self.ref.revision}")
        files = [RemoteFile(p, layer.size, layer.sha256, is_lfs=True) for p, layer in layers.items()]
        return Resolved(commit, files)

    def list_files(self, repo_id: str, commit: str, page: str) -> tuple[list[RemoteFile], str | None]:
        raise OriginError(f"{repo_id}: a manifest has no further pages")  # `resolve` lists every layer

    def has_repo(self, repo_id: str) -> None:
        self._plan(f"{repo_id} ({self.ref.url})")

    def _layer(self, commit: str, path: str, what: str) -> Layer:
        with self._lock:
            layers = self._layers.get(commit)
        if layers is None:
            now, layers = self._plan(what)
            if now != commit:
                raise IntegrityError(f"{what}: {self.ref.url} moved since it was planned (commit "
                                     f"{commit[:12]} is no longer its manifest); fetch again")
        layer = layers.get(path)
        if layer is None:
            raise NotFoundError(f"{what}: not a layer of {self.ref.url}")
        return layer

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        """A HEAD of the layer's blob with this node's credentials (its entitlement to the bytes)."""
        what = f"{repo_id}/{path}"
        layer = self._layer(commit, path, what)
        size = self.registry.blob_size("sha256:" + layer.sha256, what)
        if size is not None and size != layer.size:
            raise IntegrityError(f"{what}: the registry's blob is {size} bytes, not {layer.size} as listed")
        # No web seed: a registry's blobs need its credentials, and libtorrent has none.
        return FileMetadata(commit=None, blob_id=None, size=layer.size, url=self._url(layer), web_seed=False)

    def _url(self, layer: Layer) -> str:
        url = self.registry.blob_url("sha256:" + layer.sha256)
        with self._lock:
            self._digest_of[url] = "sha256:" + layer.sha256
        return url

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        return self._url(self._layer(commit, path, f"{repo_id}/{path}"))

    def open_range(self, url: str, start: int, end: int, what: str) -> urllib3.BaseHTTPResponse:
        with self._lock:
            digest = self._digest_of.get(url)
        if digest is None:
            raise OriginError(f"{what}: not a blob URL of {self.ref.url}")
        resp = self.registry.open_blob(digest, start, end, what)
        # The URL that answered, as the Kind contract has it (agent.origin.session), is the blob URL
        # itself: its redirect to storage is followed again per range, and the engine asks for the next
        # range by this URL (urllib3's own `url` is the path alone, which no blob URL here is).
        resp.url = url
        return resp
