"""Tar layers of model artifacts unpacked (agent.origin.oci.tarlayer), the layers written by an independent
packer (Python's tarfile, as modctl and oras write tar and tar+gzip layers): the files come out with their
sha256; a hostile listing (links, devices, climbing or absolute paths, duplicates, a file where a
directory must be) is refused whole before anything is written, and an oversized header record is
refused with memory and file descriptors bounded."""

from __future__ import annotations

import gc
import gzip
import hashlib
import io
import os
import tarfile

import psutil
import pytest

from agent.core.errors import IntegrityError, OriginError
from agent.origin.oci.tarlayer import MAX_RECORD, compression, unpack_layer

TAR = "application/vnd.cncf.model.weight.v1.tar"
TAR_GZ = "application/vnd.cncf.model.weight.v1.tar+gzip"
TAR_ZSTD = "application/vnd.cncf.model.weight.v1.tar+zstd"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer/tokenizer.json": os.urandom(70_000),
    "tokenizer/vocab/merges.txt": b"a b\n" * 1000,
    "model.safetensors": os.urandom(1 << 20),
    "empty.txt": b"",
}


def pack(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def into(dest):
    return lambda path: dest / path


def model_tar(fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return pack([entry("tokenizer/", kind=tarfile.DIRTYPE), *(entry(p, d) for p, d in FILES.items())], fmt)


@pytest.mark.parametrize("media", [TAR, TAR_GZ])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_a_tar_layer_unpacks_into_its_files_with_their_sha256(tmp_path, media, fmt):
    data = model_tar(fmt)
    layer = tmp_path / "layer"
    layer.write_bytes(gzip.compress(data) if media == TAR_GZ else data)
    dest = tmp_path / "out"
    dest.mkdir()
    got = unpack_layer(layer, media, "acme/m", 1 << 30, into(dest))
    assert {u.path: (u.size, u.sha256) for u in got} == {
        p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in FILES.items()
    }
    for path, content in FILES.items():
        assert (dest / path).read_bytes() == content


def test_long_paths_come_through_pax_and_gnu_headers(tmp_path):
    name = "deep/" + "d" * 120 + "/" + "f" * 150 + ".bin"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        layer = tmp_path / f"layer{fmt}"
        layer.write_bytes(pack([entry(name, b"x" * 700)], fmt))
        dest = tmp_path / f"out{fmt}"
        dest.mkdir()
        (got,) = unpack_layer(layer, TAR, "acme/m", 1 << 20, into(dest))
        assert got.path == name and (dest / name).read_bytes() == b"x" * 700


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([entry("ok.txt", b"1"), entry("../escape.txt", b"2")], "unsafe path '../escape.txt'"),
        ([entry("ok.txt", b"1"), entry("/etc/cron.d/x", b"2")], "unsafe path '/etc/cron.d/x'"),
        ([entry("ok.txt", b"1"), entry("a//b.txt", b"2")], "unsafe path 'a//b.txt'"),
        ([entry("ok.txt", b"1"), entry("link", kind=tarfile.SYMTYPE, link="/etc/shadow")], "a symbolic link"),
        ([entry("ok.txt", b"1"), entry("hard", kind=tarfile.LNKTYPE, link="ok.txt")], "a hard link"),
        ([entry("ok.txt", b"1"), entry("tty", kind=tarfile.CHRTYPE)], "a character device"),
        ([entry("ok.txt", b"1"), entry("disk", kind=tarfile.BLKTYPE)], "a block device"),
        ([entry("ok.txt", b"1"), entry("pipe", kind=tarfile.FIFOTYPE)], "a FIFO"),
        ([entry("ok.txt", b"1"), entry("ok.txt", b"2")], "'ok.txt' twice"),
        ([entry("a", b"1"), entry("a/b.txt", b"2")], "'a' as a file and a directory"),
        ([entry("a", kind=tarfile.DIRTYPE), entry("a", b"2")], "'a' as a file and a directory"),
    ],
    ids=["dotdot", "absolute", "empty-segment", "symlink", "hardlink", "chardev", "blockdev", "fifo",
         "duplicate", "file-then-dir", "dir-then-file"],
)
def test_a_hostile_listing_is_refused_whole_before_anything_is_written(tmp_path, members, said):
    layer = tmp_path / "layer"
    layer.write_bytes(pack(members))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(IntegrityError, match="refused") as caught:
        unpack_layer(layer, TAR, "acme/m", 1 << 20, into(dest))
    assert said in str(caught.value)
    assert list(dest.iterdir()) == []  # not even the good file before it


def test_more_content_than_allowed_is_refused_before_writing(tmp_path):
    layer = tmp_path / "layer"
    layer.write_bytes(gzip.compress(pack([entry("a.bin", bytes(600_000)), entry("b.bin", bytes(600_000))])))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(IntegrityError, match="unpacks to more than 1000000 bytes"):
        unpack_layer(layer, TAR_GZ, "acme/m", 1_000_000, into(dest))
    assert list(dest.iterdir()) == []


def test_an_oversized_pax_record_is_refused_with_memory_and_fds_bounded(tmp_path):
    """A pax header claiming 256 MiB (a path of that length): tarfile would read it whole into memory."""
    huge = 256 << 20
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, huge
    layer = tmp_path / "layer"
    with layer.open("wb") as f:
        f.write(header.tobuf(tarfile.USTAR_FORMAT))
        f.truncate(BLOCK_END := len(header.tobuf(tarfile.USTAR_FORMAT)) + huge + 1024)
    assert layer.stat().st_size == BLOCK_END
    me = psutil.Process()
    gc.collect()
    rss, fds = me.memory_info().rss, me.num_fds()
    dest = tmp_path / "out"
    dest.mkdir()
    for _ in range(20):
        with pytest.raises(IntegrityError, match=f"at most {MAX_RECORD}"):
            unpack_layer(layer, TAR, "acme/m", 1 << 40, into(dest))
    assert me.memory_info().rss - rss < 16 << 20, (me.memory_info().rss - rss) >> 20
    assert me.num_fds() <= fds + 2
    assert list(dest.iterdir()) == []


def test_zstd_layers_need_the_zstandard_package(tmp_path):
    assert (compression(TAR), compression(TAR_GZ), compression(TAR_ZSTD)) == ("", "gzip", "zstd")
    try:
        import zstandard
    except ImportError:
        layer = tmp_path / "layer"
        layer.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64))
        with pytest.raises(OriginError, match="needs the `zstandard` package"):
            unpack_layer(layer, TAR_ZSTD, "acme/m", 1 << 20, into(tmp_path))
        return
    layer = tmp_path / "layer"
    layer.write_bytes(zstandard.ZstdCompressor().compress(model_tar()))
    dest = tmp_path / "out"
    dest.mkdir()
    got = unpack_layer(layer, TAR_ZSTD, "acme/m", 1 << 30, into(dest))
    assert {u.path for u in got} == set(FILES)
