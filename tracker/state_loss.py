"""Noticing that the store lost the swarm state under a running tracker, and the amnesty after it."""

from __future__ import annotations

import time

from tracker.store import StoreLifecycle


class StateLoss:
    """Notices the store losing the swarm state under this running tracker (`Store.epoch` changed
    since it last looked) and says whether that was under `settings.lease_amnesty` seconds ago."""

    def __init__(self, store: StoreLifecycle, amnesty: float) -> None:
        self._store = store
        self._amnesty = amnesty
        self._seen: str | None = None
        self._at: float | None = None

    async def check(self) -> str:
        """The store's epoch now (noting a change)."""
        epoch = await self._store.epoch()
        if self._seen is not None and epoch != self._seen:
            self._at = time.monotonic()
        self._seen = epoch
        return epoch

    async def amnesty_left(self) -> float:
        """Seconds of amnesty left after the last loss: 0 when none is under way."""
        await self.check()
        return 0.0 if self._at is None else max(0.0, self._amnesty - (time.monotonic() - self._at))
