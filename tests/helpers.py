"""Shared test helpers: bounded waits, free ports, stopping processes. No sleeps without a bound."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
