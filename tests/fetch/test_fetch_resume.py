"""Kill-and-resume, and a disk that is too small up front or fills up mid-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.core.errors import DiskSpaceError
from agent.fetch.engine import fetch_snapshot
from agent.hub.server import HubServer
from tests.support.fetchkit import (
    REPO,
    MiB,
    leftovers,
    model,
    repo_dir,
    settings_for,
    snapshot_contents,
)
from tests.support.procs import kill_process, loop_until


def test_sigkill_midway_resumes_from_written_bytes(tmp_path):
    root = tmp_path / "origin"
    files = model(root, total=40 * MiB, shards=1)
    size = sum(len(b) for b in files.values())
    cache, state = tmp_path / "hub", tmp_path / "state"
    cmd = [
        sys.executable,
        "-m",
        "agent",
        "fetch",
        REPO,
        "--cache-dir",
        str(cache),
        "--state-dir",
        str(state),
        "--connections-per-file",
        "4",
        "--quiet",
    ]
    with HubServer(root, rate_total=10e6) as srv:
        proc = subprocess.Popen([*cmd, "--origin", srv.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            loop_until(
                lambda: srv.egress_bytes > 20 * MiB or proc.poll() is not None, timeout=60, what="egress"
            )
            assert proc.poll() is None, proc.communicate()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            kill_process(proc)
        first_egress = srv.egress_bytes
        # Killed: a partial blob and its record exist, nothing is visible in a snapshot.
        assert list(repo_dir(cache).rglob("*.incomplete")) and list((state / "partials").iterdir())
        snapshots = repo_dir(cache) / "snapshots"
        assert not any(p.name.endswith(".safetensors") for p in snapshots.rglob("*"))

        srv.reset_counters()
        srv.rate_total = None
        out = subprocess.run([*cmd, "--origin", srv.url], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert snapshot_contents(Path(out.stdout.strip().splitlines()[-1])) == files
        # The rerun fetched what was missing, not the whole file again (records lag by <= 4 MiB/connection).
        assert srv.egress_bytes < size - first_egress + 4 * 4 * MiB + 64 * 1024
        assert srv.egress_bytes < 0.8 * size
        assert leftovers(cache, state) == []


def test_disk_too_small_is_refused_up_front(tmp_path, mounted_tmpfs):
    root = tmp_path / "origin"
    model(root, total=24 * MiB, shards=2)
    mnt = mounted_tmpfs(tmp_path / "small", "size=20m")
    with HubServer(root) as srv:
        settings = settings_for(tmp_path, srv.url, cache_dir=mnt / "hub")
        with pytest.raises(DiskSpaceError, match="not enough disk space"):
            fetch_snapshot(settings, REPO)
        assert [r for r in srv.requests if r.method == "GET" and r.bucket in ("resolvers", "cdn")] == []
        assert not any((repo_dir(mnt / "hub") / "blobs").iterdir())


def test_enospc_midway_removes_temp_and_keeps_completed_files(tmp_path, mounted_tmpfs):
    root = tmp_path / "origin"
    files = model(root, total=12 * MiB, shards=2)
    mnt = mounted_tmpfs(tmp_path / "small", "size=20m")
    with HubServer(root, rate_total=8e6) as srv:
        settings = settings_for(tmp_path, srv.url, cache_dir=mnt / "hub", files_at_once=1)
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                fetch_snapshot(settings, REPO)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome.append(exc)

        t = threading.Thread(target=run)
        t.start()
        # Once the first shard is under way (its space reserved), someone else fills the disk.
        loop_until(lambda: srv.egress_bytes > 1 * MiB, timeout=60, what="download start")
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        with open(mnt / "filler", "wb") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, free)
            except OSError:
                pass
        t.join(timeout=120)
        assert not t.is_alive()
        assert isinstance(outcome[0], DiskSpaceError), outcome
        assert leftovers(mnt / "hub", settings.state_dir) == []
        snapshot = repo_dir(mnt / "hub") / "snapshots" / srv.commit_for(REPO)
        kept = snapshot_contents(snapshot)
        first_shard = sorted(p for p in files if p.endswith(".safetensors"))[0]
        assert kept.get(first_shard) == files[first_shard]  # the file that completed stays
        assert all(kept[p] == files[p] for p in kept)


def _holding_reservations(monkeypatch, until) -> list[bool]:
    """Make each reservation of a shard (posix_fallocate of over 1 MiB) wait, up to 10 s, for `until()`,
    as tmpfs allocating a big file's pages on a busy node does; returns, per reservation, whether `until`
    came."""
    real = os.posix_fallocate
    came: list[bool] = []

    def held(fd: int, offset: int, length: int) -> None:
        if length > MiB:
            deadline = time.monotonic() + 10
            while not (ok := bool(until())) and time.monotonic() < deadline:
                time.sleep(0.02)
            came.append(ok)
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", held)
    return came


def test_a_shard_is_asked_for_while_its_space_is_being_reserved(tmp_path, monkeypatch):
    root = tmp_path / "origin"
    files = model(root, total=8 * MiB, shards=1)
    with HubServer(root) as srv:
        asked = lambda: any(r.range and r.bucket == "cdn" for r in srv.requests)  # noqa: E731
        came = _holding_reservations(monkeypatch, asked)
        result = fetch_snapshot(settings_for(tmp_path, srv.url), REPO)
    assert snapshot_contents(result.snapshot_path) == files
    assert came == [True]  # the range went out before the reservation returned


def test_a_disk_filled_before_the_space_is_reserved_fails_the_fetch_and_keeps_nothing(
    tmp_path, monkeypatch, mounted_tmpfs
):
    root = tmp_path / "origin"
    model(root, total=12 * MiB, shards=1)
    mnt = mounted_tmpfs(tmp_path / "small", "size=20m")

    def someone_fills_the_disk() -> bool:
        # After the fetch's up-front check, before its reservation: another writer takes the space.
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        with open(mnt / "filler", "wb") as f:
            real_fallocate(f.fileno(), 0, free - 2 * MiB)
        return True

    real_fallocate = os.posix_fallocate
    with HubServer(root, rate_total=4e6) as srv:
        settings = settings_for(tmp_path, srv.url, cache_dir=mnt / "hub")
        came = _holding_reservations(monkeypatch, someone_fills_the_disk)
        with pytest.raises(DiskSpaceError, match="not enough disk space"):
            fetch_snapshot(settings, REPO)
        # It failed at the reservation, not once the 2 MiB left were written: well before the 3 s that
        # the shard takes at this rate.
        assert srv.egress_bytes < 6 * MiB
    assert came == [True]
    assert leftovers(mnt / "hub", settings.state_dir) == []
