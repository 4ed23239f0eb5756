"""How a model is named where anyone may read: every metric series and INFO log line takes it from here.

The network listener's `/metrics` answers anonymous callers. A gated or private repo's name there
confirms that this cluster uses it, while the Hub answers 401 for it; a bucket model's or a published
(hub-less) model's name is the operator's own. So only a repo the origin last reported public
(`private: false` and `gated: false`, recorded by agent.fetch.entitlement) keeps its name,
`org/name@rev`; every other model is `hidden-<16 hex>`: an HMAC-SHA256 of `org/name@rev` (and the
bucket URL, for a bucket model).

Why keyed: a plain hash of a name can be confirmed by anyone who guesses the name (hash
`acme/secret-project-x@main` and compare). Why this key: with the cluster's announce passkey, a key
derived from it, so one model has one label on every node and a dashboard can sum a model over the
fleet (whoever holds the passkey is an agent, and may list the tracker's models anyway); without one
(a standalone node), the node's random key under `--state-dir`. A label is stable while the key is, so
its series go on across restarts.

A log line of the daemon names a model by its label too: `scrubber` gives one job's function that turns
its model's name (in any case, as an error or a URL path may spell it, or as its cache folder) into the
label, for messages built where the name is at hand, and for errors written for the model's requester.
DEBUG lines are the operator's opt-in and may name it (the HTTP libraries log whole URLs there).

The admin socket serves the same series; its `/metrics` also says which label is which model
(`weightswarm_agent_model_label`), for the operator on the node, who may see every name.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections.abc import Callable
from urllib.parse import quote

HIDDEN_PREFIX = "hidden-"
_DIGITS = 16
"""Hex digits of a hidden label: 64 bits, no collision among any cluster's models."""
_MAX_KNOWN = 4096
"""Labels remembered for the admin socket's table (the oldest go first): bounded like any series set."""

Scrub = Callable[[str], str]
"""A text about one model with its name replaced by its label (`ModelNames.scrubber`)."""


def as_is(text: str) -> str:
    """The scrub of a process that may name every model: `agent fetch` on the user's own terminal."""
    return text


RepoName = Callable[[str], str]
"""A repo id -> how a log line names it (`ModelNames.repo`; `as_is` where every name may be shown)."""


class ModelNames:
    """Thread-safe; one per daemon. `public(repo_id)`: the origin last reported the repo public."""

    def __init__(self, key: bytes, public: Callable[[str], bool]) -> None:
        self._key = hmac.new(key, b"weightswarm model label", hashlib.sha256).digest()
        self._public = public
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}
        """label -> `org/name@rev` (with its bucket URL), for the admin socket only."""

    def __repr__(self) -> str:  # the key stays out of reprs
        return "ModelNames()"

    def label(self, repo_id: str, revision: str, source: str = "") -> str:
        """The name of `repo_id@revision` (from bucket URL `source`, if any) in a series or a log line."""
        name = f"{repo_id}@{revision}"
        if not source and self._public(repo_id):
            return name
        full = f"{name}={source}" if source else name
        digest = hmac.new(self._key, full.encode(), hashlib.sha256).hexdigest()[:_DIGITS]
        return self._remember(HIDDEN_PREFIX + digest, full)

    def repo(self, repo_id: str) -> str:
        """The name of a repo as a whole (a line about its blobs or its access, no revision at hand): its
        id if public, else a hidden label of the id alone (listed on the admin socket as `org/name`)."""
        if self._public(repo_id):
            return repo_id
        digest = hmac.new(self._key, repo_id.encode(), hashlib.sha256).hexdigest()[:_DIGITS]
        return self._remember(HIDDEN_PREFIX + digest, repo_id)

    def _remember(self, label: str, full: str) -> str:
        with self._lock:
            self._known.pop(label, None)
            self._known[label] = full
            while len(self._known) > _MAX_KNOWN:
                del self._known[next(iter(self._known))]
        return label

    def scrubber(self, repo_id: str, revision: str, source: str = "") -> Scrub:
        """`text` with `repo_id@revision` (from bucket URL `source`) named as `label` names it, asked anew
        at each call (the origin's word on the repo may change while a job runs)."""
        # The repo id with its revision, as a path (`org/name`), URL-encoded (`org%2Fname`) or a cache
        # folder (`models--org--name`), longest first; another revision stays beside the label (a branch
        # or commit names nothing).
        name = f"{repo_id}@{revision}"
        forms = [source, name, repo_id, quote(repo_id, safe=""), "models--" + repo_id.replace("/", "--")]
        pattern = re.compile("|".join(re.escape(f) for f in sorted(set(forms) - {""}, key=len, reverse=True)),
                             re.IGNORECASE)

        def scrub(text: str) -> str:
            label = self.label(repo_id, revision, source)
            if label == name:
                return text
            return pattern.sub(label, text)

        return scrub

    def known(self) -> dict[str, str]:
        """Hidden labels handed out since start -> the model each stands for (node-local readers only)."""
        with self._lock:
            return dict(self._known)
