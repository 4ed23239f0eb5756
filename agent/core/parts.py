"""A blob that comes in parts (agent.relay.directory "Parts"): what the swarm's policy hands the
origin engine (`Shares`), and the handle through which a part's feed writes it (`PartSink`, implemented
by agent.origin.ranges `Share`). Here, below both, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agent.core.plan import FileEntry


class PartSink(Protocol):
    """A feed's handle on its part [start, end) of the blob; thread-safe."""

    start: int
    end: int
    entry: FileEntry

    @property
    def pos(self) -> int:
        """The first byte of the part not written yet (`end` when the part is whole)."""

    @property
    def cancelled(self) -> bool:
        """The blob failed or finished: stop feeding."""

    def write(self, pos: int, data: bytes | memoryview) -> None:
        """`data` at `pos`, which must be `pos` above (a part is written in order); raises once the blob
        is done with (the feed's stream stops there)."""

    def take_over(self) -> None:
        """Nobody else brings the rest of this part: the origin engine pulls it itself."""

    def fail(self, exc: BaseException) -> None:
        """What this feed wrote may be wrong (its source failed its check): the blob fails with `exc`."""


Feed = Callable[[PartSink], None]
"""Brings one part of a blob (writing it through its `PartSink`), or calls `take_over`; runs on a thread."""


class Written(Protocol):
    """What the origin engine says of the blob's file while it writes it (agent.origin.chunks `BlobJob`)."""

    def extent(self, pos: int) -> int:
        """How far from `pos` the file is written (a reader may serve that far)."""

    def present(self, start: int, end: int) -> int:
        """Bytes of [start, end) written so far, in any order."""

    @property
    def streamed(self) -> int:
        """Bytes read from the origin so far, written or not yet: grows smoothly (writes come a block
        per connection at a time), so the origin rate is measured on it."""


@dataclass
class Shares:
    """How a blob's parts come when several nodes pull it from the origin at once. Byte ranges are
    chunk-aligned and cover the blob; `own` is pulled from the origin at once, each of `feeds` brings
    one other part."""

    own: list[tuple[int, int]]
    feeds: list[tuple[tuple[int, int], Feed]]
    _written: Written | None = field(default=None, repr=False)

    def bind(self, written: Written) -> None:
        """Set by the origin engine once it writes the blob."""
        self._written = written

    def written_end(self, pos: int) -> int:
        """How far from `pos` the file is written (a reader may serve that far); `pos` before the start."""
        return pos if self._written is None else self._written.extent(pos)

    def present(self, start: int, end: int) -> int:
        """Bytes of [start, end) written so far, in any order."""
        return 0 if self._written is None else self._written.present(start, end)

    def streamed(self) -> int:
        """Bytes this node read from the origin for the blob so far (its origin rate is measured on it)."""
        return 0 if self._written is None else self._written.streamed
