"""Structural checks of safetensors files and their index json, without the safetensors package.

A safetensors file is: 8-byte little-endian header length N, N bytes of JSON
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data.
We check what makes a loader fail late: the header parses, tensor byte ranges tile the data
area contiguously from 0, and the file length is exactly 8 + N + the last offset.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from agent.core.errors import IntegrityError

_MAX_HEADER = 100 * 2**20  # the safetensors crate's own limit


def check_safetensors(path: Path, name: str) -> None:
    """Raise IntegrityError (naming `name`) unless `path` is a structurally valid safetensors file."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise IntegrityError(f"{name}: not a safetensors file (shorter than 8 bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER, size - 8):
            raise IntegrityError(f"{name}: safetensors header length {header_len} exceeds the file")
        raw = fh.read(header_len)
    try:
        header = json.loads(raw)
    except ValueError:
        raise IntegrityError(f"{name}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise IntegrityError(f"{name}: safetensors header is not a JSON object")
    ranges: list[tuple[int, int, str]] = []
    for tensor, spec in header.items():
        if tensor == "__metadata__":
            continue
        offsets = spec.get("data_offsets") if isinstance(spec, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise IntegrityError(f"{name}: tensor {tensor!r} has invalid data_offsets")
        ranges.append((offsets[0], offsets[1], tensor))
    ranges.sort()
    end = 0
    for begin, stop, tensor in ranges:
        if begin != end:
            raise IntegrityError(f"{name}: tensor {tensor!r} starts at {begin}, expected {end} (gap/overlap)")
        end = stop
    if 8 + header_len + end != size:
        raise IntegrityError(f"{name}: file is {size} bytes, header describes {8 + header_len + end}")


def index_shards(path: Path, name: str) -> set[str]:
    """The shard file names an index json (`*.safetensors.index.json`) refers to."""
    try:
        data = json.loads(path.read_bytes())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError
        return {str(v) for v in weight_map.values()}
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{name}: index json has no valid weight_map") from None


def check_index(index_path: Path, index_name: str, present: Iterable[str], known: Iterable[str]) -> None:
    """Every shard of the index must be in the snapshot.

    `present`: repo paths in the snapshot now. `known`: every path the repo has; a shard the
    repo has but the user filtered out (--include/--exclude) is their choice, not corruption.
    """
    folder = index_name.rpartition("/")[0]
    have, repo_has = set(present), set(known)
    for shard in sorted(index_shards(index_path, index_name)):
        rel = f"{folder}/{shard}" if folder else shard
        if rel not in have and rel not in repo_has:
            raise IntegrityError(f"{index_name}: shard {rel} listed in weight_map is not in the repo")
