"""Pods in and out (agent.kube.pods_in, pods_out) through the adapter (agent.kube.adapter) against
tests.support.fake_kube with the real kubernetes client; annotations."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from agent.core.errors import AnnotationError
from agent.core.settings import KubeSettings
from agent.kube.adapter import KubernetesApi
from agent.kube.pods_in import PodWatcher
from agent.kube.pods_out import StatusReporter
from agent.kube.requests import (
    MODELS_ANNOTATION,
    STATUS_ANNOTATION,
    ModelRef,
    ModelStatus,
    PodKey,
    RequestTracker,
    parse_models_annotation,
)
from tests.support.fake_kube import FakeKube
from tests.support.procs import loop_until

NODE = "node-a"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


# -- annotation parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("org/name", [ModelRef("org/name", "main")]),
        ("  org/name  ", [ModelRef("org/name")]),
        ("org/name@v1.0", [ModelRef("org/name", "v1.0")]),
        (f"org/name@{COMMIT}", [ModelRef("org/name", COMMIT)]),
        (f"org/name@{COMMIT.upper()}", [ModelRef("org/name", COMMIT)]),
        ("org/name@refs/pr/3", [ModelRef("org/name", "refs/pr/3")]),
        ("meta-llama/Llama-3.1-8B, Qwen/Qwen2.5_7B@dev", [
            ModelRef("meta-llama/Llama-3.1-8B"), ModelRef("Qwen/Qwen2.5_7B", "dev")]),
        ("a/b,\n  c/d ,", [ModelRef("a/b"), ModelRef("c/d")]),
        ("a/b, a/b@main, c/d, a/b", [ModelRef("a/b"), ModelRef("c/d")]),
        ("a/b@x, a/b@y", [ModelRef("a/b", "x"), ModelRef("a/b", "y")]),
    ],
)
def test_parse_valid(value: str, expected: list[ModelRef]) -> None:
    assert parse_models_annotation(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "no models"),
        (" , ,", "no models"),
        ("name", "org/name"),
        ("../x", "letters, digits"),
        ("a/b/c", "org/name"),
        ("/b", "letters, digits"),
        ("org/name@", "empty revision"),
        ("org/na me", "whitespace"),
        ("org/-name", "letters, digits"),
        ("org/na--me", "'--'"),
        ("org/na..me", "'--' or '..'"),
        ("org/name.git", ".git"),
        ("org/" + "x" * 93, "longer than 96"),
        ("org/name@../../etc", "branch, tag"),
        ("org/name@-rf", "branch, tag"),
        ("org/name@a b", "whitespace"),
        ("org/name@v1.lock", "branch, tag"),
        ("org/name@" + "r" * 256, "longer than 255"),
        ("org/näme", "letters, digits"),
        (", ".join(f"o/m{i}" for i in range(65)), "more than 64"),
    ],
)
def test_parse_invalid(value: str, fragment: str) -> None:
    with pytest.raises(AnnotationError) as info:
        parse_models_annotation(value)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 400


def test_repo_id_at_length_limit_is_accepted() -> None:
    repo = "org/" + "x" * 92
    assert parse_models_annotation(repo) == [ModelRef(repo)]


def test_request_tracker_fetches_each_model_once() -> None:
    tracker = RequestTracker()
    a, b = PodKey("ns", "a", "1"), PodKey("ns", "b", "2")
    m1, m2 = ModelRef("o/m1"), ModelRef("o/m2")
    assert tracker.set_pod(a, [m1]) == ([m1], [])
    assert tracker.set_pod(b, [m1, m2]) == ([m2], [])
    assert tracker.pods_for(m1) == {a, b}
    assert tracker.set_pod(b, [m2]) == ([], [])  # a still wants m1
    assert tracker.remove_pod(a) == [m1]
    assert tracker.remove_pod(b) == [m2]
    assert tracker.remove_pod(b) == []


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def settings() -> KubeSettings:
    # watch_timeout well above the test length: a prompt stop must come from closing the socket.
    return KubeSettings(
        node_name=NODE, status_min_interval=0.3, watch_timeout=60, request_timeout=5.0,
        backoff_base=0.05, backoff_max=0.5,
    )


class Calls:
    """What the watcher told the daemon, in order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, PodKey, object]] = []

    def on_request(self, pod: PodKey, models: list[ModelRef]) -> None:
        with self.lock:
            self.log.append(("request", pod, list(models)))

    def on_pod_gone(self, pod: PodKey) -> None:
        with self.lock:
            self.log.append(("gone", pod, None))

    def on_bad(self, pod: PodKey, message: AnnotationError) -> None:
        with self.lock:
            self.log.append(("bad", pod, message))

    def of(self, kind: str, name: str | None = None) -> list[tuple[PodKey, object]]:
        with self.lock:
            return [(p, x) for k, p, x in self.log if k == kind and (name is None or p.name == name)]

    def requests_for(self, name: str) -> list[list[ModelRef]]:
        return [x for _, x in self.of("request", name)]  # type: ignore[misc]


