"""One pass over a blob's bytes computes everything we need about it.

- the content id to verify against the origin: sha256 (LFS oid) or the git blob sha1
  (sha1 of b"blob <size>\\0" + content) for small non-LFS files;
- an xxh3-128 digest for the cheap "is this blob still intact" sidecar;
- BitTorrent v1 piece sha1s, so the swarm can publish metainfo without a second read.

The piece sha1s cost about as much CPU as the sha256 (measured ~0.9 core-s/GiB each on the
2-core CI box, xxh3 ~0.02), so a caller that will never publish metainfo (a standalone
`agent fetch` without a tracker) passes `pieces=False`: `BlobHashes.pieces` is then empty and
consumers that need metainfo re-hash (as for blobs huggingface_hub wrote).

hashlib releases the GIL on large buffers, so hashing one blob overlaps with other blobs'
downloads and hashes on other cores.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import xxhash

from agent.core.metainfo import PieceHasher, piece_length_for


@dataclass(frozen=True)
class BlobHashes:
    content_id: str
    size: int
    xxh3: str
    piece_length: int
    pieces: bytes
    """Concatenated piece sha1s; empty when the hasher was made with `pieces=False`."""
    md5: str | None = None
    """Hex MD5 of the bytes, when the hasher was made with `md5=True` (a bucket object's listed check)."""


class BlobHasher:
    def __init__(self, size: int, is_lfs: bool, pieces: bool = True, md5: bool = False) -> None:
        self._content = hashlib.sha256() if is_lfs else hashlib.sha1(b"blob %d\x00" % size)
        self._md5 = hashlib.md5() if md5 else None  # noqa: S324 - the store's checksum, not ours
        self._xxh = xxhash.xxh3_128()
        self.piece_length = piece_length_for(size)
        self._pieces = PieceHasher(self.piece_length) if pieces else None
        self.consumed = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._content.update(data)
        self._xxh.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        if self._pieces is not None:
            self._pieces.update(data)
        self.consumed += memoryview(data).nbytes

    def finish(self) -> BlobHashes:
        return BlobHashes(
            content_id=self._content.hexdigest(),
            size=self.consumed,
            xxh3=self._xxh.hexdigest(),
            piece_length=self.piece_length,
            pieces=self._pieces.digest() if self._pieces is not None else b"",
            md5=self._md5.hexdigest() if self._md5 is not None else None,
        )
