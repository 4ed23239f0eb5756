"""HTTP `Range` headers as the Hub's CDN reads them (RFC 9110, a single byte range)."""

from __future__ import annotations


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(start, end inclusive) for a single `bytes=` range, None to serve it all, "unsatisfiable" for 416.

    Malformed or multi-range headers are ignored (RFC 9110 lets a server answer 200).
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[6:].strip().partition("-")
    if not sep or not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if last != "" and int(last) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, end
