"""libtorrent's disk and hashing jobs on their own threads, or on its network thread on a node of few
CPUs (agent.swarm.ltkit.helper_threads): a blob moves either way, with each disk I/O; and the CPUs a
node has are those its affinity and its cgroup's quota leave it (agent.core.cpus)."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import pytest

from agent.core.cpus import usable_cpus
from agent.swarm import ltkit
from tests.swarm.kit import MiB, make_blob, open_swarm, sha256_of, write_blob


def _native_threads() -> int:
    """This process's threads that Python did not start: libtorrent's, of every session open; read once
    the count holds still, as sessions of earlier tests may still be stopping theirs."""

    def count() -> int:
        return len(os.listdir("/proc/self/task")) - threading.active_count()

    gc.collect()  # an earlier test's sessions stop their threads when collected
    seen = [count()]
    deadline = time.monotonic() + 10
    while len(seen) < 5 or len(set(seen[-5:])) > 1:
        assert time.monotonic() < deadline, f"libtorrent's threads did not settle: {seen[-10:]}"
        time.sleep(0.05)
        seen.append(count())
    return seen[-1]


@pytest.mark.parametrize("disk_io", ["pread", "mmap", "posix"])
@pytest.mark.parametrize(("cpus", "threads"), [(2, 0), (8, 6)])
def test_a_blob_moves_with_disk_jobs_inline_or_on_threads(
    tmp_path, swarms, monkeypatch, disk_io, cpus, threads
):
    monkeypatch.setattr(ltkit, "usable_cpus", lambda: cpus)
    before = _native_threads()
    seeder = open_swarm(swarms, tmp_path / "s-state", disk_io=disk_io)
    leecher = open_swarm(swarms, tmp_path / "l-state", disk_io=disk_io)
    for swarm in (seeder, leecher):
        assert swarm._ses.get_settings()["aio_threads"] == threads
        assert swarm._ses.get_settings()["hashing_threads"] == min(threads, 4)
    blob = make_blob(6 * MiB, 31)
    ih = seeder.seed(write_blob(tmp_path / "s", blob), blob.info, [])
    assert seeder.wait(ih, timeout=30).state == "seeding"
    leecher.download(tmp_path / "l", blob.blob_id, blob.info, peers=[("127.0.0.1", seeder.listen_port)])
    final = leecher.wait(ih, timeout=60)
    assert final.state == "seeding", final.error
    assert sha256_of(final.path) == blob.sha256
    # Inline, a session starts no disk or hashing thread, only its network thread; otherwise it starts
    # them as jobs come. libtorrent's posix disk I/O does every job on the network thread regardless.
    grown = _native_threads() - before
    assert grown == 2 if threads == 0 or disk_io == "posix" else grown > 2, grown


def _cgroup(tmp_path: Path, cpu_max: str | None) -> tuple[Path, Path]:
    tmp_path.mkdir()
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/agent\n")
    root = tmp_path / "fs"
    own = root / "kubepods" / "pod1" / "agent"
    own.mkdir(parents=True)
    if cpu_max is not None:
        (own / "cpu.max").write_text(cpu_max + "\n")
    return proc, root


def test_a_cpu_limit_caps_the_cpus_and_no_limit_leaves_the_affinity(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(*_cgroup(tmp_path / "a", "150000 100000")) == min(affinity, 2)  # 1.5 CPUs: 2
    assert usable_cpus(*_cgroup(tmp_path / "b", "50000 100000")) == 1
    assert usable_cpus(*_cgroup(tmp_path / "c", "max 100000")) == affinity
    assert usable_cpus(*_cgroup(tmp_path / "d", None)) == affinity  # cgroup v1: no cpu.max
    assert usable_cpus(tmp_path / "absent", tmp_path) == affinity
    # In a container with its own cgroup namespace its cgroup is the root of what it sees.
    (tmp_path / "ns").mkdir()
    (tmp_path / "ns" / "cgroup").write_text("0::/\n")
    (tmp_path / "ns" / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(tmp_path / "ns" / "cgroup", tmp_path / "ns") == 1


def test_two_cpus_keep_no_helper_threads_and_more_keep_what_is_asked():
    assert [ltkit.helper_threads(8, cpus) for cpus in (1, 2, 3, 4, 10, 64)] == [0, 0, 1, 2, 8, 8]
    assert ltkit.helper_threads(4, 64) == 4
