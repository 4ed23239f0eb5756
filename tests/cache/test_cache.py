"""Unit-level: hub cache layout, safe paths, piece hashing, safetensors structure checks."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from agent.cache.layout import BlobDigest, RepoCache, repo_folder_name, safe_relpath
from agent.core.errors import ConfigError, IntegrityError, UnsafePathError
from agent.core.hashing import BlobHasher
from agent.core.metainfo import (
    PieceHasher,
    encoded_info,
    info_dict,
    infohash,
    listed_pieces,
    piece_length_for,
)
from agent.fetch.safetensors import check_index, check_safetensors
from tests.support.procs import require_module
from wirekit.bencode import bencode

BLOB = "a" * 64


def test_repo_folder_and_bad_repo_ids():
    assert repo_folder_name("org/name") == "models--org--name"
    assert repo_folder_name("gpt2") == "models--gpt2"
    for bad in ("../x", "org/../x", "/abs", "org/name/extra", "", "org//x"):
        with pytest.raises(ConfigError):
            repo_folder_name(bad)


@pytest.mark.parametrize(
    "path", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\..\\b", "", "a/\x00"]
)
def test_unsafe_paths_refused(path):
    with pytest.raises(UnsafePathError):
        safe_relpath(path)


def test_safe_nested_path():
    assert safe_relpath("sub/dir/file.json").parts == ("sub", "dir", "file.json")


def test_snapshot_links_are_relative_and_refs_atomic(tmp_path):
    cache = RepoCache(tmp_path / "hub", tmp_path / "state", "org/m")
    cache.prepare()
    cache.blob_path(BLOB).write_bytes(b"x")
    commit = "c" * 40
    top = cache.link_snapshot(commit, "model.safetensors", BLOB)
    nested = cache.link_snapshot(commit, "sub/dir/w.safetensors", BLOB)
    assert os.readlink(top) == f"../../blobs/{BLOB}"
    assert os.readlink(nested) == f"../../../../blobs/{BLOB}"
    assert nested.read_bytes() == b"x"
    cache.write_ref("main", commit)
    assert (cache.refs_dir / "main").read_text() == commit
    cache.write_ref(commit, commit)  # a commit revision writes no ref, as huggingface_hub
    assert sorted(p.name for p in cache.refs_dir.iterdir()) == ["main"]
    with pytest.raises(UnsafePathError):
        cache.link_snapshot(commit, "../escape", BLOB)
    with pytest.raises(UnsafePathError):
        cache.blob_path("../" + "a" * 61)


def test_blob_complete_uses_size_and_sidecar(tmp_path):
    cache = RepoCache(tmp_path / "hub", tmp_path / "state", "org/m")
    cache.prepare()
    tmp = cache.incomplete_path(BLOB)
    tmp.write_bytes(b"hello")
    assert not cache.blob_is_complete(BLOB, 5)
    cache.install_blob(BLOB, tmp, BlobDigest(5, 0, "00", 262144, b"\0" * 20))
    assert not tmp.exists()
    assert cache.blob_is_complete(BLOB, 5)
    assert not cache.blob_is_complete(BLOB, 6)
    assert cache.sidecar_path(BLOB).is_relative_to(tmp_path / "state")
    # Rewritten behind our back (same size, new mtime): no longer trusted.
    st = cache.blob_path(BLOB).stat()
    os.utime(cache.blob_path(BLOB), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert not cache.blob_is_complete(BLOB, 5)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, 256 * 1024),
        (100 * 2**20, 256 * 1024),
        (600 * 2**20, 512 * 1024),
        (1024**3, 16 * 2**20),
        (5 * 10**9, 16 * 2**20),
        (100 * 10**9, 16 * 2**20),
    ],
)
def test_piece_length_for(size, expected):
    length = piece_length_for(size)
    assert length == expected
    assert length & (length - 1) == 0
    assert size <= length * 2000 or length == 16 * 2**20


def test_piece_hasher_matches_independent_sha1s():
    data = os.urandom(3 * 262144 + 1234)
    ph = PieceHasher(262144)
    for i in range(0, len(data), 100_000):  # feed in sizes that straddle piece boundaries
        ph.update(memoryview(data)[i : i + 100_000])
    expected = b"".join(hashlib.sha1(data[i : i + 262144]).digest() for i in range(0, len(data), 262144))
    assert ph.digest() == expected
    info = info_dict(BLOB, len(data), 262144, expected)
    assert infohash(info) == hashlib.sha1(bencode(info)).hexdigest()
    with pytest.raises(ValueError):
        info_dict(BLOB, len(data), 262144, expected[:-20])


def test_listed_pieces_are_taken_only_from_the_metainfo_this_node_would_build():
    size = 600_000
    pieces = os.urandom(20 * -(-size // piece_length_for(size)))  # hashes of bytes this test never saw
    info = encoded_info(BLOB, size, piece_length_for(size), pieces)
    assert listed_pieces(info, BLOB, size) == pieces
    assert listed_pieces(info, BLOB, size + 1) is None  # another size
    assert listed_pieces(info, "b" * 64, size) is None  # another blob
    double = 2 * piece_length_for(size)
    other_length = bencode(info_dict(BLOB, size, double, pieces[: 20 * -(-size // double)]))
    assert listed_pieces(other_length, BLOB, size) is None  # seeded so, it would be another torrent
    extra = bencode({**info_dict(BLOB, size, piece_length_for(size), pieces), "private": 1})
    assert listed_pieces(extra, BLOB, size) is None
    for junk in (b"", b"i3e", b"d6:pieces3:abce", info[:-1]):
        assert listed_pieces(junk, BLOB, size) is None


def test_infohash_agrees_with_libtorrent():
    lt = require_module("libtorrent", "a dependency of weightswarm: pip install -e '.[dev]' (./dev does)")
    data = os.urandom(600_000)
    h = BlobHasher(len(data), is_lfs=True)
    h.update(data)
    got = h.finish()
    assert got.content_id == hashlib.sha256(data).hexdigest()
    info = info_dict(BLOB, len(data), got.piece_length, got.pieces)
    ti = lt.torrent_info(lt.bdecode(bencode({"info": info})))
    assert str(ti.info_hashes().v1) == infohash(info)


def test_git_blob_sha1():
    h = BlobHasher(5, is_lfs=False)
    h.update(b"hello")
    assert h.finish().content_id == "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"  # `git hash-object`


def _safetensors(tensors: dict[str, tuple[int, int]], data_len: int, pad: int = 0) -> bytes:
    header = {n: {"dtype": "U8", "shape": [e - b], "data_offsets": [b, e]} for n, (b, e) in tensors.items()}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * (data_len + pad)


def test_safetensors_checks(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(_safetensors({"a": (0, 4), "b": (4, 10)}, 10))
    check_safetensors(p, "m.safetensors")
    cases = {
        "gap": _safetensors({"a": (0, 4), "b": (5, 10)}, 10),
        "length": _safetensors({"a": (0, 4)}, 4, pad=1),
        "header": struct.pack("<Q", 5) + b"{nope",
        "huge": struct.pack("<Q", 10**9) + b"{}",
        "short": b"\1\2",
    }
    for blob in cases.values():
        p.write_bytes(blob)
        with pytest.raises(IntegrityError, match="m.safetensors"):
            check_safetensors(p, "m.safetensors")


def test_index_check(tmp_path):
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    check_index(idx, idx.name, {"s1.safetensors", "s2.safetensors"}, {"s1.safetensors", "s2.safetensors"})
    check_index(idx, idx.name, {"s1.safetensors"}, {"s1.safetensors", "s2.safetensors"})  # user filtered s2
    with pytest.raises(IntegrityError, match="s2.safetensors"):
        check_index(idx, idx.name, {"s1.safetensors"}, {"s1.safetensors"})
    idx.write_text("[]")
    with pytest.raises(IntegrityError, match="weight_map"):
        check_index(idx, idx.name, set(), set())


def test_sidecar_roundtrip():
    d = BlobDigest(10, 123, "ff", 262144, b"\1" * 20)
    assert BlobDigest.from_json(d.to_json()) == d


def test_partial_path_is_beside_blob(tmp_path: Path):
    cache = RepoCache(tmp_path / "hub", tmp_path / "state", "org/m")
    assert cache.incomplete_path(BLOB).parent == cache.blob_path(BLOB).parent
    assert cache.partial_record_path(BLOB).is_relative_to(tmp_path / "state")
