"""A tar layer of a model artifact (`application/vnd.cncf.model.<kind>.v1.tar`, `…tar+gzip`, `…tar+zstd`)
unpacked into its files, each hashed (sha256) as it is written.

The layer file given here is already checked against its layer digest. Its whole listing is read and
checked before anything is written: only regular files and directories, at paths that stay under the
snapshot (no absolute path, no `..` or empty segment, none twice, no file where another entry needs a
directory); links, devices, FIFOs and sparse files refuse the layer, as do more than `MAX_MEMBERS`
entries or more than `max_bytes` of content. The tar format is read here, not by `tarfile`, so what a
hostile layer can make the agent hold is bounded: a header block, a pax or GNU long-name record of at
most `MAX_RECORD` bytes, one copy buffer. `tar+zstd` needs the `zstandard` package; without it the layer
is refused with a message saying so. Each file is hashed as it is written (sha256, xxh3: what the cache's
sidecar keeps), so it is installed as a blob of the hub cache without a second read (agent.fetch.layers).
"""

from __future__ import annotations

import gzip
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent.cache.layout import safe_relpath
from agent.core.errors import IntegrityError, OriginError
from agent.core.hashing import BlobHasher, BlobHashes

BLOCK = 512
MAX_MEMBERS = 100_000
MAX_RECORD = 64 << 10
"""A pax header or GNU long name: a path and a few numbers; more is not one."""
_COPY = 1 << 20
_FILE, _DIR = frozenset((b"0", b"\0", b"7")), b"5"
_PAX, _GLOBAL_PAX, _LONG_NAME, _LONG_LINK = b"x", b"g", b"L", b"K"


@dataclass(frozen=True)
class Unpacked:
    path: str
    """Its path in the snapshot."""
    written: Path
    """Where its bytes are (`unpack_layer`'s `target_for`)."""
    hashes: BlobHashes
    """Its sha256 (`content_id`), size and xxh3, from the one pass that wrote it."""

    @property
    def sha256(self) -> str:
        return self.hashes.content_id

    @property
    def size(self) -> int:
        return self.hashes.size


@dataclass(frozen=True)
class _Member:
    path: str
    size: int
    is_dir: bool


def compression(media_type: str) -> str:
    """"" (plain tar), "gzip" or "zstd", from a tar layer's media type."""
    for kind in ("gzip", "zstd"):
        if media_type.endswith((f"+{kind}", f".{kind}")) or (kind == "gzip" and media_type.endswith(".gz")):
            return kind
    return ""


def _open(layer_file: Path, media_type: str, what: str) -> IO[bytes]:
    kind = compression(media_type)
    if kind == "gzip":
        unzipped: IO[bytes] = gzip.open(layer_file, "rb")  # type: ignore[assignment]
        return unzipped
    if kind == "zstd":
        try:  # optional: only tar+zstd layers need it, and the image does not ship it
            zstandard: Any = importlib.import_module("zstandard")
        except ImportError:
            raise OriginError(f"{what}: a tar+zstd layer needs the `zstandard` package, which this agent "
                              "does not have; push the files as raw layers (or tar+gzip)") from None
        reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(layer_file.open("rb"), closefd=True)
        return reader
    return layer_file.open("rb")


