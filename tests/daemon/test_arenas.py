"""agent.daemon.arenas: the daemon's threads share two malloc arenas (glibc), counted by glibc itself."""

from __future__ import annotations

import subprocess
import sys

# Eight threads allocate at once (as libtorrent's disk and hashing threads and the fetch workers do),
# then glibc's malloc_info lists its arenas ("<heap nr=...>"). Run in a fresh interpreter: arenas
# made before the cap stay.
SCRIPT = """
import ctypes, sys, tempfile, threading
from agent.daemon.arenas import limit_malloc_arenas
if sys.argv[1] == "capped":
    assert limit_malloc_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
start = threading.Barrier(8)

def work():
    start.wait()
    blocks = [libc.malloc(4096) for _ in range(20000)]
    for b in blocks:
        libc.free(b)

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(open(out.name).read().count("<heap nr="))
"""


def _arenas(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_the_daemon_threads_share_two_malloc_arenas():
    assert _arenas("capped") <= 2
    # The same threads without the cap: glibc makes more (else this test would show nothing).
    assert _arenas("default") > 2
