"""Progress on stderr: a total line plus one per active file (bytes, bytes/s, ETA).

On a TTY the block is redrawn in place (ANSI cursor-up) at most ~8 times a second; otherwise
(CI logs, kubectl logs) a plain line per file start/finish and a total line every few seconds,
so logs stay short. No dependency beyond the standard library. Thread-safe: download workers
call `FileProgress.advance` from many threads.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

_TTY_INTERVAL = 0.12
_PLAIN_INTERVAL = 5.0
_MIN_RATE_SECONDS = 0.5
"""No rate is shown over a shorter interval: a blob that was cached, or arrived in one step, has none
(bytes over a few microseconds once read as "3.7 TiB/s")."""


def _rate(done: int, started: float) -> float | None:
    elapsed = time.monotonic() - started
    return done / elapsed if elapsed >= _MIN_RATE_SECONDS else None


def rate_text(done: int, started: float) -> str:
    """`12.3 MiB/s`, or `--` when too little time has passed to say."""
    rate = _rate(done, started)
    return "--" if rate is None else f"{human_bytes(rate)}/s"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def _eta(remaining: float, rate: float) -> str:
    if rate <= 0:
        return "--:--"
    s = int(remaining / rate)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def _how(fp: FileProgress) -> str:
    """How a finished file came: `cached`, `from peers, 12.3 MiB/s`, or just its size when too quick
    for a rate."""
    if fp.source == "cache":
        return "cached"
    rate = _rate(fp.done, fp.started)
    parts = [f"from {fp.source}"] if fp.source in ("peers", "origin") else []
    parts.append(human_bytes(fp.done) if rate is None else f"{human_bytes(rate)}/s")
    return ", ".join(parts)


class FileProgress:
    """One file's counters; created by `Progress.start_file`."""

    def __init__(self, owner: Progress, name: str, size: int) -> None:
        self._owner = owner
        self.name = name
        self.size = size
        self.done = 0
        self.started = time.monotonic()
        self.source: str | None = None
        """Where the bytes came from, when the caller knows: "cache", "peers" or "origin"."""

    def advance(self, n: int) -> None:
        self._owner._advance(self, n)

    def set_stage(self, stage: str) -> None:
        """Where the file is now ("lease", "origin", "peers", "verifying"): for sinks that show it."""
        self._owner._stage(self, stage)

    def finish(self, source: str | None = None) -> None:
        if source is not None:
            self.source = source
        self._owner._finish(self, failed=False)

    def fail(self) -> None:
        """The file did not arrive (its error reaches the user once, in the fetch's summary)."""
        self._owner._finish(self, failed=True)


class Progress:
    """Aggregate progress for one fetch. `Progress(quiet=True)` prints nothing."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = 0
        self.done = 0
        self._lock = threading.Lock()
        self._active: list[FileProgress] = []
        self._t0 = time.monotonic()
        self._last_draw = 0.0
        self._drawn_lines = 0

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = total
            self._t0 = time.monotonic()

    def message(self, text: str) -> None:
        """A plain line (above the bar on a TTY)."""
        if self.quiet:
            return
        with self._lock:
            self._clear()
            print(text, file=self.stream, flush=True)
            self._draw(force=True)

    def start_file(self, name: str, size: int) -> FileProgress:
        fp = FileProgress(self, name, size)
        with self._lock:
            self._active.append(fp)
            if not self.tty and not self.quiet:
                print(f"  fetching {name} ({human_bytes(size)})", file=self.stream, flush=True)
        return fp

    def close(self) -> None:
        with self._lock:
            self._clear()
            if not self.quiet and self.total:
                print(
                    f"  total {human_bytes(self.done)} in {time.monotonic() - self._t0:.1f}s "
                    f"({rate_text(self.done, self._t0)})",
                    file=self.stream,
                    flush=True,
                )

    # --- internals (called with or taking the lock) ------------------------------------------------

    def _advance(self, fp: FileProgress, n: int) -> None:
        with self._lock:
            fp.done += n
            self.done += n
            self._draw()

    def _stage(self, fp: FileProgress, stage: str) -> None:
        """A terminal shows bytes and rates only; a daemon job's sink records the stage."""

    def _finish(self, fp: FileProgress, failed: bool) -> None:
        with self._lock:
            if fp in self._active:
                self._active.remove(fp)
            if not self.tty and not self.quiet:
                line = f"  failed {fp.name}" if failed else f"  done {fp.name} ({_how(fp)})"
                print(line, file=self.stream, flush=True)
            self._draw(force=True)

    def _line(self, label: str, done: int, size: int, started: float) -> str:
        rate = _rate(done, started) or 0.0
        pct = 100.0 * done / size if size else 100.0
        return (
            f"{label[:48]:<48} {pct:5.1f}% {human_bytes(done):>11} / {human_bytes(size):<11} "
            f"{rate_text(done, started):>13} ETA {_eta(size - done, rate)}"
        )

    def _clear(self) -> None:
        if self.tty and self._drawn_lines:
            self.stream.write("\x1b[1A\x1b[2K" * self._drawn_lines)
            self._drawn_lines = 0

    def _draw(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        interval = _TTY_INTERVAL if self.tty else _PLAIN_INTERVAL
        if not force and now - self._last_draw < interval:
            return
        if not self.tty and force:
            return  # plain mode: per-file lines are printed by start/finish; totals on the interval
        self._last_draw = now
        lines = [self._line("total", self.done, self.total, self._t0)]
        if self.tty:
            lines += [self._line("  " + f.name, f.done, f.size, f.started) for f in self._active[:8]]
            self._clear()
            self.stream.write("".join(line + "\n" for line in lines))
            self.stream.flush()
            self._drawn_lines = len(lines)
        else:
            print(lines[0], file=self.stream, flush=True)
