from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import free_port


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
