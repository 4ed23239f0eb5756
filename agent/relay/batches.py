"""A relayed blob's bytes off the socket a batch at a time, for a receiver that writes them from its buffer.

A socket with a Python timeout is polled before each `recv`, and each `recv` brings what one look finds:
on a warm chain of eight nodes on two cores, where every receiver keeps up with its source, that was a
poll, a receive and a turn of the receiver's Python loop every few tens of KiB. Here the socket blocks,
`MSG_WAITALL` asks the kernel for the whole batch in one call, and `SO_RCVTIMEO` bounds that call: the
kernel returns what came when the batch is full or the wait is up, so a batch is written at most `within`
seconds after its first byte, as the nodes below in a chain need.
"""

from __future__ import annotations

import socket
import struct
import time


class BatchReader:
    """Reads from `sock` (left blocking, its receive wait `within` seconds); `stall` seconds without a
    byte is a TimeoutError."""

    def __init__(self, sock: socket.socket, within: float, stall: float) -> None:
        self.sock, self.stall = sock, stall
        sock.settimeout(None)
        whole = int(within)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((within - whole) * 1e6))
        )
        self.heard = time.monotonic()

    def read_into(self, view: memoryview) -> int | None:
        """Bytes received into `view`: all of it unless the wait ran out (or a signal came), 0 at the
        stream's end, None when no byte came within the wait."""
        try:
            n = self.sock.recv_into(view, len(view), socket.MSG_WAITALL)
        except BlockingIOError:
            if time.monotonic() - self.heard > self.stall:
                raise TimeoutError(f"no byte for {self.stall:.0f}s") from None
            return None
        self.heard = time.monotonic()
        return n
