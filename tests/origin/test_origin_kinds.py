"""The origin interface (agent.origin.base `Kind`), its registry (agent.origin.kinds) and the one place
that retries every kind (agent.origin.client `Origin`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.errors import OriginOverloadedError
from agent.core.settings import OriginSettings
from agent.origin.answers import FileMetadata, RemoteFile, Retryable
from agent.origin.base import Kind, Resolved
from agent.origin.client import Origin
from agent.origin.kinds import ORIGIN_KINDS, load
from tests.support.fetchkit import REPO, fetch_args, served_model, snapshot_contents

LOADED = ("obstore", "agent.origin.bucket", "httpx", "agent.origin.hub_api")
"""Modules a hub fetch on the command line has no use for: obstore is object storage's, httpx the HF
endpoint's."""


def test_a_hub_fetch_in_a_fresh_process_never_imports_obstore(tmp_path: Path):
    """Kinds are imported by name on first use (as uvicorn's protocol table): `agent fetch` of a hub model
    loads the hub's kind only, not the object store client every other fetch would pay to import."""
    script = (
        "import json, sys\n"
        "from agent.cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n"
        f"    print(json.dumps([m for m in {LOADED!r} if m in sys.modules]))\n"
    )
    for srv, _, files in served_model(tmp_path):
        args = fetch_args(srv.url, tmp_path, "--quiet")
        out = subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr
        *said, loaded = out.stdout.strip().splitlines()
        assert snapshot_contents(Path(said[-1])) == files  # it did fetch, through the hub's kind
        assert json.loads(loaded) == []
    # A bucket URL loads its kind when it is opened, and only then.
    check = "import sys; from agent.origin.kinds import load; load('agent.origin.bucket:BucketOrigin');"
    check += "print('obstore' in sys.modules)"
    loads = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert loads.stdout.strip() == "True", loads.stderr


def test_every_registered_kind_implements_the_interface_and_subclasses_none():
    members = {n for n in vars(Kind) if not n.startswith("_")} | set(Kind.__annotations__)
    assert members == {"endpoint", "close", "resolve", "list_files", "has_repo", "file_metadata"} | {
        "download_url",
        "open_range",
    }
    for scheme, entry in ORIGIN_KINDS.items():
        cls = load(entry.kind)
        assert isinstance(cls, type), scheme
        assert cls.__mro__[1:] == (object,), f"{scheme}: {cls.__name__} subclasses {cls.__mro__[1].__name__}"
        missing = {m for m in members - {"endpoint"} if not callable(getattr(cls, m, None))}
        assert not missing, f"{scheme}: {cls.__name__} lacks {missing}"


class PagedKind:
    """A kind of origin written against `Kind` alone, as a new one would be: every call one attempt, its
    first answers "later" (503) the way a hub under load does, its listing in pages."""

    endpoint = "mem://models"

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.calls: list[str] = []

    def _later(self, call: str) -> None:
        self.calls.append(call)
        if self.calls.count(call) <= self.fail_first:
            raise Retryable(OriginOverloadedError(f"{call}: origin error 503"), delay=0.0)

    def close(self) -> None: ...

    def resolve(self, repo_id: str, revision: str) -> Resolved:
        self._later("resolve")
        return Resolved("a" * 40, [RemoteFile("a.json", 2, "b" * 40, False)], public=True, next_page="2")

    def list_files(self, repo_id: str, commit: str, page: str) -> tuple[list[RemoteFile], str | None]:
        self._later(f"page {page}")
        nxt = str(int(page) + 1) if page != "3" else None
        return [RemoteFile(f"{page}.json", 2, "c" * 40, False)], nxt

    def has_repo(self, repo_id: str) -> None:
        self._later("has_repo")

    def file_metadata(self, repo_id: str, commit: str, path: str) -> FileMetadata:
        self._later("file_metadata")
        return FileMetadata(commit, None, 2, f"mem://models/{path}", web_seed=False)

    def download_url(self, repo_id: str, commit: str, path: str) -> str:
        return f"mem://models/{path}"

    def open_range(self, url: str, start: int, end: int, what: str):  # type: ignore[no-untyped-def]
        raise AssertionError("not asked here")


def test_any_kind_is_retried_page_by_page_and_told_apart_when_it_has_no_web_seed():
    kind = PagedKind(fail_first=2)
    origin = Origin(kind, OriginSettings(endpoint=kind.endpoint, max_retries=3, backoff_base=0.0))
    commit, files = origin.revision(REPO, "main")
    assert commit == "a" * 40 and [f.path for f in files] == ["a.json", "2.json", "3.json"]
    assert origin.reported_public(REPO)
    # Each call is retried on its own: a page that failed is asked again, the pages before it are not.
    assert kind.calls == ["resolve"] * 3 + ["page 2"] * 3 + ["page 3"] * 3
    origin.has_repo(REPO)
    assert origin.web_seed_url(REPO, commit, "a.json") is None  # its URLs need its credential

    spent = PagedKind(fail_first=3)
    with pytest.raises(OriginOverloadedError, match="503"):
        Origin(spent, OriginSettings(endpoint=spent.endpoint, max_retries=3, backoff_base=0.0)).has_repo(REPO)
    assert spent.calls == ["has_repo"] * 3
