"""A model artifact's layers as the files of a snapshot: CNCF ModelPack (modelpack/model-spec) and generic
ORAS artifacts.

ModelPack layers are typed `application/vnd.cncf.model.<kind>.v1.<format>` (kind: weight,
weight.config, doc, code, dataset; format: raw, tar, tar+gzip, tar+zstd) and name their file in the
`org.cncf.model.filepath` annotation; an ORAS artifact's layer names it in
`org.opencontainers.image.title`. A raw layer is its file, byte for byte: the layer digest is the file's
sha256, the id the Hub's LFS gives the same file, known before the first byte. The config blob
(`application/vnd.cncf.model.config.v1+json`) describes the model and is no file of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent.cache.layout import safe_relpath
from agent.core.errors import IntegrityError, OriginError

FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
MAX_LAYERS = 10_000
_MODEL_LAYER = re.compile(r"^application/vnd\.cncf\.model\.[a-z.]+\.v1\.(raw|tar|tar\+gzip|tar\+zstd)$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_ARCHIVE = re.compile(r"(\.|/)(tar|x-tar)(\+gzip|\+zstd|\.gzip|\.gz|\.zstd)?$")


@dataclass(frozen=True)
class Layer:
    path: str
    """The file's path in the snapshot (checked: no `..`, no absolute path)."""
    sha256: str
    """64 hex: the layer's digest, the file's content id for a raw layer."""
    size: int
    media_type: str
    archive: bool
    """A tar layer (its files are unpacked from it), not one file."""


def layers_of(manifest: dict[str, Any], what: str) -> list[Layer]:
    """Every file-bearing layer of an image manifest; a layer that names no file, an unsafe or repeated
    path, or a digest other than sha256 refuses the whole manifest."""
    raw = manifest.get("layers")
    if not isinstance(raw, list) or not raw:
        raise OriginError(f"{what}: the manifest lists no layers")
    if len(raw) > MAX_LAYERS:
        raise OriginError(f"{what}: the manifest lists more than {MAX_LAYERS} layers")
    out: list[Layer] = []
    seen: set[str] = set()
    for item in raw:
        if not isinstance(item, dict):
            raise OriginError(f"{what}: a manifest layer is not an object")
        out.append(_layer(item, what))
        if out[-1].path in seen:
            raise IntegrityError(f"{what}: two layers name the file {out[-1].path[:200]!r}; refused")
        seen.add(out[-1].path)
    return out


def _layer(item: dict[str, Any], what: str) -> Layer:
    media = str(item.get("mediaType") or "")
    given = item.get("annotations")
    notes: dict[str, Any] = given if isinstance(given, dict) else {}
    path = notes.get(FILEPATH) or notes.get(TITLE)
    digest = _DIGEST.match(str(item.get("digest") or ""))
    size = item.get("size")
    if not isinstance(path, str) or not path:
        raise OriginError(f"{what}: a layer ({media[:80]}) names no file ({FILEPATH} or {TITLE})")
    if digest is None:
        raise IntegrityError(f"{what}: the layer of {path[:200]!r} has no sha256 digest; refused")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise OriginError(f"{what}: the layer of {path[:200]!r} has no size")
    model = _MODEL_LAYER.match(media)
    archive = model.group(1) != "raw" if model else bool(_ARCHIVE.search(media))
    try:
        safe = safe_relpath(path.strip("/") if archive else path)
    except Exception:  # noqa: BLE001 - CacheError or ValueError: the same refusal
        raise IntegrityError(f"{what}: a layer names the unsafe path {path[:200]!r}; refused") from None
    return Layer(str(safe), digest.group(1), size, media, archive)
