from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port, in_ci, require

# The shared fixtures for every test module: the origin, tracker and agents (make_hub, make_origin,
# origin, tracker, make_agent) and the in-process tracker's stores (redis_url, store_settings). A
# module's own fixture of the same name (e.g. test_fetch's `origin`) takes precedence there.
pytest_plugins = [
    "tests.support.cluster", "tests.support.trackerkit", "tests.support.s3kit", "tests.support.storekit"
]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point every cache and state dir at tmp_path; drop ambient tokens and endpoints.

    No test touches the user's home, and none sees a developer's HF_TOKEN.
    """
    for name in list(os.environ):
        if name.startswith(("WEIGHTSWARM_", "HF_", "HUGGING_FACE_")):
            monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture
def unused_tcp_port() -> int:
    return free_port()


@pytest.fixture
def mounted_tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mount a small tmpfs (tests run as root in CI); `require` (skip locally, fail in CI) where mounting
    is not permitted."""
    mounts: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
        if res.returncode != 0:
            require("a tmpfs mount", f"cannot mount one here (needs root): {res.stderr.decode().strip()}")
        mounts.append(path)
        return path

    yield mount
    for path in reversed(mounts):
        subprocess.run(["umount", "-l", str(path)], check=False)


_OPT_IN_MARKERS = ("slow", "multinode")
_CHAOS = "chaos"
"""The short chaos run (tests/multinode/test_chaos.py): opt-in everywhere, CI included (its minutes
do not fit CI's budget); deselected, not skipped, unless `-m` names it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow` and `multinode` tests are opt-in on a developer's machine: they run only when `-m` names
    their marker. CI (`CI` set, see tests.support.procs.in_ci) runs them all. `chaos`: see `_CHAOS`."""
    markexpr = config.getoption("markexpr", "") or ""
    if _CHAOS not in markexpr:
        chaos = [item for item in items if item.get_closest_marker(_CHAOS) is not None]
        if chaos:
            config.hook.pytest_deselected(items=chaos)
            items[:] = [item for item in items if item.get_closest_marker(_CHAOS) is None]
    if in_ci():
        return
    for name in _OPT_IN_MARKERS:
        if name in markexpr:
            continue
        skip = pytest.mark.skip(reason=f"opt-in: select with -m {name} (CI runs it)")
        for item in items:
            if item.get_closest_marker(name) is not None:
                item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI nothing skips: a skip there is a test that silently did not run (a dependency `./dev`
    should have installed, a `pytest.skip` added without `tests.support.procs.require`), so it fails."""
    report: pytest.TestReport = yield
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"
    return report
