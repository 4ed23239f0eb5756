"""Shared test helpers: bounded waits, free ports, stopping processes. No sleeps without a bound."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

from bench.redis_server import RedisServer

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


def in_ci() -> bool:
    """Whether this is a CI run: `CI` set to anything but empty/0/false (CI services set CI=true;
    `.ci/run` sets it too)."""
    import os

    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def require(what: str, reason: str) -> NoReturn:
    """Call where `what` (a tool, a module, root) is missing: a failure in CI, where `./dev` installs
    every dependency and runs as root, so a silent skip would hide that a test never ran; a skip
    that says how to get it on a developer's machine. Usable at module level too."""
    import pytest

    message = f"{what} missing: {reason}"
    if in_ci():
        pytest.fail(f"{message} (in CI a dependency that ./dev installs is a failure)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_module(name: str, reason: str) -> ModuleType:
    """`import name`, or `require` it (fail in CI, skip elsewhere) when it cannot be imported."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require(f"Python module {name}", f"{reason} ({exc})")


def require_root(reason: str) -> None:
    """`require` root (CI runs as root) unless this process is root."""
    import os

    if os.geteuid() != 0:
        require("root", reason)


class RedisProcess(RedisServer):
    """bench.redis_server's private redis-server; `require`d (a failure in CI, a skip elsewhere)."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            require("redis-server", "Debian package redis-server (./dev installs it)")
        super().__init__(binary, workdir)
