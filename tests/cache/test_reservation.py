"""A blob's space is reserved up front on a disk and not in memory (agent.cache.partial.Reservation): on
tmpfs, fallocate allocates every page of the blob before its first byte."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agent.cache.partial import Reservation, fs_type
from tests.support.procs import require

MiB = 2**20


def reserved(path: Path, size: int) -> tuple[str, int]:
    """(the filesystem type the agent sees, bytes the file holds once a reservation of `size` is done)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        space = Reservation(fd, size)
        space.close()
        space.check()
        assert os.fstat(fd).st_size == size
        return fs_type(fd), os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)


def coreutils_type(path: Path) -> str:
    """The filesystem type as `stat -f` names it: a second opinion on /proc/self/mountinfo's."""
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_blob_in_memory_gets_its_pages_as_bytes_arrive(tmp_path, mounted_tmpfs):
    memory = mounted_tmpfs(tmp_path / "memory", "size=64m")
    assert coreutils_type(memory) == "tmpfs"
    assert reserved(memory / "blob.incomplete", 16 * MiB) == ("tmpfs", 0)


def test_a_blob_on_a_disk_has_its_space_reserved_up_front(tmp_path):
    if coreutils_type(tmp_path) in ("tmpfs", "ramfs"):
        require("a disk under the test's temporary directory", f"{tmp_path} is in memory here")
    kind, held = reserved(tmp_path / "blob.incomplete", 16 * MiB)
    assert kind not in ("", "tmpfs", "ramfs")
    assert held >= 16 * MiB
