"""Object stores for the bucket tests, one fixture per role whatever the store: `store` is moto's S3
server (tests.support.s3kit) or Azurite (tests.support.azurekit), by parameter, so one test runs against
both; `store_bucket` a fresh bucket (container) of the test's own, `store_proxy` the byte-counting fault
proxy in front of it, `store_env` this process's credentials for it, through the proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.azurekit import AzuriteServer
from tests.support.s3kit import FaultProxy, Store

STORES = ("s3", "az")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """One Azurite for the session (it takes about 2 s to start); tests keep apart by container.
    `require`d: node and `./dev tools`' azurite."""
    server = AzuriteServer(tmp_path_factory.mktemp("azurite"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Store:
    """The session's server of this parameter's kind, started on first use."""
    server: Store = request.getfixturevalue({"s3": "s3_server", "az": "azurite"}[request.param])
    return server


@pytest.fixture
def store_bucket(store: Store) -> Iterator[str]:
    """A fresh bucket (an Azure container) of this test's own, removed after it."""
    bucket = f"ws-{uuid.uuid4().hex[:20]}"
    store.create_bucket(bucket)
    yield bucket
    store.delete_bucket(bucket)


@pytest.fixture
def store_proxy(store: Store) -> Iterator[FaultProxy]:
    """A FaultProxy of this test's own (fresh counters, no faults) in front of `store`."""
    proxy = FaultProxy(store)
    yield proxy
    proxy.stop()


@pytest.fixture
def store_env(store: Store, store_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's cloud credentials for `store`, through `store_proxy` (obstore reads them when a
    store client starts)."""
    env = store.env(endpoint=store_proxy.endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env
