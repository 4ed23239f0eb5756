from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.chartkit import CHART, helm


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded
