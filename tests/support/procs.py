"""Shared test helpers: bounded waits, free ports, stopping processes (bench.procs, shared with the
benchmarks), and `require` for what a test needs. No sleeps without a bound."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from bench.procs import free_port as free_port
from bench.procs import kill_process as kill_process
from bench.procs import listening as listening
from bench.procs import loop_until as loop_until
from bench.procs import stop_process as stop_process
from bench.redis_server import RedisServer


def in_ci() -> bool:
    """Whether this is a CI run: `CI` set to anything but empty/0/false (CI services set CI=true;
    `.ci/run` sets it too)."""
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
    if os.geteuid() != 0:
        require("root", reason)


class RedisProcess(RedisServer):
    """bench.redis_server's private redis-server; `require`d (a failure in CI, a skip elsewhere)."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            require("redis-server", "Debian package redis-server (./dev installs it)")
        super().__init__(binary, workdir)
