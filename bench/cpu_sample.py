"""Where this machine's CPU goes while something else runs: every INTERVAL seconds, the CPU-seconds each
kind of process used (`agent serve`, `agent fetch`, the tracker, the test hub, bench scripts, other
processes, kernel threads) and the machine's totals from /proc/stat, steal included (the hypervisor
running other guests on these cores). Reads /proc only; starts and stops nothing.

Usage (beside a benchmark, in another shell):
  python3 -m bench.cpu_sample --duration 600 > cpu.txt

One line per interval: `HH:MM:SS agent=… cli=… … | busy=… user=… system=… softirq=… steal=…`, all in
CPU-seconds over that interval (two cores give at most 2 × INTERVAL).
"""

from __future__ import annotations

import argparse
import os
import time

_HZ = os.sysconf("SC_CLK_TCK")
_KINDS = (
    ("agent serve-hub", "hub"),
    ("agent serve", "agent"),
    ("agent fetch", "cli"),
    ("tracker serve", "tracker"),
    ("bench.", "bench"),
)


def kind(pid: str) -> str | None:
    """What process `pid` is (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if not cmd:
        return "kthread"
    return next((name for needle, name in _KINDS if needle in cmd), "other")


def processes() -> dict[int, tuple[str, float]]:
    """pid -> (kind, CPU-seconds used so far)."""
    out: dict[int, tuple[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        what = kind(pid)
        if what is not None:
            out[int(pid)] = (what, (int(fields[11]) + int(fields[12])) / _HZ)
    return out


def machine() -> list[float]:
    """/proc/stat's first line, in seconds: user nice system idle iowait irq softirq steal ..."""
    with open("/proc/stat") as f:
        return [int(x) / _HZ for x in f.readline().split()[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds to sample (default 600)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds per line (default 2)")
    args = ap.parse_args(argv)
    before, totals = processes(), machine()
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        time.sleep(args.interval)
        now, now_totals = processes(), machine()
        used: dict[str, float] = {}
        for pid, (what, cpu) in now.items():
            earlier = before[pid][1] if pid in before else 0.0
            used[what] = used.get(what, 0.0) + max(0.0, cpu - earlier)
        d = [b - a for a, b in zip(totals, now_totals, strict=False)]
        busy = sum(d) - d[3] - d[4]  # all but idle and iowait
        kinds = " ".join(f"{k}={v:.2f}" for k, v in sorted(used.items()) if v >= 0.01)
        print(
            f"{time.strftime('%H:%M:%S')} {kinds} | busy={busy:.2f} user={d[0]:.2f} system={d[2]:.2f} "
            f"softirq={d[6]:.2f} steal={d[7]:.2f}",
            flush=True,
        )
        before, totals = now, now_totals
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
