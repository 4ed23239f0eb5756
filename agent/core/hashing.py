"""One pass over a blob's bytes computes everything we need about it.

- the content id to verify against the origin: sha256 (LFS oid) or the git blob sha1
  (sha1 of b"blob <size>\\0" + content) for small non-LFS files;
- an xxh3-128 digest for the cheap "is this blob still intact" sidecar;
- BitTorrent v1 piece sha1s, so the swarm can publish metainfo without a second read.

The piece sha1s cost about as much CPU as the sha256 and xxh3 next to nothing (benchmarks.md,
"Hashing a blob"), so a caller that will never publish metainfo (a standalone
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
    etags: tuple[str, ...] = ()
    """The S3 ETags these bytes would have, when the hasher was made with `etag` (`EtagHasher`)."""


class BlobHasher:
    def __init__(self, size: int, is_lfs: bool, pieces: bool = True, etag: str | None = None) -> None:
        self._content = hashlib.sha256() if is_lfs else hashlib.sha1(b"blob %d\x00" % size)
        self._etag = EtagHasher(size, etag) if etag else None
        self._xxh = xxhash.xxh3_128()
        self.piece_length = piece_length_for(size)
        self._pieces = PieceHasher(self.piece_length) if pieces else None
        self.consumed = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._content.update(data)
        self._xxh.update(data)
        if self._etag is not None:
            self._etag.update(data)
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
            etags=self._etag.etags() if self._etag is not None else (),
        )


PART_SIZES = (5 << 20, 8 << 20, 16 << 20, 50 << 20, 64 << 20, 100 << 20)
"""Part sizes of common S3 uploaders' multipart uploads: rclone 5 MiB, boto3 and the AWS CLI 8 MiB
(`multipart_chunksize`), s5cmd 50 MiB; 16, 64 and 100 MiB as people set them."""


def etag_parts(size: int, etag: str) -> list[int] | None:
    """The part sizes an S3 ETag of an object of `size` bytes can be checked with: [0] for one PUT's (the
    MD5 of the bytes), the common sizes that cut `size` into as many parts as a multipart ETag's `-N`
    says; None when it is neither (no content hash, or parts of a size no common uploader uses)."""
    head, _, count = etag.partition("-")
    if len(head) != 32 or any(c not in "0123456789abcdef" for c in head):
        return None
    if not count:
        return [0]
    if not count.isdigit() or int(count) < 1:
        return None
    n = int(count)
    sizes = [p for p in PART_SIZES if -(-size // p) == n] if n > 1 else [max(size, 1)]
    return sizes or None


class EtagHasher:
    """S3's ETag of bytes as they were uploaded: the MD5 of one PUT's, or for N parts
    `md5(md5(part 1) || ... || md5(part N))-N`, for each part size `etag_parts` allows (one is a few)."""

    def __init__(self, size: int, etag: str) -> None:
        self._runs = [_PartRun(p) for p in etag_parts(size, etag) or []]
        self._multipart = "-" in etag

    def update(self, data: bytes | bytearray | memoryview) -> None:
        for run in self._runs:
            run.update(memoryview(data))

    def etags(self) -> tuple[str, ...]:
        return tuple(run.etag(self._multipart) for run in self._runs)


class _PartRun:
    def __init__(self, part: int) -> None:
        self.part = part
        """Bytes a part; 0: one part, however long."""
        self.md5 = hashlib.md5()  # noqa: S324 - the store's checksum, checked for second preimages only
        self.filled = 0
        self.digests: list[bytes] = []

    def update(self, view: memoryview) -> None:
        while view.nbytes:
            take = view.nbytes if not self.part else min(view.nbytes, self.part - self.filled)
            self.md5.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.part and self.filled == self.part:
                self.digests.append(self.md5.digest())
                self.md5, self.filled = hashlib.md5(), 0  # noqa: S324

    def etag(self, multipart: bool) -> str:
        if not multipart:
            return self.md5.hexdigest()
        digests = self.digests + ([self.md5.digest()] if self.filled or not self.digests else [])
        return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"  # noqa: S324
