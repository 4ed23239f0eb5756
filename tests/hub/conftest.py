"""The hub tests drive the real huggingface_hub over plain HTTP: hf_xet is installed, and a 2026 answer's
X-Xet-Hash would send it to a CAS this hub does not serve."""

from __future__ import annotations

import pytest
from huggingface_hub import constants


@pytest.fixture(autouse=True)
def no_xet(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_DISABLE_XET once, when `constants` is imported: the environment
    # variable alone would not reach a process that has imported it already.
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
