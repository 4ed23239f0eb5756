"""Validation of a published blob's info dict (single-file torrent, BEP 3).

The info dict decides what every peer will accept as the blob's bytes, so the tracker
keeps only dicts that are canonical bencode (one byte string per dict, so one infohash),
name the blob they are published for, and have a piece table that matches the length.
"""

from __future__ import annotations

import hashlib
import re

from tracker.errors import ValidationError
from wirekit.bencode import BencodeError, bdecode, bencode

MIN_PIECE = 16 * 1024
MAX_PIECE = 64 * 1024 * 1024
BLOB_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
INFOHASH = re.compile(r"^[0-9a-f]{40}$")


def check_blob_id(blob_id: str) -> str:
    if not BLOB_ID.match(blob_id):
        raise ValidationError("blob id must be 40 (git sha1) or 64 (sha256) lowercase hex characters")
    return blob_id


def validate_info(blob_id: str, body: bytes, expected_infohash: str | None = None) -> str:
    """Return the infohash (hex) of `body` if it is an acceptable info dict for `blob_id`."""
    check_blob_id(blob_id)
    try:
        info = bdecode(body)
    except BencodeError as exc:
        raise ValidationError(f"info dict is not valid canonical bencode: {exc}") from None
    if not isinstance(info, dict):
        raise ValidationError("info dict must be a bencoded dictionary")
    if bencode(info) != body:
        raise ValidationError("info dict is not canonical bencode")
    if b"files" in info:
        raise ValidationError("multi-file torrents are not accepted: one torrent per blob")
    if info.get(b"name") != blob_id.encode():
        raise ValidationError("info dict 'name' must equal the blob id")
    length = info.get(b"length")
    if not isinstance(length, int) or length < 1:
        raise ValidationError("info dict 'length' must be a positive integer")
    piece_length = info.get(b"piece length")
    if (
        not isinstance(piece_length, int)
        or not MIN_PIECE <= piece_length <= MAX_PIECE
        or piece_length & (piece_length - 1)
    ):
        raise ValidationError("info dict 'piece length' must be a power of two from 16 KiB to 64 MiB")
    pieces = info.get(b"pieces")
    expected = -(-length // piece_length) * 20
    if not isinstance(pieces, bytes) or len(pieces) != expected:
        got = len(pieces) if isinstance(pieces, bytes) else "no"
        raise ValidationError(f"info dict 'pieces' must be {expected} bytes for this length, got {got}")
    infohash = hashlib.sha1(body).hexdigest()
    if expected_infohash is not None and expected_infohash.lower() != infohash:
        raise ValidationError(f"infohash mismatch: the info dict hashes to {infohash}")
    return infohash
