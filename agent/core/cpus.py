"""How many CPUs this process can use: those it may run on (its affinity), capped by its cgroup's CPU
quota (a container's CPU limit). `os.cpu_count()` sees neither: in a pod it counts the host's CPUs."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where cgroup v2 is mounted; a v1 hierarchy has no `cpu.max`, and then only the affinity counts."""


def usable_cpus(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _quota(proc_cgroup, root)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def _quota(proc_cgroup: Path, root: Path) -> float | None:
    """CPUs' worth of time per period that this process's cgroup v2 allows, or None without a limit."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if own is None:
        return None
    try:
        limit, period = (root / own.lstrip("/") / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        return None
