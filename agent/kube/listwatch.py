"""List, then watch, one kind of object through the port (agent.kube.api): the loop every watcher of
the agent runs (pods: agent.kube.pods_in; nodes: agent.kube.fleet; ModelPreheats: agent.kube.preheat).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.settings import KubeSettings
from agent.kube.api import FORBIDDEN, GONE, ApiError, KubeApi, Query, Watch, describe

log = logging.getLogger(__name__)


@dataclass
class WatchStats:
    """Counters for logs, metrics and tests."""

    lists: int = 0
    watches: int = 0
    bookmarks: int = 0
    gone: int = 0
    errors: int = 0
    resource_version: str | None = None


class ListWatch:
    """List, then watch, one kind of object: resume from the last resourceVersion, relist on 410 Gone,
    reconnect with bounded jittered backoff. Subclasses say what to list (`query`) and act on objects
    (`_observe`: returns the object's key when still of interest; `_forget`; `_known`)."""

    what = "objects"
    """For logs: what is watched ("pods on node x")."""
    rbac_hint = ""
    """What a 403 means for the chart, in a log line."""

    def __init__(self, settings: KubeSettings, api: KubeApi) -> None:
        self._settings = settings
        self._api = api
        self._watch: Watch | None = None
        self.stats = WatchStats()

    def query(self) -> Query:
        """What both the list and the watch ask for."""
        raise NotImplementedError

    def _observe(self, obj: Mapping[str, Any]) -> str | None:
        raise NotImplementedError

    def _forget(self, key: str) -> None:
        raise NotImplementedError

    def _known(self) -> list[str]:
        """Keys of every object currently of interest (what a relist may find gone)."""
        raise NotImplementedError

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event, max_iterations: int | None = None) -> None:
        """List, then watch, until `stop` is set (or after `max_iterations` list/watch rounds).

        One iteration is one watch request (preceded by a list when needed), whether it ends
        normally (the server's timeoutSeconds), with 410 Gone (relist at once), or with an
        error (wait a bounded, jittered, growing delay and resume from the last resourceVersion).
        """
        done = threading.Event()
        waker = threading.Thread(
            target=self._stop_waker, args=(stop, done), name="kube-watch-stop", daemon=True
        )
        waker.start()
        # A second run() resumes where the last one stopped (a 410 makes it relist if too old).
        need_list = self.stats.resource_version is None
        failures = 0
        gone_streak = 0
        iterations = 0
        try:
            while not stop.is_set() and (max_iterations is None or iterations < max_iterations):
                iterations += 1
                delay = 0.0
                try:
                    if need_list:
                        self._relist()
                        need_list = False
                    if self._watch_once(stop):
                        gone_streak = 0
                    failures = 0
                except ApiError as exc:
                    if exc.status == GONE:
                        # History before our resourceVersion is compacted: only a fresh list is
                        # complete. Relist at once; back off only if 410s repeat without progress.
                        self.stats.gone += 1
                        gone_streak += 1
                        need_list = True
                        log.info("pod watch expired (410 Gone); relisting")
                        if gone_streak > 1:
                            delay = self._backoff(gone_streak - 1)
                    else:
                        failures += 1
                        delay = self._backoff(failures)
                        self._log_failure(exc, delay)
                except Exception as exc:  # noqa: BLE001 - dropped connections, bad JSON, timeouts
                    if stop.is_set():
                        break
                    failures += 1
                    delay = self._backoff(failures)
                    self._log_failure(exc, delay)
                if delay and stop.wait(delay):
                    break
        finally:
            done.set()
            waker.join(timeout=5)

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._settings.backoff_max, self._settings.backoff_base * 2.0 ** (attempt - 1))
        # Half fixed, half random: bounded below so a flapping server is not hammered, and
        # spread so a whole DaemonSet does not reconnect to a restarted API server in lockstep.
        return ceiling * random.uniform(0.5, 1.0)

    def _log_failure(self, exc: BaseException, delay: float) -> None:
        self.stats.errors += 1
        hint = ""
        if isinstance(exc, ApiError) and exc.status == FORBIDDEN:
            hint = f" ({self.rbac_hint})"
        log.warning("watch of %s failed: %s%s; retrying in %.1fs", self.what, describe(exc), hint, delay)

    def _stop_waker(self, stop: threading.Event, done: threading.Event) -> None:
        # A watch blocks in a socket read for up to watch_timeout; stopping it is the only prompt
        # way out. Repeat while running, since a new watch may start after a stop().
        while not done.is_set():
            if stop.wait(0.1):
                current = self._watch
                if current is not None:
                    current.stop()
                if done.wait(0.1):
                    return

    def _relist(self) -> None:
        items, rv = self._api.list(self.query())
        self.stats.lists += 1
        listed: set[str] = set()
        for obj in items:
            key = self._observe(obj)
            if key:
                listed.add(key)
        # Whatever we knew and the list no longer shows went away while we were not watching.
        for key in [k for k in self._known() if k not in listed]:
            self._forget(key)
        self.stats.resource_version = rv

    def _watch_once(self, stop: threading.Event) -> bool:
        """One watch request from the current resourceVersion; True if it delivered any event."""
        w = self._api.watch(self.query(), self.stats.resource_version, self._settings.watch_timeout)
        self._watch = w
        self.stats.watches += 1
        got_any = False
        try:
            for event in w:
                if stop.is_set():
                    break
                got_any = True
                self._handle(event)
        finally:
            self._watch = None
            w.stop()
        return got_any

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED"):
            self._observe(obj)
        elif kind == "DELETED":
            key = self._key(obj)
            if key:
                self._forget(key)
        else:
            log.debug("ignoring watch event of type %r", kind)
            return
        if rv:
            self.stats.resource_version = str(rv)

    def _key(self, obj: Mapping[str, Any]) -> str | None:
        """The key a DELETED object was known by: its uid (a recreated object is a new one)."""
        uid = (obj.get("metadata") or {}).get("uid")
        return uid if isinstance(uid, str) and uid else None
