"""Pods in, the decisions of agent.kube.podsync, and pods out, on the port's in-memory twin
(tests.support.kube_memory): no HTTP, no kubernetes client. The jobs are real `JobTable` jobs, finished
by the test as a fetch would finish them. The same over the real client: tests/kube/test_kube.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent.core.modelnames import ModelNames
from agent.core.settings import KubeSettings
from agent.fetch.jobs import Job, JobKey, JobTable
from agent.kube.api import Query
from agent.kube.listwatch import ListWatch
from agent.kube.podsync import PodSync
from agent.kube.requests import MODELS_ANNOTATION, STATUS_ANNOTATION
from tests.support.kube_memory import MemoryKube
from tests.support.procs import loop_until

NODE = "node-a"
SETTINGS = KubeSettings(
    enabled=True, node_name=NODE, status_min_interval=0.2, poll_interval=0.05, watch_timeout=60,
    backoff_base=0.05, backoff_max=0.5, preheat=False, node_labels=False,
)


class Node:
    """What a daemon gives PodSync: jobs (never run: the test finishes them) and pins."""

    def __init__(self) -> None:
        self.table = JobTable(history=10)
        self.pins: set[str] = set()

    def request_model(
        self, repo_id: str, revision: str = "main", include: Sequence[str] = (), exclude: Sequence[str] = (),
        token: str | None = None, *, lend: bool = False, client: str | None = None, background: bool = False,
        source: str = "",
    ) -> Job:
        return self.table.get_or_create(JobKey(repo_id, revision, requester="node" if lend else ""))[0]

    def set_pins(self, pins: set[str]) -> None:
        self.pins = pins


@pytest.fixture
def twin() -> MemoryKube:
    return MemoryKube()


@pytest.fixture
def synced(twin: MemoryKube) -> Iterator[tuple[PodSync, Node]]:
    node = Node()
    names = ModelNames(b"k" * 32, lambda r: True)
    sync = PodSync(SETTINGS, node.request_model, node.set_pins, names, api=twin)
    stop = threading.Event()
    loops = (sync.watcher.run, sync.run)
    threads = [threading.Thread(target=run, args=(stop,), daemon=True) for run in loops]
    for t in threads:
        t.start()
    loop_until(lambda: twin.open_watches("pods") == 1, timeout=10, what="pod watch open")
    yield sync, node
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    sync.close()


def status(twin: MemoryKube, pod: str) -> dict[str, Any]:
    raw = twin.get_pod(pod)["metadata"]["annotations"].get(STATUS_ANNOTATION)
    return json.loads(raw) if raw else {}


def reasons(twin: MemoryKube, pod: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["type"]) for e in list(twin.events) if e["involvedObject"]["name"] == pod]


def test_a_bad_annotation_is_told_once_on_its_pod_by_podsync(twin, synced) -> None:
    bad = twin.add_pod("bad", annotations={MODELS_ANNOTATION: "org/ok, org/name@"})
    loop_until(lambda: status(twin, "bad"), timeout=10, what="status on the bad pod")
    loop_until(lambda: reasons(twin, "bad"), timeout=10, what="the Warning")
    (entry,) = status(twin, "bad").values()
    assert entry["phase"] == "Failed" and "empty revision" in entry["error"]
    (event,) = twin.events
    assert (event["reason"], event["type"]) == ("BadAnnotation", "Warning")
    assert event["involvedObject"]["uid"] == bad["metadata"]["uid"] and "empty revision" in event["message"]
    # Our own status patch comes back as MODIFIED: no second report. Another pod still gets its model.
    twin.add_pod("good", annotations={MODELS_ANNOTATION: "org/a"})
    loop_until(lambda: status(twin, "good"), timeout=10, what="the good pod's status")
    assert len(reasons(twin, "bad")) == 1 and len([p for p in twin.patches if p["name"] == "bad"]) == 1


def test_a_pods_model_is_fetched_once_reported_and_unpinned_when_gone(twin, synced) -> None:
    sync, node = synced
    twin.add_pod("a", annotations={MODELS_ANNOTATION: "org/m"})
    twin.add_pod("b", annotations={MODELS_ANNOTATION: "org/m@main"})
    loop_until(lambda: status(twin, "a") and status(twin, "b"), timeout=10, what="both pods' status")
    (job,) = node.table.all()
    assert node.pins == {"org/m@main"} and status(twin, "a")["org/m@main"]["phase"] == "Pending"
    job.finish("/hub/snap")
    for pod in ("a", "b"):
        loop_until(lambda pod=pod: status(twin, pod)["org/m@main"]["phase"] == "Ready", timeout=10, what=pod)
        loop_until(lambda pod=pod: len(reasons(twin, pod)) == 2, timeout=10, what=f"{pod} events")
        assert reasons(twin, pod) == [("ModelFetchStarted", "Normal"), ("ModelReady", "Normal")]
    twin.delete_pod("a")
    twin.update_pod("b", phase="Succeeded")
    loop_until(lambda: node.pins == set(), timeout=10, what="unpinned")
    assert len(node.table.all()) == 1


class Pods(ListWatch):
    """The loop alone, on pods: what it observed and forgot."""

    def __init__(self, api: MemoryKube) -> None:
        super().__init__(SETTINGS, api)
        self.seen: dict[str, str] = {}
        self.forgotten: list[str] = []

    def query(self) -> Query:
        return Query("pods", field_selector=f"spec.nodeName={NODE}")

    def _observe(self, obj: Any) -> str | None:
        self.seen[obj["metadata"]["uid"]] = obj["metadata"]["name"]
        return str(obj["metadata"]["uid"])

    def _forget(self, key: str) -> None:
        self.forgotten.append(self.seen.pop(key))

    def _known(self) -> list[str]:
        return list(self.seen)


def test_the_loop_relists_after_410_and_resumes_after_a_cut_stream(twin) -> None:
    twin.add_pod("stays")
    twin.add_pod("leaves")
    pods = Pods(twin)
    stop = threading.Event()
    t = threading.Thread(target=pods.run, args=(stop,), daemon=True)
    t.start()
    try:
        loop_until(lambda: twin.open_watches() == 1, timeout=10, what="watch")
        twin.pause_watches()
        twin.delete_pod("leaves")
        twin.add_pod("arrives")
        twin.compact()
        twin.resume_watches()
        loop_until(lambda: "arrives" in pods.seen.values(), timeout=10, what="relisted")
        assert pods.stats.gone == 1 and pods.stats.lists == 2 and pods.forgotten == ["leaves"]
        rv = pods.stats.resource_version
        twin.refuse_next("watch", 500)
        twin.drop_watches()
        twin.add_pod("later")
        loop_until(lambda: "later" in pods.seen.values(), timeout=10, what="resumed")
        assert pods.stats.lists == 2 and pods.stats.errors == 2 and rv is not None
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()