def _read(stream: IO[bytes], n: int, what: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = stream.read(min(n - len(out), _COPY))
        if not chunk:
            raise IntegrityError(f"{what}: the tar layer ends inside an entry; refused")
        out += chunk
    return bytes(out)


def _number(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256, for sizes of 8 GiB and more
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise IntegrityError(f"{what}: not a tar layer (a header's number is not octal); refused") from None


def _pax(data: bytes, what: str) -> dict[str, str]:
    """pax records, `LEN key=value\\n` each."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        length, sep, _ = data[pos:pos + 20].partition(b" ")
        if not sep or not length.isdigit() or int(length) < 5 or pos + int(length) > len(data):
            raise IntegrityError(f"{what}: a pax header of the tar layer is malformed; refused")
        record = data[pos + len(length) + 1 : pos + int(length) - 1]
        key, eq, value = record.partition(b"=")
        if not eq:
            raise IntegrityError(f"{what}: a pax header of the tar layer is malformed; refused")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += int(length)
    return out


def _members(stream: IO[bytes], what: str) -> Iterator[_Member]:
    """Every entry of the tar stream, checked; the caller reads (or skips) each file's `size` bytes and
    its padding before asking for the next."""
    pax: dict[str, str] = {}
    long_name: str | None = None
    count = 0
    while True:
        head = stream.read(BLOCK)
        if len(head) < BLOCK or head == bytes(BLOCK):
            return  # the end blocks, or a tar cut at an entry's boundary (the digest vouched for it)
        stored = _number(head[148:156], what)
        if stored != sum(head[:148]) + 8 * 32 + sum(head[156:]):
            raise IntegrityError(f"{what}: not a tar layer (a header's checksum is wrong); refused")
        kind, size = head[156:157], _number(head[124:136], what)
        if kind in (_PAX, _GLOBAL_PAX, _LONG_NAME, _LONG_LINK):
            if size > MAX_RECORD:
                raise IntegrityError(f"{what}: a tar header record of {size} bytes (at most {MAX_RECORD}); "
                                     "refused")
            data = _read(stream, _padded(size), what)[:size]
            if kind == _PAX:
                pax = _pax(data, what)
            elif kind == _LONG_NAME:
                long_name = data.rstrip(b"\0").decode("utf-8", "replace")
            elif kind == _GLOBAL_PAX and {"path", "size"} & set(_pax(data, what)):
                raise IntegrityError(f"{what}: a global pax header sets a path or size; refused")
            continue
        count += 1
        if count > MAX_MEMBERS:
            raise IntegrityError(f"{what}: the tar layer has more than {MAX_MEMBERS} entries; refused")
        name = head[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        if head[257:263] == b"ustar\0" and head[345:500].strip(b"\0"):
            name = head[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") + "/" + name
        name = pax.get("path") or long_name or name
        size = int(pax["size"]) if pax.get("size", "").isdigit() else size
        sparse = any(key.startswith("GNU.sparse") for key in pax)
        pax, long_name = {}, None
        shown = name[:200]
        if (kind not in _FILE and kind != _DIR) or sparse:
            what_kind = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
                         b"4": "a block device", b"6": "a FIFO", b"S": "a sparse file"}.get(kind, "an entry")
            raise IntegrityError(f"{what}: the tar layer holds {what_kind} ({shown!r}); only files and "
                                 "directories are unpacked; refused")
        path = name.removeprefix("./").rstrip("/") if kind == _DIR else name.removeprefix("./")
        if kind == _DIR and path in ("", "."):
            continue
        try:
            safe = safe_relpath(path).as_posix()
        except Exception:  # noqa: BLE001 - CacheError or ValueError: the same refusal
            raise IntegrityError(f"{what}: the tar layer names the unsafe path {shown!r}; refused") from None
        yield _Member(safe, 0 if kind == _DIR else size, kind == _DIR)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _skip(stream: IO[bytes], left: int, what: str) -> None:
    while left:
        chunk = stream.read(min(left, _COPY))
        if not chunk:
            raise IntegrityError(f"{what}: the tar layer ends inside an entry; refused")
        left -= len(chunk)


def listing(layer_file: Path, media_type: str, what: str, max_bytes: int) -> list[tuple[str, int]]:
    """The layer's files (path, size), its whole listing checked (module docstring); nothing written."""
    files: dict[str, int] = {}
    dirs: set[str] = set()
    total = 0
    with _open(layer_file, media_type, what) as stream:
        for member in _members(stream, what):
            _skip(stream, _padded(member.size), what)
            if member.is_dir:
                dirs.add(member.path)
                continue
            if member.path in files:
                raise IntegrityError(f"{what}: the tar layer holds {member.path[:200]!r} twice; refused")
            files[member.path] = member.size
            total += member.size
            if total > max_bytes:
                raise IntegrityError(f"{what}: the tar layer unpacks to more than {max_bytes} bytes; refused")
    parents = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    clash = (parents | dirs) & set(files)
    if clash:
        raise IntegrityError(f"{what}: the tar layer has {sorted(clash)[0][:200]!r} as a file and a "
                             "directory; refused")
    return list(files.items())


def unpack_layer(
    layer_file: Path, media_type: str, what: str, max_bytes: int, target_for: Callable[[str], Path | None]
) -> list[Unpacked]:
    """The layer's files, each written to a new file at `target_for(path)` (None: skipped, a file the
    request does not want) and hashed as it is written; IntegrityError, nothing written, when its listing
    is refused. The caller removes what was written if this raises."""
    expected = dict(listing(layer_file, media_type, what, max_bytes))
    out: list[Unpacked] = []
    with _open(layer_file, media_type, what) as stream:
        for member in _members(stream, what):
            listed = not member.is_dir and expected.get(member.path) == member.size
            target = target_for(member.path) if listed else None
            if target is None:
                _skip(stream, _padded(member.size), what)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            hasher = BlobHasher(member.size, is_lfs=True, pieces=False)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                left = member.size
                while left:
                    chunk = stream.read(min(left, _COPY))
                    if not chunk:
                        raise IntegrityError(f"{what}: the tar layer ends inside {member.path[:200]!r}")
                    hasher.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
            _skip(stream, -member.size % BLOCK, what)
            out.append(Unpacked(member.path, target, hasher.finish()))
    return out
