"""Unix socket paths of any length.

`bind` and `connect` take at most 107 bytes of path (sun_path), and a state dir under a deep home
or a test's temp dir is longer. A longer path is reached through an open descriptor of its
directory, `/proc/self/fd/<n>/<name>` (Linux), which stays valid while the descriptor is open.
"""

from __future__ import annotations

import os
from pathlib import Path

UNIX_PATH_MAX = 107
"""Longest path Linux accepts in sun_path (108 bytes with the terminating NUL)."""


class SocketPath:
    """`address` is what `bind`/`connect` accept for `path`: `path` itself when short enough, else a
    path through an open descriptor of its directory, valid until `close()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._dir_fd: int | None = None
        if len(os.fsencode(path)) <= UNIX_PATH_MAX:
            self.address = str(path)
            return
        try:
            self._dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.address = str(path)  # no such directory: connecting fails, and says so
            return
        self.address = f"/proc/self/fd/{self._dir_fd}/{path.name}"
        if len(os.fsencode(self.address)) > UNIX_PATH_MAX:
            self.close()
            raise OSError(f"socket name {path.name!r} is too long")

    def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> SocketPath:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