class Running:
    def __init__(self, watcher: PodWatcher, calls: Calls, stop: threading.Event, thread: threading.Thread):
        self.watcher, self.calls, self.stop, self.thread = watcher, calls, stop, thread


@pytest.fixture
def running(kube: FakeKube, api: client.ApiClient, settings: KubeSettings) -> Iterator[object]:
    """A factory: start a watcher thread (after the test set up its pods); stopped at teardown."""
    started: list[tuple[Running, StatusReporter]] = []

    def start(watch_settings: KubeSettings = settings) -> Running:
        calls = Calls()
        port = KubernetesApi(watch_settings, api)
        reporter = StatusReporter(watch_settings, port)
        watcher = PodWatcher(watch_settings, port, calls.on_request, calls.on_pod_gone, calls.on_bad)
        stop = threading.Event()
        thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
        thread.start()
        run = Running(watcher, calls, stop, thread)
        started.append((run, reporter))
        loop_until(lambda: kube.open_watches() >= 1, timeout=20, what="watch open")
        return run

    yield start
    for run, reporter in started:
        t0 = time.monotonic()
        run.stop.set()
        run.thread.join(15)
        assert not run.thread.is_alive(), "watcher did not stop"
        # The watch was 60 s long: stopping promptly proves the socket was closed under it.
        assert time.monotonic() - t0 < 10
        reporter.close()


def annotated(models: str) -> dict[str, str]:
    return {MODELS_ANNOTATION: models}


# -- watcher --------------------------------------------------------------------------------------


def test_initial_list_picks_up_pods_on_this_node_only(kube: FakeKube, running) -> None:
    kube.add_pod("mine", annotations=annotated("org/a, org/b@v2"))
    kube.add_pod("plain")  # no annotation
    kube.add_pod("elsewhere", node="node-b", annotations=annotated("org/c"))
    kube.add_pod("done", annotations=annotated("org/d"), phase="Succeeded")
    run = running()
    assert run.calls.requests_for("mine") == [[ModelRef("org/a"), ModelRef("org/b", "v2")]]
    assert len(run.calls.of("request")) == 1
    assert run.calls.of("gone") == []
    lists = kube.list_requests()
    assert len(lists) == 1 and lists[0].path == "/api/v1/pods"
    assert lists[0].query["fieldSelector"] == f"spec.nodeName={NODE}"
    watch_req = kube.watch_requests()[0]
    assert watch_req.query["allowWatchBookmarks"] == "true"
    assert watch_req.query["timeoutSeconds"] == "60"
    assert watch_req.query["resourceVersion"] == str(kube.resource_version)


