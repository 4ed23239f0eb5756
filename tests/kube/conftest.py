"""Fixtures every kube test shares: the fake API server, and a real kubernetes client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support.fake_kube import FakeKube


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


@pytest.fixture
def api(kube: FakeKube) -> Iterator[client.ApiClient]:
    api_client = client.ApiClient(client.Configuration(host=kube.url))
    yield api_client
    api_client.close()
