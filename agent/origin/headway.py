"""Whether a blob coming from the origin makes headway: its progress judged in bytes over time, never by
answers alone (agent.origin.ranges asks; this decides).

A blob reserves its whole listed size before its first byte (agent.cache.partial `Reservation`), so an
origin that lists a large file and then keeps answering with a little more each time would pin that
reservation for as long as it likes: each answer ending at a new byte looks like progress to a rule that
counts answers at one byte, and to a patience that restarts on any moved byte. Two bounds stop it:

- **meagre answers**: answers that end before the bytes they promised (a closed or dropped connection)
  having brought less than `MEAGRE` bytes; `FetchSettings.origin_short_answers` of them within one
  window make the origin's listed length a lie (`OriginLengthError`: no resume can help, the partial
  goes). `SAME_BYTE` answers of one reader in a row ending at the same byte say so sooner.
- **a rate floor**: over each `FetchSettings.origin_rate_window` seconds, the blob must bring at least
  `FetchSettings.origin_min_rate` bytes a second, from the origin and from feeds alike (an
  `OriginStalledError`: the partial keeps what it has, and gives back the rest of its reservation).
  Time spent waiting out an origin that said "later" (429, 5xx: `Origin.patiently`'s own bound)
  or stepping aside for other work does not count.

A later rule that lowers a file's streams (a CDN refusing a second one) composes with this: fewer
streams bring fewer bytes, and only the blob's bytes over time are judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MEAGRE = 1 << 20
"""Bytes below which an answer that ended early brought too little to count as headway: an honest
connection that drops mid-range has usually brought megabytes; an origin that cuts every answer short
to look busy brings a few bytes each time."""
SAME_BYTE = 3
"""Answers of one reader in a row ending early at the same byte: the origin has no byte past it."""


@dataclass
class Headway:
    """One blob's progress (guarded by its job's lock). `min_rate` in bytes/s over `window` seconds;
    `short_answers`: meagre answers within a window that end the blob."""

    min_rate: float
    window: float
    short_answers: int
    since: float
    """When the current rate window began (monotonic), moved on by time that does not count."""
    base: int = 0
    """The blob's bytes when the rate window began."""
    meagre: list[tuple[float, int]] = field(default_factory=list)
    """(when, bytes brought) of the meagre answers of the last `window` seconds."""
    _held_at: float | None = field(default=None, repr=False)

    def short_answer(self, brought: int, now: float) -> str | None:
        """An answer ended early having brought `brought` bytes: why the origin cannot send what it lists
        (its `short_answers`-th meagre answer within a window), or None."""
        if brought >= MEAGRE:
            return None
        self.meagre = [m for m in self.meagre if now - m[0] < self.window]
        self.meagre.append((now, brought))
        if len(self.meagre) < self.short_answers:
            return None
        got = sum(n for _, n in self.meagre)
        return (
            f"{len(self.meagre)} answers ended early within {self.window:.0f} s, bringing {got} bytes in all "
            f"(less than {MEAGRE} each)"
        )

    def hold(self, now: float, idle: bool) -> None:
        """While `idle` (waiting out the origin, stepping aside), time does not count against the floor."""
        if idle and self._held_at is None:
            self._held_at = now
        elif not idle and self._held_at is not None:
            self.since += now - self._held_at
            self._held_at = None

    def judge(self, now: float, total: int) -> str | None:
        """`total`: the blob's bytes so far. Why it makes no headway (less than the floor over a whole
        window), or None; a window that passed the floor starts the next."""
        if self._held_at is not None or now - self.since < self.window:
            return None
        got = total - self.base
        if got < self.min_rate * (now - self.since):
            rate = got / (now - self.since)
            return (
                f"brought {got} bytes in {now - self.since:.0f} s ({rate:.0f} B/s, less than the floor "
                f"of {self.min_rate:.0f} B/s)"
            )
        self.since, self.base = now, total
        return None
