"""BitTorrent v1 piece hashing for one blob (one torrent per blob; the torrent name is the blob id).

The fetch engine feeds every blob through a `PieceHasher` while it streams from the origin, so
the swarm can publish the metainfo without reading the blob a second time.
"""

from __future__ import annotations

import hashlib

from wirekit.bencode import bdecode, bencode

MIN_PIECE_LENGTH = 256 * 1024
MAX_PIECE_LENGTH = 16 * 1024 * 1024
_MAX_PIECES = 2000
_LARGE_BLOB = 1024**3


def piece_length_for(size: int) -> int:
    """A power of two in [256 KiB, 16 MiB]: at most ~2000 pieces; 16 MiB from 1 GiB up.

    Multi-GB shards get 16 MiB pieces, a whole number of the origin engine's range chunks (4 MiB by
    default), and a 5 GB shard has ~300 pieces, not thousands (libtorrent's per-piece costs).
    Smaller blobs keep the metainfo under ~40 KB of hashes while pieces stay small enough to share.
    """
    if size < 0:
        raise ValueError(f"blob size must be >= 0: {size}")
    if size >= _LARGE_BLOB:
        return MAX_PIECE_LENGTH
    length = MIN_PIECE_LENGTH
    while length < MAX_PIECE_LENGTH and size > length * _MAX_PIECES:
        length *= 2
    return length


class PieceHasher:
    """Incremental sha1 per piece over a stream fed in order; the last piece may be short."""

    def __init__(self, piece_length: int) -> None:
        if piece_length <= 0 or piece_length & (piece_length - 1):
            raise ValueError(f"piece length must be a positive power of two: {piece_length}")
        self.piece_length = piece_length
        self._pieces: list[bytes] = []
        self._current = hashlib.sha1()
        self._filled = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            take = min(self.piece_length - self._filled, view.nbytes)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.piece_length:
                self._pieces.append(self._current.digest())
                self._current = hashlib.sha1()
                self._filled = 0

    def digest(self) -> bytes:
        """Concatenated 20-byte sha1s of every piece so far, including a short last piece."""
        tail = [self._current.digest()] if self._filled else []
        return b"".join(self._pieces + tail)


def info_dict(name: str, length: int, piece_length: int, pieces: bytes) -> dict[str, object]:
    """A single-file BitTorrent v1 info dict."""
    if len(pieces) % 20:
        raise ValueError("pieces must be a concatenation of 20-byte sha1 digests")
    expected = -(-length // piece_length)
    if len(pieces) // 20 != expected:
        raise ValueError(f"{len(pieces) // 20} piece hashes for {expected} pieces of {length} bytes")
    return {"name": name, "length": length, "piece length": piece_length, "pieces": pieces}


def encoded_info(blob_id: str, size: int, piece_length: int, pieces: bytes) -> bytes:
    """A blob's bencoded info dict: what libtorrent, the tracker and every node agree on. Built here only."""
    return bencode(info_dict(blob_id, size, piece_length, pieces))


def infohash(info: bytes | dict[str, object]) -> str:
    """Hex sha1 of the bencoded info dict (given encoded or as a dict): the torrent's v1 infohash."""
    return hashlib.sha1(info if isinstance(info, bytes) else bencode(info)).hexdigest()


def listed_pieces(info: bytes, blob_id: str, size: int) -> bytes | None:
    """The piece sha1s of `info` when it is exactly the metainfo this node would build for the blob
    (`encoded_info` at `piece_length_for`), so a copy seeded with them joins the same torrent; else None.
    Whether they match the blob's bytes is another matter: libtorrent checks each piece it serves."""
    try:
        d = bdecode(info)
    except ValueError:
        return None
    pieces = d.get(b"pieces") if isinstance(d, dict) else None
    if not isinstance(pieces, bytes):
        return None
    try:
        return pieces if encoded_info(blob_id, size, piece_length_for(size), pieces) == info else None
    except ValueError:  # a count of hashes that does not fit the size
        return None
