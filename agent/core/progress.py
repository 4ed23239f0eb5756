"""Progress on stderr: a total line plus one per active file (bytes, bytes/s, ETA).

On a TTY the block is redrawn in place (ANSI cursor-up) at most ~8 times a second, every line cut to
the terminal's width (read at each redraw, so a resize is followed: a line that wrapped would leave
junk that cursor-up cannot reach), and cleared when the fetch ends; otherwise
(CI logs, kubectl logs) a plain line per file start/finish and a total line every few seconds,
so logs stay short. While a block is drawn on a terminal, log lines (a retry's warning) go above it
through `message` (agent.cli.logs asks `on_terminal`): written past it, the next redraw's cursor-up
would erase them and leave a stale part of the block behind. No dependency beyond the standard library.
Thread-safe: download workers call `FileProgress.advance` from many threads.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import threading
import time
from typing import TextIO

_TTY_INTERVAL = 0.12
_PLAIN_INTERVAL = 5.0
_MIN_RATE_SECONDS = 0.5
"""No rate is shown over a shorter interval: a blob that was cached, or arrived in one step, has none
(bytes over a few microseconds once read as "3.7 TiB/s")."""


_shown: Progress | None = None
"""The progress block drawn on a terminal now, if any (`on_terminal`)."""


def on_terminal() -> Progress | None:
    """The progress block being redrawn on a terminal now: a log line goes above it (`Progress.message`)."""
    return _shown


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
        """Where the file is now ("lease", "locked", "origin", "peers", "verifying"): for sinks showing it."""
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
        self._closed = False
        """After `close` the block is not drawn again: later messages must not bring back a stale total."""

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = total
            self._t0 = time.monotonic()

    def message(self, text: str) -> None:
        """A plain line (above the bar on a TTY, wrapped to its width)."""
        if self.quiet:
            return
        with self._lock:
            self._clear()
            if self.tty:
                text = textwrap.fill(text, self._width(), subsequent_indent="  ", break_on_hyphens=False)
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
        global _shown
        with self._lock:
            self._clear()
            self._closed = True
            if _shown is self:
                _shown = None
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

    def _line(self, label: str, done: int, size: int, started: float, width: int = 0) -> str:
        """`label pct done / size rate ETA`; with `width`, cut to fit it: the label first, then the
        fields from the right (a 40-column terminal still shows name, percent and bytes)."""
        rate = _rate(done, started) or 0.0
        pct = 100.0 * done / size if size else 100.0
        fields = [f"{pct:5.1f}%", f"{human_bytes(done)} / {human_bytes(size)}", rate_text(done, started),
                  f"ETA {_eta(size - done, rate)}"]
        if not width:
            return f"{label[:48]:<48} {fields[0]} {fields[1]:>25} {fields[2]:>13} {fields[3]}"
        while fields:
            right = " ".join(fields)
            room = width - len(right) - 1
            if room >= min(12, len(label)):
                shown = label if len(label) <= room else label[: max(0, room - 1)] + "…"
                return f"{shown:<{room}} {right}"
            fields.pop()
        return label[:width]

    def _width(self) -> int:
        """Columns a line may use: the terminal's (of this stream, $COLUMNS first as `shutil` has it) less
        one spare, as a line filling the last column wraps on some terminals."""
        columns = 0
        if not os.environ.get("COLUMNS"):
            try:
                columns = os.get_terminal_size(self.stream.fileno()).columns
            except (AttributeError, OSError, ValueError):
                pass
        return max(20, (columns or shutil.get_terminal_size().columns) - 1)

    def _clear(self) -> None:
        if self.tty and self._drawn_lines:
            self.stream.write("\x1b[1A\x1b[2K" * self._drawn_lines)
            self._drawn_lines = 0

    def _draw(self, force: bool = False) -> None:
        global _shown
        if self.quiet or self._closed:
            return
        now = time.monotonic()
        interval = _TTY_INTERVAL if self.tty else _PLAIN_INTERVAL
        if not force and now - self._last_draw < interval:
            return
        if not self.tty and force:
            return  # plain mode: per-file lines are printed by start/finish; totals on the interval
        self._last_draw = now
        if self.tty:
            # One column spare: a line filling the last column wraps on some terminals.
            width = self._width()
            lines = [self._line("total", self.done, self.total, self._t0, width)]
            lines += [self._line("  " + f.name, f.done, f.size, f.started, width) for f in self._active[:8]]
            self._clear()
            self.stream.write("".join(line + "\n" for line in lines))
            self.stream.flush()
            self._drawn_lines = len(lines)
            _shown = self
        else:
            print(self._line("total", self.done, self.total, self._t0), file=self.stream, flush=True)
