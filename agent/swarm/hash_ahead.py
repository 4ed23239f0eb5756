"""Hashing a blob end to end while libtorrent downloads it (agent.swarm.policy, "Hashing while it arrives").

A blob fetched over BitTorrent is hashed once more against its id (sha256 / git sha1) before any
snapshot points at it: the piece hashes are only as good as the metainfo. Read after the last piece,
that pass was the tail of every download, ~1 CPU-s per GiB after the network was done. So the node
hashes the leading bytes libtorrent has verified and written (`Swarm.written`) while the rest arrives,
and the bands of `SwarmSettings.in_order_bands` make those leading bytes grow during the download.

The bytes hashed here are read from the file, as the final pass reads them; what `finish` returns is
the digest of the file as a whole. Should the file not be the one begun with (another inode), the
hash starts again from its first byte.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.core.hashing import BlobHasher, BlobHashes
from agent.core.plan import FileEntry

_CHUNK = 1024 * 1024
PER_CALL = 256 * 1024 * 1024
"""Most bytes one `advance` hashes: ~0.3 s, so the download loop that calls it stays responsive."""


class HashAhead:
    """The content id and xxh3 of one blob, fed from its file front to back as it is written."""

    def __init__(self, blob: FileEntry, per_call: int = PER_CALL) -> None:
        self._blob = blob
        self._per_call = per_call
        self._hasher = BlobHasher(blob.size, blob.is_lfs, pieces=False)
        self._fd: int | None = None
        self._buf = bytearray(_CHUNK)
        self.early = 0
        """Bytes hashed while the blob arrived, before `finish` (which keeps them when it may)."""

    @property
    def done(self) -> int:
        """Bytes hashed so far."""
        return self._hasher.consumed

    def advance(self, upto: int, path: Path) -> None:
        """Hash the file at `path` up to byte `upto` (bytes libtorrent verified and wrote), at most
        `per_call` bytes more in this call. Nothing when the file does not exist yet."""
        end = min(upto, self._blob.size, self.done + self._per_call)
        if end <= self.done:
            return
        if self._fd is None:
            try:
                self._fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return
        self._read(end)
        self.early = self.done

    def finish(self, path: Path) -> BlobHashes:
        """The digests of the complete file at `path`: the bytes not hashed yet read now."""
        if self._fd is not None:
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if not same:
                self.close()
                self._hasher = BlobHasher(self._blob.size, self._blob.is_lfs, pieces=False)
        if self._fd is None:
            self._fd = os.open(path, os.O_RDONLY)
        try:
            self._read(None)
        finally:
            self.close()
        return self._hasher.finish()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read(self, end: int | None) -> None:
        """Hash from `done` to `end` (None: to the end of the file)."""
        assert self._fd is not None
        view = memoryview(self._buf)
        while end is None or self.done < end:
            want = _CHUNK if end is None else min(_CHUNK, end - self.done)
            n = os.preadv(self._fd, [view[:want]], self.done)
            if n == 0:
                return
            self._hasher.update(view[:n])
