"""The per-blob lock files every writer of one hub cache takes: weightswarm and huggingface_hub alike.

huggingface_hub (`file_download._hf_hub_download_to_cache_dir`) holds
`<cache_dir>/.locks/models--org--name/<etag>.lock` while it downloads or links a blob, through
filelock's `FileLock`: `fcntl.flock(LOCK_EX)` on that file, which stays in place after release so
that every waiter locks the same inode. Taking the same lock, of the same kind, on the same path makes
two CLIs, a CLI and the daemon, or weightswarm and huggingface_hub take turns on one blob: the one
that waited finds the blob complete and links it instead of downloading it again. An LFS blob's etag
is its sha256 and a small file's its git sha1: the blob ids here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.cache.layout import check_blob_id, repo_folder_name

log = logging.getLogger(__name__)

LOCKS_DIR = ".locks"
_POLL = 0.05
"""Seconds between tries while another writer holds the lock (short: a waiter links as soon as it may)."""
_SAY_EVERY = 10.0
"""Seconds between the lines saying a writer still waits (huggingface_hub says it every 10 s too)."""
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""flock's answers on a filesystem without it (some NFS mounts): no lock, as huggingface_hub falls back."""


def blob_lock_path(cache_dir: Path, repo_id: str, blob_id: str) -> Path:
    return cache_dir / LOCKS_DIR / repo_folder_name(repo_id) / f"{check_blob_id(blob_id)}.lock"


@contextlib.contextmanager
def blob_lock(
    cache_dir: Path,
    repo_id: str,
    blob_id: str,
    interrupt: threading.Event | None = None,
    waiting: Callable[[], None] | None = None,
) -> Iterator[bool]:
    """Hold the blob's lock (yields True), waiting while another writer holds it; yields False without
    a lock where none can be taken (a read-only cache, a filesystem without flock): a reader needs none,
    and a writer then risks only a second download, never a torn blob (every install is an
    `os.replace`). `interrupt` set ends a wait early (the daemon stopping): yields False too.
    `waiting` is called once when another writer holds the lock (a daemon job shows it as its stage)."""
    path = blob_lock_path(cache_dir, repo_id, blob_id)
    fd = _acquire(path, interrupt, waiting)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _acquire(path: Path, interrupt: threading.Event | None, waiting: Callable[[], None] | None) -> int | None:
    started = said = time.monotonic()
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # 0o664 as huggingface_hub's WeakFileLock: users sharing a cache can wait on each other.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
        except OSError as exc:
            log.debug("no lock on %s (%s): going on without one", path, exc.strerror)
            return None
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if waiting is not None:
                        waiting()
                        waiting = None
                    now = time.monotonic()
                    if now - said >= _SAY_EVERY:
                        log.info("still waiting for %s, held by another writer (%.0fs)", path, now - started)
                        said = now
                    if interrupt is None:
                        time.sleep(_POLL)
                    elif interrupt.wait(_POLL):
                        os.close(fd)
                        return None
        except OSError as exc:
            os.close(fd)
            if exc.errno in _NO_FLOCK:
                return None
            raise
        # A writer that unlinked the lock file (a cache cleaner) leaves us holding an inode nobody else
        # opens: lock the file that is there now instead.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)

