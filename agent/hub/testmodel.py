"""Deterministic test models in the layout the hub serves (`root/<org>/<name>/`).

The safetensors shards are valid (the `safetensors` package loads them); tensor contents are
pseudo-random bytes derived from (seed, file, tensor), so two calls with the same arguments
write identical files and the same seed in two repos gives identical (deduplicable) shards.
Every file is written to `*.incomplete` and renamed into place, so a hub scanning the
directory never lists a half-written file.

Repos share files as they do on the real Hub: every repo has the Hub's default `.gitattributes`
(byte-identical everywhere), `generation_config.json` and `tokenizer_config.json` are the same in
every repo, `tokenizer.json` follows `tokenizer_seed` (a fine-tune keeps its base model's), and a
shard follows its entry in `shard_seeds` (an unchanged shard of a variant). `make_family` writes a
base model and a fine-tune shaped so; `change_shard` makes a second revision that changes one shard.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from agent.hub.repos import INCOMPLETE_SUFFIX, LFS_SUFFIXES, valid_repo_id

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


GITATTRIBUTES = "".join(
    f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in sorted(LFS_SUFFIXES)
) + "*tfevents* filter=lfs diff=lfs merge=lfs -text\n"
"""The `.gitattributes` a new Hub repo starts with: the same bytes in most real repos."""


def _tokenizer(seed: int) -> dict[str, object]:
    rng = random.Random(f"tokenizer/{seed}")
    vocab = {f"tok{i}_{rng.randrange(1 << 30):x}": i for i in range(512)}
    return {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": []}


def make_model(
    root: Path,
    repo_id: str,
    *,
    total_bytes: int,
    shards: int,
    seed: int = 0,
    dtype: str = "F16",
    shard_seeds: Sequence[int] | None = None,
    tokenizer_seed: int | None = None,
    readme: str | None = None,
) -> list[Path]:
    """Write a test model to `root/<org>/<name>/` and return the paths written.

    `total_bytes` is the tensor data (rounded down to whole elements); each shard adds a small
    JSON header. `shards=1` writes `model.safetensors` without an index, as the Hub's small models.
    `shard_seeds` (one per shard, default `seed` for all), `tokenizer_seed` (default `seed`) and
    `readme` (default: one naming the repo) choose what this repo shares with others.
    """
    if shard_seeds is not None and len(shard_seeds) != shards:
        raise ValueError(f"shard_seeds needs one seed per shard: {len(shard_seeds)} for {shards} shards")
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
    seeds = list(shard_seeds) if shard_seeds is not None else [seed] * shards
    names, sizes = _shard_names(shards), _split(total_bytes, shards, elem)
    for name, shard_bytes, shard_seed in zip(names, sizes, seeds, strict=True):
        count = max(1, -(-shard_bytes // TENSOR_BYTES))
        tensors = []
        for nbytes in _split(shard_bytes, count, elem):
            if nbytes:
                tensors.append((f"model.layers.{layer}.weight", nbytes))
                weight_map[f"model.layers.{layer}.weight"] = name
                layer += 1
        _write_shard(repo_dir / name, tensors, dtype, shard_seed)
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
        "tokenizer.json": _tokenizer(seed if tokenizer_seed is None else tokenizer_seed),
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
    if readme is None:
        readme = (
            f"# {repo_id}\n\nA weightswarm test model: {layer} random {dtype} tensors, "
            f"{shards} shard(s), seed {seed}.\n"
        )
    _write_atomic(repo_dir / "README.md", readme.encode())
    _write_atomic(repo_dir / ".gitattributes", GITATTRIBUTES.encode())
    written += [repo_dir / "README.md", repo_dir / ".gitattributes"]
    return written


SHARED_README = "---\nlicense: apache-2.0\n---\n# Model card\n\nWeights for a weightswarm test.\n"
"""A model card two repos can share byte for byte (copied from a base model, as fine-tunes do)."""


def make_family(
    root: Path, base: str, finetune: str, *, total_bytes: int, shards: int, seed: int = 0, dtype: str = "F16"
) -> tuple[list[Path], list[Path]]:
    """A base model and a fine-tune that share what real ones share: `.gitattributes`, the model card,
    the tokenizer and its config, and the first shard (a frozen embedding); the other shards differ."""
    if shards < 2:
        raise ValueError("a family needs at least 2 shards: one shared, one fine-tuned")
    base_files = make_model(
        root, base, total_bytes=total_bytes, shards=shards, seed=seed, dtype=dtype, readme=SHARED_README
    )
    tuned_seeds = [seed] + [seed + 1000 + i for i in range(1, shards)]
    tuned_files = make_model(
        root, finetune, total_bytes=total_bytes, shards=shards, seed=seed + 1, dtype=dtype,
        shard_seeds=tuned_seeds, tokenizer_seed=seed, readme=SHARED_README,
    )
    return base_files, tuned_files


def change_shard(root: Path, repo_id: str, index: int, seed: int) -> Path:
    """A new revision of the repo that changes one shard (`index`, 0-based) and nothing else: same
    tensors and sizes, other bytes. Returns the rewritten shard."""
    repo_dir = Path(root) / repo_id
    shards = sorted(repo_dir.glob("model*.safetensors"))
    path = shards[index]
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    dtype = next(iter(header.values()))["dtype"]
    _write_shard(path, [(k, end - start) for start, end, k in spans], dtype, seed)
    return path
