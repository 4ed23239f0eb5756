"""One cache, several writers: two `agent fetch` processes, or `agent fetch` beside huggingface_hub, take
the same `.locks/models--org--name/<blob>.lock` (flock, as huggingface_hub's filelock `FileLock` in
file_download.py) and download each blob once; the one that waited links the finished blob."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download

from agent.cache.locks import blob_lock, blob_lock_path
from agent.fetch.engine import fetch_snapshot
from tests.support.cluster import BIN
from tests.support.fetchkit import REPO, MiB, model, serve, settings_for, sha256, shards, snapshot_contents
from tests.support.procs import free_port, loop_until, stop_process

RATE = 8 * MiB
"""The origin's cap on all connections together: slow enough that two fetches overlap for seconds."""


@pytest.fixture
def no_xet(monkeypatch):
    # As tests/hub/conftest.py: the 2026 answers' X-Xet-Hash would send huggingface_hub to a CAS.
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def _stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/_weightswarm/stats", timeout=5) as resp:
        return json.loads(resp.read())


def test_two_agent_fetch_processes_into_one_cache_take_turns_per_blob(tmp_path):
    files = model(tmp_path / "origin", total=24 * MiB, shards=3)
    size = sum(len(b) for b in files.values())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(BIN / "agent"), "serve-hub", str(tmp_path / "origin"), "--port", str(port)]
    argv += ["--rate-total", "8MB"]
    hub = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        loop_until(lambda: _reachable(url), timeout=30, what="agent serve-hub")
        dirs = ["--cache-dir", str(tmp_path / "hub"), "--state-dir", str(tmp_path / "st"), "--agent", "off"]
        argv = [str(BIN / "agent"), "fetch", REPO, "--origin", url, "--quiet", *dirs]
        env = {**os.environ, "HF_HUB_OFFLINE": ""}
        runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(2)]
        outs = [r.communicate(timeout=120) for r in runs]
        for r, (_out, err) in zip(runs, outs, strict=True):
            assert r.returncode == 0, err
        snaps = {out.strip().splitlines()[-1] for out, _err in outs}
        assert len(snaps) == 1 and snapshot_contents(Path(snaps.pop())) == files
        egress = _stats(url)["egress_bytes"]
        # Every blob once, plus the two plans' JSON: far below the 2 x S of two independent downloads.
        assert size <= egress < 1.1 * size, (egress, size)
    finally:
        stop_process(hub)


def _reachable(url: str) -> bool:
    try:
        _stats(url)
        return True
    except OSError:
        return False


def test_agent_fetch_waits_for_huggingface_hub_downloading_the_same_blob(tmp_path, no_xet):
    root = tmp_path / "origin"
    files = model(root, total=16 * MiB, shards=2)
    shard = shards(files)[0]
    served = serve(root, rate_total=RATE)
    srv = next(served)
    try:
        settings = settings_for(tmp_path, srv.url)
        hf_done = threading.Event()

        def hf_download() -> None:
            try:
                hf_hub_download(REPO, shard, endpoint=srv.url, cache_dir=settings.cache_dir)
            finally:
                hf_done.set()

        hf = threading.Thread(target=hf_download, name="hf_hub_download")
        hf.start()
        lock = blob_lock_path(settings.cache_dir, REPO, sha256(files[shard]))
        loop_until(lambda: lock.exists() or hf_done.is_set(), timeout=30, what="huggingface_hub's lock")
        assert not hf_done.is_set(), "huggingface_hub finished before the fetch started: raise the cap"
        result = fetch_snapshot(settings, REPO)
        hf.join(timeout=60)
        assert snapshot_contents(result.snapshot_path) == files
        assert shard not in result.downloaded
        gets = [r for r in srv.requests if r.method == "GET" and r.path.endswith(shard)]
        sent = sum(_span(r.range, len(files[shard])) for r in gets)
        assert sent == len(files[shard]), [r.range for r in gets]
    finally:
        served.close()


def _span(header: str | None, size: int) -> int:
    """Bytes a GET's Range asks for (the whole file without one)."""
    if not header:
        return size
    first, _, last = header.removeprefix("bytes=").partition("-")
    return (int(last) if last else size - 1) - int(first) + 1


def test_the_lock_is_huggingface_hubs_flock_on_the_same_file(tmp_path):
    """A holder of filelock's FileLock on huggingface_hub's path blocks blob_lock, and the other way round."""
    from filelock import FileLock, Timeout

    blob = "a" * 64
    path = blob_lock_path(tmp_path, REPO, blob)
    assert path == tmp_path / ".locks" / "models--org--tiny" / f"{blob}.lock"
    path.parent.mkdir(parents=True)
    with FileLock(path):
        stop = threading.Event()
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(_take(tmp_path, blob, stop)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not got  # held by huggingface_hub's kind of lock: it waits
        stop.set()
        waiter.join(timeout=5)
        assert got == [False]
    with blob_lock(tmp_path, REPO, blob) as held:
        assert held
        with pytest.raises(Timeout):
            FileLock(path, timeout=0.2).acquire()
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def _take(cache_dir: Path, blob: str, stop: threading.Event) -> bool:
    with blob_lock(cache_dir, REPO, blob, interrupt=stop) as held:
        return held
