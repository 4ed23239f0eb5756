"""Process helpers shared by the benchmarks and the tests (tests.support.procs re-exports them): bounded
waits, free ports, stopping processes by their PID. No sleeps without a bound."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def loop_until(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> T:
    """Call `predicate` until it returns a truthy value or `timeout` seconds pass (then fail)."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
        last = predicate()
    return last


def listening(proc: subprocess.Popen[Any], port: int, log: Path, name: str) -> bool:
    """Whether the server `proc` accepts on 127.0.0.1:`port` yet; fails with its log's tail if it exited."""
    if proc.poll() is not None:
        raise AssertionError(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on `host`, for TCP and UDP, and that no outgoing connection
    will take before the server binds it.

    A port the kernel hands out for bind(0) comes from the ephemeral range, which the source ports of
    outgoing connections come from too: between the probe and a subprocess's bind, any connection in
    the run may take it ("address already in use", seen in CI). So the ports come from below that
    range, each xdist worker from its own slice, in turn: a port is not handed out twice in a run
    until its slice wraps around."""
    for _ in range(_PORTS.span):
        port = next(_PORTS)
        if _bindable(host, port):
            return port
    raise AssertionError(f"no free port in {_PORTS}")


class _PortSlice:
    """This process's slice of the ports between FIRST_PORT and the ephemeral range, walked in order
    from an offset that differs per process (two test runs at once start apart)."""

    FIRST_PORT = 10000

    def __init__(self) -> None:
        try:
            ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            ephemeral = 32768
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        self.span = (ephemeral - self.FIRST_PORT) // max(workers, 1)
        if self.span < 100:
            raise RuntimeError(f"the ephemeral port range starts at {ephemeral}: too few ports below it")
        self.start = self.FIRST_PORT + worker * self.span
        self._next = os.getpid() % self.span

    def __next__(self) -> int:
        port = self.start + self._next
        self._next = (self._next + 1) % self.span
        return port

    def __str__(self) -> str:
        return f"{self.start}-{self.start + self.span - 1}"


_PORTS = _PortSlice()


def _bindable(host: str, port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stop `proc` if it still runs: SIGTERM, then SIGKILL after `grace` seconds; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    _close_pipes(proc)


def kill_process(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL `proc` if it still runs and reap it (teardown after a test that expected it to exit)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    _close_pipes(proc)


def _close_pipes(proc: subprocess.Popen[Any]) -> None:
    # An unclosed pipe is a ResourceWarning, and warnings are errors in this suite.
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
