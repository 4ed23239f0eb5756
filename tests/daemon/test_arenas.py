"""agent.daemon.arenas: the daemon's threads share two malloc arenas (glibc), counted by glibc itself, and
the free pages in them go back to the kernel, as the kernel counts them."""

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


def _in_fresh_interpreter(script: str, mode: str) -> str:
    """`script`'s stdout, run with argv[1] = `mode` in a new interpreter (malloc untouched by pytest)."""
    done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _arenas(mode: str) -> int:
    return int(_in_fresh_interpreter(SCRIPT, mode))


def test_the_daemon_threads_share_two_malloc_arenas():
    assert _arenas("capped") <= 2
    # The same threads without the cap: glibc makes more (else this test would show nothing).
    assert _arenas("default") > 2


# A thread fills its arena with 16 KiB buffers (libtorrent's block size) and frees seven in eight, the
# eighth kept, so no heap top is free for glibc to give back by itself: then RssAnon, before and after
# `trim_heaps` (or after the same pause without it).
FRAGMENT = """
import ctypes, sys, threading, time
from agent.daemon.arenas import limit_malloc_arenas, trim_heaps
assert limit_malloc_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def anon():
    line = next(l for l in open("/proc/self/status") if l.startswith("RssAnon:"))
    return int(line.split()[1]) // 1024

kept = []

def work():
    blocks = [libc.malloc(16384) for _ in range(8000)]
    for b in blocks:
        ctypes.memset(b, 1, 16384)
    for i, b in enumerate(blocks):
        (kept.append if i % 8 == 0 else libc.free)(b)

t = threading.Thread(target=work)
t.start()
t.join()
before = anon()
if sys.argv[1] == "trim":
    assert trim_heaps()
else:
    time.sleep(0.1)
print(before, anon())
"""


def _rss_anon_mib(mode: str) -> tuple[int, int]:
    before, after = map(int, _in_fresh_interpreter(FRAGMENT, mode).split())
    return before, after


def test_freed_buffers_go_back_to_the_kernel_when_the_heaps_are_trimmed():
    before, after = _rss_anon_mib("trim")
    assert before >= 110, f"the buffers made only {before} MiB resident"
    assert after <= before - 80, f"RssAnon {before} -> {after} MiB after trimming 109 MiB of freed buffers"
    # Without the trim glibc keeps them (else this test would show nothing).
    before, after = _rss_anon_mib("wait")
    assert after >= before - 10, f"RssAnon {before} -> {after} MiB without a trim"
