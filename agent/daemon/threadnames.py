"""The daemon's Python threads carry their names at the OS level, as they do from Python 3.14 on.

Threads the daemon starts in Python ("fetch-file_0", "swarm-alerts", "api …") and the native threads
libtorrent starts for its session (network, disk I/O, hashing) all showed as the process's name in
`top -H`, `ps -L`, perf and /proc/PID/task/*/comm, so nobody could tell from outside which of them
used a node's CPU. Named, a Python thread shows its name (cut to the kernel's 15 bytes), and the
threads still named like the process, the main thread aside, are libtorrent's (bench.swarm splits an
agent's CPU that way).
"""

from __future__ import annotations

import threading
from typing import Any

from agent.daemon.arenas import libc_function

_PR_SET_NAME = 15
"""prctl's option that names the calling thread (linux/prctl.h)."""
_NAME_BYTES = 15
"""A thread's name at the OS level: 16 bytes with the terminating NUL."""


def name_os_threads() -> bool:
    """From now on each Python thread names itself at the OS level as it starts; call before the daemon
    starts its threads. False where the C library has no prctl (not Linux)."""
    import _thread

    if hasattr(_thread, "set_name"):  # Python 3.14+ names its threads itself
        return True
    prctl = libc_function("prctl")
    if prctl is None:
        return False
    run: Any = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
    if getattr(run, "names_os_thread", False):
        return True

    def bootstrap_named(self: threading.Thread) -> None:
        prctl(_PR_SET_NAME, self.name.encode("utf-8", "replace")[:_NAME_BYTES], 0, 0, 0)
        run(self)

    bootstrap_named.names_os_thread = True  # type: ignore[attr-defined]
    threading.Thread._bootstrap_inner = bootstrap_named  # type: ignore[attr-defined]
    return True