def test_watch_adds_changes_and_dedupes(kube: FakeKube, running) -> None:
    run = running()
    kube.add_pod("p1", annotations=annotated("org/a"))
    loop_until(lambda: run.calls.requests_for("p1"), timeout=20, what="p1 request")
    # Same models written differently, and an unrelated change: no new request.
    kube.update_pod("p1", annotations={MODELS_ANNOTATION: " org/a , org/a@main", "other": "x"})
    kube.update_pod("p1", annotations=annotated("org/a, org/b"))
    loop_until(lambda: len(run.calls.requests_for("p1")) == 2, timeout=20, what="changed request")
    assert run.calls.requests_for("p1") == [[ModelRef("org/a")], [ModelRef("org/a"), ModelRef("org/b")]]
    # Another pod on another node never shows up; a second pod asking for the same model does.
    kube.add_pod("p2", node="node-b", annotations=annotated("org/a"))
    kube.add_pod("p3", annotations=annotated("org/a"))
    loop_until(lambda: run.calls.requests_for("p3"), timeout=20, what="p3 request")
    assert run.calls.requests_for("p2") == []
    assert len(run.calls.requests_for("p1")) == 2
    assert kube.list_requests().__len__() == 1


def test_two_pods_one_model_with_request_tracker(kube: FakeKube, api, settings) -> None:
    tracker = RequestTracker()
    fetches: list[ModelRef] = []
    released: list[ModelRef] = []

    def on_request(pod: PodKey, models: list[ModelRef]) -> None:
        fetches.extend(tracker.set_pod(pod, models)[0])

    def on_gone(pod: PodKey) -> None:
        released.extend(tracker.remove_pod(pod))

    kube.add_pod("a", annotations=annotated("org/shared"))
    kube.add_pod("b", annotations=annotated("org/shared, org/other"))
    watcher = PodWatcher(replace_timeout(settings, 1), KubernetesApi(settings, api), on_request, on_gone)
    watcher.run(threading.Event(), max_iterations=1)  # list, one 1-second watch
    assert sorted(fetches) == [ModelRef("org/other"), ModelRef("org/shared")]
    kube.delete_pod("a")
    watcher.run(threading.Event(), max_iterations=1)
    assert released == []  # b still wants both
    kube.delete_pod("b")
    watcher.run(threading.Event(), max_iterations=1)
    assert sorted(released) == [ModelRef("org/other"), ModelRef("org/shared")]
    assert watcher.stats.lists == 1 and watcher.stats.watches == 3


def replace_timeout(settings: KubeSettings, seconds: int) -> KubeSettings:
    from dataclasses import replace

    return replace(settings, watch_timeout=seconds)


def test_pod_gone_when_deleted_finished_terminating_or_unannotated(kube: FakeKube, running) -> None:
    for name in ("del", "fin", "term", "unann", "plain"):
        kube.add_pod(name, annotations=annotated("org/a") if name != "plain" else None)
    run = running()
    kube.delete_pod("del")
    kube.update_pod("fin", phase="Succeeded")
    kube.update_pod("term", terminating=True)
    kube.update_pod("unann", annotations={MODELS_ANNOTATION: None})
    kube.delete_pod("plain")
    loop_until(lambda: len(run.calls.of("gone")) == 4, timeout=20, what="four pods gone")
    # A later change to a finished pod does not bring it back.
    kube.update_pod("fin", annotations={"x": "y"})
    kube.add_pod("marker", annotations=annotated("org/m"))
    loop_until(lambda: run.calls.requests_for("marker"), timeout=20, what="marker")
    assert sorted(p.name for p, _ in run.calls.of("gone")) == ["del", "fin", "term", "unann"]
    assert len(run.calls.of("request")) == 5


def test_bookmark_advances_resource_version_without_callbacks(kube: FakeKube, running) -> None:
    kube.add_pod("p", annotations=annotated("org/a"))
    run = running()
    kube.add_pod("other-node", node="node-b", annotations=annotated("org/b"))  # invisible to us
    mark = kube.bookmark()
    loop_until(lambda: run.watcher.stats.resource_version == str(mark), timeout=20, what="bookmark rv")
    assert run.watcher.stats.bookmarks == 1
    assert len(run.calls.log) == 1
    # The next watch resumes from the bookmark, not from the list.
    kube.drop_watches()
    loop_until(lambda: len(kube.watch_requests()) >= 2, timeout=20, what="re-watch")
    assert kube.watch_requests()[1].query["resourceVersion"] == str(mark)
    assert len(kube.list_requests()) == 1


