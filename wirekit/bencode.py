"""Bencoding (BEP 3), strict: canonical integers, sorted unique dict keys, bounded depth.

Strictness matters: an info dict's infohash is the sha1 of its exact bytes, so a decoder
that accepted non-canonical input could be fooled into two encodings of one "same" dict.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64


class BencodeError(ValueError):
    """The bytes are not valid (canonical) bencode."""


def bencode(obj: Any) -> bytes:
    """Encode ints, bytes/str (UTF-8), lists/tuples and dicts with str or bytes keys."""
    out: list[bytes] = []
    _encode(obj, out)
    return b"".join(out)


def _encode(obj: Any, out: list[bytes]) -> None:
    if isinstance(obj, bool):
        raise TypeError("bencode has no booleans")
    if isinstance(obj, int):
        out.append(b"i%de" % obj)
    elif isinstance(obj, bytes | bytearray | memoryview):
        data = bytes(obj)
        out.append(b"%d:" % len(data))
        out.append(data)
    elif isinstance(obj, str):
        _encode(obj.encode("utf-8"), out)
    elif isinstance(obj, list | tuple):
        out.append(b"l")
        for item in obj:
            _encode(item, out)
        out.append(b"e")
    elif isinstance(obj, dict):
        items = sorted((k.encode("utf-8") if isinstance(k, str) else bytes(k), v) for k, v in obj.items())
        out.append(b"d")
        for key, value in items:
            _encode(key, out)
            _encode(value, out)
        out.append(b"e")
    else:
        raise TypeError(f"cannot bencode {type(obj).__name__}")


def bdecode(data: bytes) -> Any:
    """Decode one value that spans all of `data`; dict keys and strings stay bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BencodeError("bencode input must be bytes")
    buf = bytes(data)
    value, end = _decode(buf, 0, 0)
    if end != len(buf):
        raise BencodeError(f"trailing data after bencoded value at offset {end}")
    return value


def _decode(buf: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise BencodeError("bencode nested too deeply")
    if pos >= len(buf):
        raise BencodeError("unexpected end of bencoded data")
    lead = buf[pos : pos + 1]
    if lead == b"i":
        end = buf.find(b"e", pos + 1)
        if end < 0:
            raise BencodeError("unterminated integer")
        digits = buf[pos + 1 : end]
        if not _canonical_int(digits):
            raise BencodeError(f"invalid integer {digits[:20]!r}")
        return int(digits), end + 1
    if lead == b"l":
        items: list[Any] = []
        pos += 1
        while buf[pos : pos + 1] != b"e":
            item, pos = _decode(buf, pos, depth + 1)
            items.append(item)
        return items, pos + 1
    if lead == b"d":
        result: dict[bytes, Any] = {}
        pos += 1
        previous: bytes | None = None
        while buf[pos : pos + 1] != b"e":
            if pos >= len(buf):
                raise BencodeError("unterminated dictionary")
            key, pos = _decode(buf, pos, depth + 1)
            if not isinstance(key, bytes):
                raise BencodeError("dictionary key is not a string")
            if previous is not None and key <= previous:
                raise BencodeError("dictionary keys not sorted or not unique")
            previous = key
            result[key], pos = _decode(buf, pos, depth + 1)
        return result, pos + 1
    if lead.isdigit():
        colon = buf.find(b":", pos)
        if colon < 0:
            raise BencodeError("string length without ':'")
        digits = buf[pos:colon]
        if not digits.isdigit() or (len(digits) > 1 and digits[:1] == b"0"):
            raise BencodeError(f"invalid string length {digits[:20]!r}")
        length = int(digits)
        start = colon + 1
        if start + length > len(buf):
            raise BencodeError("string runs past the end of the data")
        return buf[start : start + length], start + length
    raise BencodeError(f"unexpected byte {lead!r} at offset {pos}")


def _canonical_int(digits: bytes) -> bool:
    body = digits[1:] if digits[:1] == b"-" else digits
    if not body.isdigit():
        return False
    if body[:1] == b"0" and (len(body) > 1 or digits[:1] == b"-"):
        return False
    return True
