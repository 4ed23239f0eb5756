"""Deterministic test models in the layout the hub serves (`root/<org>/<name>/`).

The safetensors shards are valid (the `safetensors` package loads them); tensor contents are
pseudo-random bytes derived from (seed, file, tensor), so two calls with the same arguments
write identical files and the same seed in two repos gives identical (deduplicable) shards.
Every file is written to `*.incomplete` and renamed into place, so a hub scanning the
directory never lists a half-written file.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
from pathlib import Path

from agent.hub.repos import INCOMPLETE_SUFFIX, valid_repo_id

DTYPE_SIZES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
"""safetensors dtype names and their element sizes in bytes."""

TENSOR_BYTES = 4 * 2**20
"""Aim for tensors of about this size, so a shard holds several (as real checkpoints do)."""

_WRITE_CHUNK = 2**20
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """`"64MiB"` -> 67108864; accepts B, k/M/G/T (decimal) and KiB/MiB/GiB/TiB (binary), or a plain number."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 64MiB, 2GB)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    base = unit[:1] if unit[:1] != "b" else ""
    factor = 1024 ** " kmgt".index(base) if "i" in unit else _UNITS[base]
    return int(number * factor)


def _shard_names(shards: int) -> list[str]:
    if shards == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + INCOMPLETE_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _split(total: int, parts: int, unit: int) -> list[int]:
    """`total` bytes in `parts` pieces, each a multiple of `unit`, as even as possible."""
    elements = total // unit
    base, extra = divmod(elements, parts)
    return [(base + (1 if i < extra else 0)) * unit for i in range(parts)]


def _write_shard(path: Path, tensors: list[tuple[str, int]], dtype: str, seed: int) -> None:
    """One safetensors file: 8-byte header length, JSON header (space-padded to 8), contiguous data."""
    elem = DTYPE_SIZES[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": [nbytes // elem], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + INCOMPLETE_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for name, nbytes in tensors:
                rng = random.Random(f"{seed}/{path.name}/{name}")
                left = nbytes
                while left:
                    n = min(_WRITE_CHUNK, left)
                    f.write(rng.randbytes(n))
                    left -= n
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def make_model(
    root: Path, repo_id: str, *, total_bytes: int, shards: int, seed: int = 0, dtype: str = "F16"
) -> list[Path]:
    """Write a test model to `root/<org>/<name>/` and return the paths written.

    `total_bytes` is the tensor data (rounded down to whole elements); each shard adds a small
    JSON header. `shards=1` writes `model.safetensors` without an index, as the Hub's small models.
    """
    if not valid_repo_id(repo_id):
        raise ValueError(f"not a repo id (org/name): {repo_id!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1: {shards}")
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_SIZES)}")
    elem = DTYPE_SIZES[dtype]
    if total_bytes < shards * elem:
        raise ValueError(f"total_bytes {total_bytes} too small for {shards} shards of {dtype}")
    repo_dir = Path(root) / repo_id
    repo_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    layer = 0
    for name, shard_bytes in zip(_shard_names(shards), _split(total_bytes, shards, elem), strict=True):
        count = max(1, -(-shard_bytes // TENSOR_BYTES))
        tensors = []
        for nbytes in _split(shard_bytes, count, elem):
            if nbytes:
                tensors.append((f"model.layers.{layer}.weight", nbytes))
                weight_map[f"model.layers.{layer}.weight"] = name
                layer += 1
        _write_shard(repo_dir / name, tensors, dtype, seed)
        written.append(repo_dir / name)
    torch_dtype = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}.get(dtype, dtype.lower())
    docs: dict[str, object] = {
        "config.json": {
            "architectures": ["WeightswarmTestModel"],
            "model_type": "weightswarm-test",
            "num_hidden_layers": layer,
            "torch_dtype": torch_dtype,
            "weightswarm_seed": seed,
        },
        "tokenizer_config.json": {"model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast"},
        "generation_config.json": {"_from_model_config": True, "max_new_tokens": 16},
    }
    if shards > 1:
        docs["model.safetensors.index.json"] = {
            "metadata": {"total_size": total_bytes // elem * elem},
            "weight_map": weight_map,
        }
    for fname, content in docs.items():
        _write_atomic(repo_dir / fname, (json.dumps(content, indent=2, sort_keys=True) + "\n").encode())
        written.append(repo_dir / fname)
    readme = (
        f"# {repo_id}\n\nA weightswarm test model: {layer} random {dtype} tensors, "
        f"{shards} shard(s), seed {seed}.\n"
    )
    _write_atomic(repo_dir / "README.md", readme.encode())
    written.append(repo_dir / "README.md")
    return written
