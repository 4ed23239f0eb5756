"""Push a model to an OCI registry as a CNCF ModelPack artifact of raw layers, by the OCI distribution
API by hand: an independent client of the registry, not the agent's (which only reads).

Shared by the registry benchmark (bench/registry.py) and the tests' registries (tests.support.ocikit), as
bench.redis_server is: the product never pushes, so this stays out of agent/. Stdlib and urllib3 only, so
it runs as a script inside a benchmark's namespace:

    python bench/oci_push.py http://10.213.0.2:8080 models/m v1 DIR   # every file under DIR, one layer each

A blob is one monolithic upload (POST, then PUT with `?digest=`), streamed from its file; then the manifest.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
RAW_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
RAW_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
_CHUNK = 1 << 20


class PushError(RuntimeError):
    """The registry refused a request (its status and the first bytes of its answer)."""


@dataclass
class Pusher:
    """An OCI API client: pushes blobs and manifests with an Authorization header ("" for none)."""

    base: str
    authorization: str = ""
    timeout: float = 600.0

    def _request(self, method: str, url: str, body: Any = b"", headers: dict[str, str] | None = None
                 ) -> urllib3.BaseHTTPResponse:
        sent = {**({"Authorization": self.authorization} if self.authorization else {}), **(headers or {})}
        resp = urllib3.request(method, url, body=body, headers=sent, redirect=False, retries=False,
                               timeout=self.timeout)
        if resp.status >= 400:
            raise PushError(f"{method} {url.split('?')[0]}: {resp.status} {resp.data[:300]!r}")
        return resp

    def blob(self, repo: str, data: bytes | Path) -> str:
        """Upload `data` (bytes, or a file streamed from disk: a shard need not fit in memory); its digest."""
        if isinstance(data, Path):
            h = hashlib.sha256()
            with data.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            digest, size = "sha256:" + h.hexdigest(), data.stat().st_size
        else:
            digest, size = "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
        start = self._request("POST", f"{self.base}/v2/{repo}/blobs/uploads/")
        location = start.headers["Location"]
        url = location if location.startswith("http") else self.base + location
        sep = "&" if "?" in url else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(data, Path):
            with data.open("rb") as body:
                self._request("PUT", f"{url}{sep}digest={digest}", body, headers)
        else:
            self._request("PUT", f"{url}{sep}digest={digest}", data, headers)
        return digest

    def manifest(self, repo: str, tag: str, manifest: dict[str, Any]) -> str:
        body = json.dumps(manifest).encode()
        self._request("PUT", f"{self.base}/v2/{repo}/manifests/{tag}", body,
                      {"Content-Type": manifest["mediaType"]})
        return "sha256:" + hashlib.sha256(body).hexdigest()


def push_artifact(pusher: Pusher, repo: str, tag: str, layers: list[tuple[str, bytes | Path, str]]) -> str:
    """A ModelPack artifact of the given layers (media type, bytes or a file, `org.cncf.model.filepath`);
    the manifest's digest."""
    config = json.dumps({"descriptor": {"name": repo}, "modelfs": {"type": "layers", "diffIds": []},
                         "config": {}}).encode()
    config_digest = pusher.blob(repo, config)
    listed = []
    for media, data, path in layers:
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        listed.append({"mediaType": media, "digest": pusher.blob(repo, data), "size": size,
                       "annotations": {"org.cncf.model.filepath": path}})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "artifactType": MODEL_ARTIFACT,
                "config": {"mediaType": MODEL_CONFIG, "digest": config_digest, "size": len(config)},
                "layers": listed}
    return pusher.manifest(repo, tag, manifest)


def push_model(pusher: Pusher, repo: str, tag: str, files: Mapping[str, bytes | Path]) -> str:
    """A ModelPack artifact of raw layers, one per file ({repo path: bytes or a file}; `*.safetensors`
    weights, the rest config files); the manifest's digest."""
    layers = [(RAW_WEIGHT if path.endswith(".safetensors") else RAW_CONFIG, data, path)
              for path, data in files.items()]
    return push_artifact(pusher, repo, tag, layers)


def push_directory(base: str, repo: str, tag: str, root: Path) -> tuple[str, int, int]:
    """Every file under `root` as one layer at its relative path: (manifest digest, files, bytes)."""
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    digest = push_model(Pusher(base), repo, tag, files)
    return digest, len(files), sum(p.stat().st_size for p in files.values())


if __name__ == "__main__":
    try:
        pushed = push_directory(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    except (PushError, urllib3.exceptions.HTTPError, OSError) as e:
        sys.exit(f"push failed: {e}")
    print(*pushed)