def test_410_gone_relists_without_missing_or_duplicating(kube: FakeKube, running) -> None:
    kube.add_pod("stays", annotations=annotated("org/s"))
    kube.add_pod("leaves", annotations=annotated("org/l"))
    kube.add_pod("changes", annotations=annotated("org/c1"))
    run = running()
    assert len(run.calls.of("request")) == 3
    # Changes the watch never delivers, then the history is compacted under it.
    kube.pause_watches()
    kube.add_pod("arrives", annotations=annotated("org/n"))
    kube.delete_pod("leaves")
    kube.update_pod("changes", annotations=annotated("org/c2"))
    kube.compact()
    kube.resume_watches()
    loop_until(lambda: run.calls.requests_for("arrives"), timeout=20, what="relisted new pod")
    kube.add_pod("marker", annotations=annotated("org/m"))
    loop_until(lambda: run.calls.requests_for("marker"), timeout=20, what="watch after relist")
    assert run.watcher.stats.gone == 1
    assert len(kube.list_requests()) == 2
    assert [p.name for p, _ in run.calls.of("gone")] == ["leaves"]
    assert run.calls.requests_for("stays") == [[ModelRef("org/s")]]
    assert run.calls.requests_for("changes") == [[ModelRef("org/c1")], [ModelRef("org/c2")]]
    assert run.calls.requests_for("arrives") == [[ModelRef("org/n")]]


def test_watch_from_compacted_version_gets_410_and_relists(kube: FakeKube, running) -> None:
    run = running()
    kube.pause_watches()
    kube.compact()  # the open watch ends with ERROR 410 at once
    kube.resume_watches()
    loop_until(lambda: len(kube.list_requests()) == 2, timeout=20, what="relist")
    kube.add_pod("after", annotations=annotated("org/a"))
    loop_until(lambda: run.calls.requests_for("after"), timeout=20, what="request after relist")
    assert run.watcher.stats.gone == 1


def test_dropped_connection_and_api_error_reconnect_with_backoff(kube: FakeKube, running) -> None:
    kube.add_pod("before", annotations=annotated("org/a"))
    run = running()
    rv_before = run.watcher.stats.resource_version
    kube.fail_next("GET", "/api/v1/pods", 500)  # the first reconnect fails too
    t0 = time.monotonic()
    kube.drop_watches()
    kube.add_pod("during", annotations=annotated("org/b"))
    loop_until(lambda: run.calls.requests_for("during"), timeout=20, what="request after reconnect")
    elapsed = time.monotonic() - t0
    assert run.watcher.stats.errors == 2  # the broken stream and the 500
    watches = kube.watch_requests()
    assert len(watches) == 3
    assert watches[1].query["resourceVersion"] == watches[2].query["resourceVersion"] == rv_before
    assert len(kube.list_requests()) == 1  # resumed from the resourceVersion, no relist
    assert run.calls.requests_for("before") == [[ModelRef("org/a")]]
    assert elapsed < 2 * 0.5 + 5  # two backoffs bounded by backoff_max, plus slack for a busy CI box


def test_list_error_is_retried(kube: FakeKube, running) -> None:
    kube.add_pod("p", annotations=annotated("org/a"))
    kube.fail_next("GET", "/api/v1/pods", 403)
    run = running()
    loop_until(lambda: run.calls.requests_for("p"), timeout=20, what="request after 403")
    assert len(kube.list_requests()) == 2 and run.watcher.stats.errors == 1


