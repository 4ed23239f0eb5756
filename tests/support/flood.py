"""An attacker's process that holds idle TCP connections: `python -m tests.support.flood PORT COUNT ADDR...`
opens COUNT connections to 127.0.0.1:PORT from the ADDRs in turn, sends nothing, prints "ready" and keeps
them until its stdin closes. A process of its own: each holds at most its open-file limit of sockets, so
a flood larger than one process's limit is several of them (`Flood`)."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from types import TracebackType

_PER_PROCESS = 8_000


def hold(port: int, count: int, addresses: list[str]) -> list[socket.socket]:
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((addresses[i % len(addresses)], 0))
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


class Flood:
    """`count` idle connections to 127.0.0.1:`port` from `addresses`, held by child processes until exit."""

    def __init__(self, port: int, count: int, addresses: list[str]) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        for start in range(0, count, _PER_PROCESS):
            n = min(_PER_PROCESS, count - start)
            argv = [sys.executable, "-m", "tests.support.flood", str(port), str(n), *addresses]
            self.procs.append(
                subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            )

    def __enter__(self) -> Flood:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded: the child exits (EOF) if it fails
            assert line.strip() == "ready", f"flood process said {line!r}"
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def main() -> None:
    port, count, addresses = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    socks = hold(port, count, addresses)
    print("ready", flush=True)
    sys.stdin.read()
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
