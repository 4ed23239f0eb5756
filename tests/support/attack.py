"""An attacker's process that keeps COUNT hostile requests open against a listener for SECONDS, opening a
new connection for each one the server closes: `python -m tests.support.attack TARGET COUNT MODE PATH
SECONDS ADDR...` (TARGET: a TCP port on 127.0.0.1, or a unix socket's path). Modes (issue 62's attacks 1
and 2):
- `head`: a request line, then header lines of 4 KiB, one per connection every `_ROUND` seconds, never the
  blank line that ends the head;
- `body`: a whole head announcing a 4 KiB body (a POST to PATH, a route that reads its body), then
  nothing.
It prints "ready" once the first COUNT connections are open, and at the end one JSON line: the statuses the
server answered with (their count), the connections it closed without a word, and the connections made.
A process of its own (its sockets count against its own open-file limit); `Attack` runs several."""

from __future__ import annotations

import json
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections import Counter
from types import TracebackType

_PER_PROCESS = 4_000
_ROUND = 0.2
"""Seconds between two header lines on one connection (`head`)."""
_LINE = b"X-Grow: " + b"a" * 4086 + b"\r\n"
_HEADS = {
    "head": b"GET %s HTTP/1.1\r\nHost: victim\r\n",
    "body": b"POST %s HTTP/1.1\r\nHost: victim\r\nContent-Type: application/json\r\n"
    b"Content-Length: 4096\r\n\r\n",
}


class Attack:
    """`count` hostile connections of `mode` to `path` of `target` from `addresses` for `seconds`, held by
    child processes; `results` after the block: each child's summary."""

    def __init__(
        self, target: int | str, count: int, mode: str, path: str, seconds: float, addresses: list[str]
    ) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.results: list[dict[str, object]] = []
        for start in range(0, count, _PER_PROCESS):
            n = min(_PER_PROCESS, count - start)
            argv = [sys.executable, "-m", "tests.support.attack", str(target), str(n), mode, path]
            argv += [str(seconds), *addresses]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)

    def __enter__(self) -> Attack:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded: the child exits (EOF) if it fails
            assert line.strip() == "ready", f"attack process said {line!r}"
        return self

    def wait(self, timeout: float) -> None:
        """Until every child has ended its attack (bounded by `timeout`), collecting their summaries."""
        for proc in self.procs:
            assert proc.stdout is not None
            out, _ = proc.communicate(timeout=timeout)
            self.results.append(json.loads(out.strip().splitlines()[-1]))

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def total(self, key: str) -> Counter[str]:
        """`key`'s counters of every child summed."""
        out: Counter[str] = Counter()
        for result in self.results:
            out.update(result[key])  # type: ignore[arg-type]
        return out


def _connect(target: str, address: str) -> socket.socket:
    if target.isdigit():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((address, 0))
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", int(target)))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(target)
    return s


def main() -> None:
    target, count, mode, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    seconds, addresses = float(sys.argv[5]), sys.argv[6:] or ["127.0.0.1"]
    head = _HEADS[mode] % path.encode()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    sel = selectors.DefaultSelector()
    statuses: Counter[str] = Counter()
    made = 0

    def open_one(slot: int) -> None:
        nonlocal made
        s = _connect(target, addresses[slot % len(addresses)])
        made += 1
        sel.register(s, selectors.EVENT_READ, [slot, b"", False])

    def closed(s: socket.socket, answer: bytes) -> None:
        slot = sel.get_key(s).data[0]
        sel.unregister(s)
        s.close()
        statuses[answer[9:12].decode("ascii", "replace") if answer.startswith(b"HTTP/1.1 ") else "none"] += 1
        if time.monotonic() < ends:
            open_one(slot)

    ends = time.monotonic() + seconds
    for slot in range(count):
        open_one(slot)
    print("ready", flush=True)
    next_round = time.monotonic()
    while time.monotonic() < ends:
        for key, _ in sel.select(timeout=_ROUND / 4):
            s, state = key.fileobj, key.data
            assert isinstance(s, socket.socket)
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            state[1] += chunk
            if not chunk:
                closed(s, state[1])
        if time.monotonic() >= next_round:
            next_round += _ROUND
            for key in list(sel.get_map().values()):
                s, state = key.fileobj, key.data
                assert isinstance(s, socket.socket)
                data = _LINE if state[2] else head
                if state[2] and mode == "body":
                    continue
                try:
                    s.send(data)
                    state[2] = True
                except (BlockingIOError, InterruptedError):
                    pass  # not connected yet, or the server reads no more: the next round
                except OSError:
                    closed(s, state[1])
    held = len(sel.get_map())
    for key in list(sel.get_map().values()):
        sel.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
    print(json.dumps({"statuses": dict(statuses), "made": {"connections": made}, "held": {"at end": held}}))


if __name__ == "__main__":
    main()
