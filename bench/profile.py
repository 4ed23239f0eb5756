"""Where a round's CPU went: `perf record` over the round, each sample of the measured processes put in
a class by what it was doing, printed as CPU-seconds per GiB delivered (`bench.swarm --perf`).

The classes say what a sample was doing rather than which function ran:
- *softirq*: here nearly all of it network receive processing (TCP, the bridge, the shaper), which
  the kernel runs on whatever thread held the CPU when it was raised, so a CPU-bound round charges
  its processes for it and a round with idle time leaves part of it to the idle task (printed on its
  own line): compare systems with this row in mind.
- *page fault in F*: the first touch of a fresh page (zeroing it, charging it), named by the user
  function that touched it: a buffer `malloc`ed afresh, or memory handed back to the kernel before.
- *kernel from F*: a system call, named by the C library's entry (`pwritev64`, `__libc_recv`, a futex
  wait or wake), its copies included.
- *user code in L*: the process's own instructions, named by their library (libtorrent's SHA-1 has
  no symbols, libcrypto's sha256 neither; the library names them well enough).

Each measured thread is put in a group: an agent daemon's native threads (named like their process,
the main thread aside: libtorrent's), its Python threads, the `agent fetch` clients, aria2c. Context
switches are counted per group as well (a block handed from one thread to another costs one or two).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HZ = 299
"""Samples a second and CPU: prime, so the sampling does not beat with a periodic tick."""
ROWS = 12
"""Classes printed, the costliest first; the rest are summed into one row."""

_HEADER = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?P<event>[^\s:]+):")
_FRAME = re.compile(r"^\t\s*(?P<addr>[0-9a-f]+)\s+(?P<sym>.*?)\s+\((?P<dso>[^()]*)\)\s*$")
"""perf script prints a sample's header at the start of a line, each frame of its stack after a tab."""
_SOFTIRQ = ("handle_softirqs", "__do_softirq", "net_rx_action")


@dataclass
class Threads:
    """Which process is which: the agent daemons (their native threads told from their Python ones by
    name) and the clients the round started."""

    daemons: dict[int, str] = field(default_factory=dict)
    """pid -> the process's own name (its main thread's comm)."""
    clients: set[int] = field(default_factory=set)

    def group(self, comm: str, pid: int, tid: int) -> str | None:
        if comm == "aria2c":
            return "aria2c"
        if pid in self.daemons:
            native = tid != pid and comm == self.daemons[pid]
            return "libtorrent threads" if native else "agent, Python threads"
        if pid in self.clients:
            return "agent fetch"
        return None


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def classify(frames: list[tuple[str, str, str]]) -> str:
    """The class of one sample from its stack, innermost frame first: (address, symbol, library)."""
    kernel = [sym for addr, sym, _ in frames if addr.startswith("ffffffff")]
    user = [(sym, dso) for addr, sym, dso in frames if not addr.startswith("ffffffff")]
    caller = user[0][0] if user else "?"
    if any(sym in _SOFTIRQ for sym in kernel):
        return "softirq"
    if "exc_page_fault" in kernel or "asm_exc_page_fault" in kernel:
        return f"page fault in {caller}"
    if kernel:
        return f"kernel from {caller}"
    return f"user code in {_library(user[0][1])}" if user else "user code"


def _library(path: str) -> str:
    """A shared object's name; a Python package's extension (libtorrent's binding, all of libtorrent
    linked in) by its package."""
    p = Path(path)
    return p.parent.name if p.name.startswith("__init__.") else p.name


@dataclass
class Split:
    """Samples and context switches per (group, class), and the idle task's softirq samples."""

    samples: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    switches: Counter[str] = field(default_factory=Counter)
    idle_softirq: int = 0


def split(lines: Iterable[str], threads: Threads) -> Split:
    """Read `perf script -F comm,pid,tid,event,ip,sym,dso` of a recording with cpu-clock samples (with
    call graphs) and context-switch events."""
    out = Split()
    current: tuple[str, int, int] | None = None
    frames: list[tuple[str, str, str]] = []

    def flush() -> None:
        if current is None:
            return
        comm, pid, tid = current
        what = classify(frames)
        group = threads.group(comm, pid, tid)
        if group is not None:
            out.samples[group][what] += 1
        elif pid == 0 and what == "softirq":
            out.idle_softirq += 1

    for line in lines:
        if line.startswith("\t"):
            frame = _FRAME.match(line)
            if frame and current is not None:
                frames.append((frame["addr"], frame["sym"], frame["dso"]))
            continue
        head = _HEADER.match(line)
        if head is None:
            continue
        flush()
        current, frames = None, []
        comm, pid, tid = head["comm"], int(head["pid"]), int(head["tid"])
        if head["event"].startswith("context-switches"):
            group = threads.group(comm, pid, tid)
            if group is not None:
                out.switches[group] += 1
        else:
            current = (comm, pid, tid)
    flush()
    return out


def table(s: Split, gib: float) -> list[str]:
    """The split as lines of text: a row per class, a column per group, in CPU-s per GiB delivered."""
    groups = sorted(s.samples, key=lambda g: -sum(s.samples[g].values()))
    if not groups:
        return ["  perf: no samples of the measured processes"]
    per = 1 / HZ / gib
    total: Counter[str] = Counter()
    for g in groups:
        total.update(s.samples[g])
    top = [what for what, _ in total.most_common(ROWS)]
    width = max(len(w) for w in [*top, "context switches per GiB"]) + 2
    lines = ["  where the CPU went, CPU-s per GiB delivered (perf):"]
    lines.append("    " + "".join([" " * width, *(f"{g:>24}" for g in groups)]))
    for what in top:
        cells = "".join(f"{s.samples[g][what] * per:>24.3f}" for g in groups)
        lines.append("    " + f"{what:<{width}}" + cells)
    rest = {g: sum(n for w, n in s.samples[g].items() if w not in top) for g in groups}
    lines.append("    " + f"{'the rest':<{width}}" + "".join(f"{rest[g] * per:>24.3f}" for g in groups))
    sums = {g: sum(s.samples[g].values()) for g in groups}
    lines.append("    " + f"{'total':<{width}}" + "".join(f"{sums[g] * per:>24.3f}" for g in groups))
    switches = "".join(f"{s.switches[g] / gib:>24.0f}" for g in groups)
    lines.append("    " + f"{'context switches per GiB':<{width}}" + switches)
    lines.append(f"    softirq in the idle task: {s.idle_softirq * per:.3f} CPU-s per GiB")
    return lines


def missing() -> str | None:
    """Why a round cannot be profiled here, or None."""
    return None if shutil.which("perf") else "needs `perf` (Debian: apt-get install linux-perf)"


class Recording:
    """`perf record` of the whole machine from `start` to `stop`, into `path`."""

    def __init__(self, path: Path, threads: Threads) -> None:
        self.path = path
        self.threads = threads
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            "perf", "record", "-a", "-g", "-o", str(self.path),
            "-e", f"cpu-clock/freq={HZ}/", "-e", "context-switches/period=1,call-graph=no/",
        ]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)  # perf writes its file out on SIGINT
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def report(self, gib: float) -> list[str]:
        if not self.path.exists():
            return ["  perf: no recording"]
        script = subprocess.run(
            ["perf", "script", "-i", str(self.path), "-F", "comm,pid,tid,event,ip,sym,dso"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        return table(split(script.stdout.splitlines(), self.threads), gib)