def test_malformed_annotation_is_reported_and_watcher_continues(kube: FakeKube, running) -> None:
    # What is written on the bad pod (its status, a Warning Event) is podsync's: tests/kube/test_pods_twin.py.
    bad = kube.add_pod("bad", annotations=annotated("org/ok, org/name@"))
    run = running()
    loop_until(lambda: run.calls.of("bad", "bad"), timeout=20, what="bad annotation callback")
    ((pod, message),) = run.calls.of("bad", "bad")
    assert pod.uid == bad["metadata"]["uid"] and "org/name@" in str(message)
    assert "empty revision" in str(message)
    # An unrelated change (as our own status patch) is no second report. Other pods still work.
    kube.update_pod("bad", annotations={STATUS_ANNOTATION: "{}"})
    kube.add_pod("good", annotations=annotated("org/a"))
    loop_until(lambda: run.calls.requests_for("good"), timeout=20, what="good pod")
    assert len(run.calls.of("bad")) == 1 and kube.events == [] and kube.patches == []
    assert run.calls.requests_for("bad") == []
    # Fixing the annotation turns it into a request.
    kube.update_pod("bad", annotations=annotated("org/ok"))
    loop_until(lambda: run.calls.requests_for("bad"), timeout=20, what="fixed annotation")
    assert run.calls.requests_for("bad") == [[ModelRef("org/ok")]]


def test_namespace_scope_and_max_iterations(kube: FakeKube, api, settings) -> None:
    from dataclasses import replace

    kube.add_pod("in", namespace="ml", annotations=annotated("org/a"))
    kube.add_pod("out", namespace="default", annotations=annotated("org/b"))
    calls = Calls()
    scoped = replace(settings, namespace="ml", watch_timeout=1)
    watcher = PodWatcher(scoped, KubernetesApi(scoped, api), calls.on_request, calls.on_pod_gone)
    t0 = time.monotonic()
    watcher.run(threading.Event(), max_iterations=2)
    assert time.monotonic() - t0 < 15
    assert [p.name for p, _ in calls.of("request")] == ["in"]
    assert {r.path for r in kube.requests} == {"/api/v1/namespaces/ml/pods"}
    assert watcher.stats.watches == 2 and watcher.stats.lists == 1


# -- status reporter ------------------------------------------------------------------------------


def pod_key(pod: dict) -> PodKey:
    meta = pod["metadata"]
    return PodKey(meta["namespace"], meta["name"], meta["uid"])


def test_status_patches_are_rate_limited_coalesced_and_final_lands(kube: FakeKube, api, settings) -> None:
    from dataclasses import replace

    # Long enough that "at once" (well under half of it even on a loaded machine) and "after the
    # interval" cannot be confused; nothing here waits for it.
    interval = 10.0
    reporter = StatusReporter(replace(settings, status_min_interval=interval), KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p"))
    ref = ModelRef("org/a")
    total = 1000
    try:
        reporter.report(pod, {ref: ModelStatus("Downloading", 0, total, 0, 0)})
        loop_until(lambda: len(kube.patches) == 1, timeout=20, what="first patch")
        # From here on the interval holds every progress patch back...
        for done in range(10, total, 10):
            reporter.report(pod, {ref: ModelStatus("Downloading", done, total, done // 2, done - done // 2)})
        ready_at = time.monotonic()
        reporter.report(pod, {ref: ModelStatus("Ready", total, total, 600, 400, snapshot="/hub/snap")})
        loop_until(lambda: kube.patches and "Ready" in kube.patches[-1]["body"]["metadata"]["annotations"][
            STATUS_ANNOTATION], timeout=20, what="Ready patch")
        # ...but the final state overtook the coalesced progress at once, without waiting the interval.
        assert kube.patches[-1]["at"] - ready_at < interval / 2
        assert len(kube.patches) == 2  # the first progress and Ready: the progress held back was superseded
        sent = len(kube.patches)
        reporter.report(pod, {ref: ModelStatus("Ready", total, total, 600, 400, snapshot="/hub/snap")})
    finally:
        reporter.close()
    assert len(kube.patches) == sent  # identical Ready not resent, not even by close()'s flush
    assert all(p["content_type"] == "application/merge-patch+json" for p in kube.patches)
    assert all(p["body"]["metadata"]["uid"] == pod.uid for p in kube.patches)
    shown = json.loads(kube.get_pod("p")["metadata"]["annotations"][STATUS_ANNOTATION])
    assert shown == {"org/a@main": {
        "phase": "Ready", "stage": "ready", "bytesDone": total, "bytesTotal": total, "bytesFromPeers": 600,
        "bytesFromOrigin": 400, "rateBytesPerSecond": None, "etaSeconds": None, "error": None,
        "snapshot": "/hub/snap"}}


def test_status_interval_is_honoured_and_latest_wins(kube: FakeKube, api, settings) -> None:
    from dataclasses import replace

    interval = 1.0
    reporter = StatusReporter(replace(settings, status_min_interval=interval), KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p"))
    ref = ModelRef("org/a")
    try:
        reporter.report(pod, {ref: ModelStatus("Pending")})
        loop_until(lambda: len(kube.patches) == 1, timeout=20, what="first patch")
        for done in (1, 2, 3):
            reporter.report(pod, {ref: ModelStatus("Downloading", done, 10)})
        loop_until(lambda: len(kube.patches) == 2, timeout=20, what="coalesced patch")
        gap = kube.patches[1]["at"] - kube.patches[0]["at"]
        assert gap >= interval * 0.5
        second = json.loads(kube.patches[1]["body"]["metadata"]["annotations"][STATUS_ANNOTATION])
        assert second["org/a@main"]["bytesDone"] == 3
        # A Failed phase is sent at once, not after the interval.
        t0 = time.monotonic()
        reporter.report(pod, {ref: ModelStatus("Failed", 3, 10, error="origin said 404")})
        loop_until(lambda: len(kube.patches) == 3, timeout=20, what="failed patch")
        assert time.monotonic() - t0 < interval + 2
    finally:
        reporter.close()
    assert len(kube.patches) == 3


def test_final_phase_is_sent_at_once(kube: FakeKube, api, settings) -> None:
    from dataclasses import replace

    reporter = StatusReporter(replace(settings, status_min_interval=60.0), KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p"))
    a, b = ModelRef("org/a"), ModelRef("org/b")
    try:
        reporter.report(pod, {a: ModelStatus("Downloading", 1, 10), b: ModelStatus("Pending")})
        loop_until(lambda: len(kube.patches) == 1, timeout=20, what="first patch")
        reporter.report(pod, {a: ModelStatus("Downloading", 5, 10), b: ModelStatus("Pending")})
        reporter.report(pod, {a: ModelStatus("Ready", 10, 10), b: ModelStatus("Pending")})
        # Well inside the 60 s interval: Ready does not wait for it.
        loop_until(lambda: len(kube.patches) == 2, timeout=20, what="Ready patch")
        reporter.report(pod, {a: ModelStatus("Ready", 10, 10), b: ModelStatus("Failed", error="404")})
        loop_until(lambda: len(kube.patches) == 3, timeout=20, what="Failed patch")
    finally:
        reporter.close()
    shown = json.loads(kube.get_pod("p")["metadata"]["annotations"][STATUS_ANNOTATION])
    assert {k: v["phase"] for k, v in shown.items()} == {"org/a@main": "Ready", "org/b@main": "Failed"}
    assert len(kube.patches) == 3


def test_close_flushes_pending_progress(kube: FakeKube, api, settings) -> None:
    from dataclasses import replace

    reporter = StatusReporter(replace(settings, status_min_interval=30.0), KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p"))
    ref = ModelRef("org/a")
    reporter.report(pod, {ref: ModelStatus("Downloading", 1, 10)})
    loop_until(lambda: len(kube.patches) == 1, timeout=20, what="first patch")
    reporter.report(pod, {ref: ModelStatus("Downloading", 5, 10)})
    reporter.close()
    assert len(kube.patches) == 2
    shown = json.loads(kube.get_pod("p")["metadata"]["annotations"][STATUS_ANNOTATION])
    assert shown["org/a@main"]["bytesDone"] == 5


def test_patch_errors_are_survived(kube: FakeKube, api, settings, caplog) -> None:
    reporter = StatusReporter(settings, KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p"))
    ref = ModelRef("org/a")
    try:
        reporter.report(PodKey("default", "missing", "u-1"), {ref: ModelStatus("Pending")})
        reporter.report(PodKey("default", "p", "another-uid"), {ref: ModelStatus("Pending")})
        loop_until(lambda: reporter.patch_errors == 2, timeout=20, what="404 and uid conflict")
        kube.fail_next("PATCH", "/pods/p", 403)
        reporter.report(pod, {ref: ModelStatus("Pending")})
        loop_until(lambda: reporter.patch_errors == 3, timeout=20, what="three failed patches")
        reporter.report(pod, {ref: ModelStatus("Ready", 1, 1)})
        loop_until(lambda: reporter.patches_sent == 1, timeout=20, what="patch after errors")
    finally:
        reporter.close()
    assert [p["name"] for p in kube.patches] == ["p"]  # the wrong-uid patch was refused
    assert "RBAC" in caplog.text
    shown = json.loads(kube.get_pod("p")["metadata"]["annotations"][STATUS_ANNOTATION])
    assert shown["org/a@main"]["phase"] == "Ready"


def test_event_names_the_pod(kube: FakeKube, api, settings) -> None:
    reporter = StatusReporter(settings, KubernetesApi(settings, api))
    pod = pod_key(kube.add_pod("p", namespace="ml"))
    reporter.event(pod, "ModelReady", "org/a@main is ready (12.0 GiB, 90% from peers)", "Normal")
    kube.fail_next("POST", "/events", 403)
    reporter.event(pod, "ModelFetchFailed", "lost", "Warning")  # logged, not raised
    reporter.close()
    (event,) = kube.events
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ml", "uid": pod.uid}
    assert event["metadata"]["namespace"] == "ml" and event["metadata"]["name"].startswith("p.")
    assert (event["type"], event["reason"]) == ("Normal", "ModelReady")
    assert event["reportingComponent"] == "weightswarm-agent" and event["reportingInstance"] == NODE
    assert event["source"] == {"component": "weightswarm-agent", "host": NODE}
    assert event["count"] == 1 and event["firstTimestamp"]


# -- configuration --------------------------------------------------------------------------------


def test_kubeconfig_file_is_used(kube: FakeKube, settings, tmp_path) -> None:
    from dataclasses import replace

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
        "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }))
    kube.add_pod("p", annotations=annotated("org/a"))
    calls = Calls()
    configured = replace(settings, kubeconfig=kubeconfig, watch_timeout=1)
    watcher = PodWatcher(configured, KubernetesApi(configured), calls.on_request, calls.on_pod_gone)
    watcher.run(threading.Event(), max_iterations=1)
    assert calls.requests_for("p") == [[ModelRef("org/a")]]
    assert "s3cret-token" not in repr(watcher.stats)


@pytest.mark.parametrize("content", [None, "{not: [valid"])
def test_bad_kubeconfig_is_one_clear_error(settings, tmp_path, content) -> None:
    from dataclasses import replace

    from agent.core.errors import ConfigError

    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        KubernetesApi(replace(settings, kubeconfig=path))
    assert "--kubeconfig" in str(info.value) and "\n" not in str(info.value)


def test_node_name_is_required(api) -> None:
    from agent.core.errors import ConfigError

    with pytest.raises(ConfigError, match="node-name"):
        PodWatcher(KubeSettings(), KubernetesApi(KubeSettings(), api), lambda p, m: None, lambda p: None)
