"""tests.support.fake_kube driven by the real kubernetes client: nodes, the ModelPreheat custom resource
(with its status subresource) and a pod smoke test (tests/kube/test_kube.py covers pods in depth)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support.fake_kube import FakeKube
from tests.support.procs import loop_until

GROUP, VERSION, PLURAL = "weightswarm.io", "v1alpha1", "modelpreheats"
MERGE = "application/merge-patch+json"


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def collect(
    func: Callable[..., Any], *args: Any, until: Callable[[list[dict[str, Any]]], bool], **kwargs: Any
) -> list[dict[str, Any]]:
    """Watch with the client's Watch until `until(events)` holds or the server's timeout ends it."""
    w = watch.Watch()
    events: list[dict[str, Any]] = []
    kwargs.setdefault("timeout_seconds", 3)
    for event in w.stream(func, *args, **kwargs):
        events.append(event)
        if until(events):
            w.stop()
            break
    return events


def name_of(event: dict[str, Any]) -> str:
    obj = event["object"]
    return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


# -- nodes ----------------------------------------------------------------------------------------


def test_node_list_with_label_and_field_selectors(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.add_node("gpu-1", {"weightswarm.io/pool": "a", "gpu": "h100"})
    kube.add_node("gpu-2", {"weightswarm.io/pool": "b", "gpu": "h100"})
    kube.add_node("cpu-1", {"weightswarm.io/pool": "a"})

    def names(**kwargs: Any) -> list[str]:
        return sorted(n.metadata.name for n in core.list_node(**kwargs).items)

    assert names() == ["cpu-1", "gpu-1", "gpu-2"]
    assert names(label_selector="weightswarm.io/pool=a") == ["cpu-1", "gpu-1"]
    assert names(label_selector="weightswarm.io/pool==a,gpu") == ["gpu-1"]
    assert names(label_selector="gpu=h100,weightswarm.io/pool!=a") == ["gpu-2"]
    assert names(label_selector="!gpu") == ["cpu-1"]
    assert names(label_selector="gpu!=h100") == ["cpu-1"]  # != matches a node without the label
    assert names(label_selector="weightswarm.io/pool in (b, c)") == ["gpu-2"]
    assert names(label_selector="weightswarm.io/pool notin (b)") == ["cpu-1", "gpu-1"]
    assert names(field_selector="metadata.name=gpu-2") == ["gpu-2"]
    assert names(field_selector="metadata.name!=gpu-2", label_selector="gpu") == ["gpu-1"]
    listed = core.list_node()
    assert listed.kind == "NodeList" and int(listed.metadata.resource_version) == kube.resource_version
    node = core.read_node("gpu-1")
    assert node.kind == "Node" and node.metadata.uid and node.metadata.creation_timestamp
    assert node.status.conditions[0].type == "Ready" and node.status.conditions[0].status == "True"
    assert node.metadata.labels == kube.get_node("gpu-1")["metadata"]["labels"]
    for bad in ({"field_selector": "spec.nodeName=x"}, {"label_selector": "a=(b"}):
        with pytest.raises(ApiException) as info:
            core.list_node(**bad)
        assert info.value.status == 400 and status_of(info.value)["reason"] == "BadRequest"
    assert len(kube.list_requests("nodes")) == 13 and kube.list_requests() == []


def test_node_watch_sees_label_changes(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.add_node("n1", {"role": "gpu"})
    rv = core.list_node().metadata.resource_version
    kube.add_pod("p")  # another resource: never on a node watch
    kube.update_node("n1", {"zone": "z1"})
    kube.update_node("n1", {"zone": "z1"})  # no change: no event, as on a real server
    events = collect(core.list_node, resource_version=rv, until=lambda e: len(e) == 1)
    assert [(e["type"], name_of(e)) for e in events] == [("MODIFIED", "n1")]
    assert events[0]["object"].metadata.labels == {"role": "gpu", "zone": "z1"}

    # The client hung up: the server ends that watch, as the apiserver does.
    loop_until(lambda: kube.open_watches("nodes") == 0, timeout=5, what="watch closed")

    # Live, with a label selector: leaving the selection is DELETED, entering it ADDED.
    got: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: got.extend(collect(
        core.list_node, label_selector="role=gpu", timeout_seconds=5, until=lambda e: len(e) == 5)))
    thread.start()
    loop_until(lambda: kube.open_watches("nodes") == 1, timeout=5, what="node watch")
    kube.update_node("n1", {"zone": "z2"})
    kube.update_node("n1", {"role": None})
    kube.add_node("n2", {"role": "cpu"})  # never matches
    kube.update_node("n1", {"role": "gpu"})
    kube.delete_node("n1")
    thread.join(10)
    assert [(e["type"], name_of(e)) for e in got] == [
        ("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1"), ("ADDED", "n1"), ("DELETED", "n1")]
    assert got[1]["object"].metadata.labels["zone"] == "z2"
    left = got[2]["object"].metadata  # the last state that matched, at the change's resourceVersion
    assert left.labels == {"role": "gpu", "zone": "z2"} and int(left.resource_version) > int(rv)
    assert kube.watch_requests("nodes")[-1].query["labelSelector"] == "role=gpu"


def test_node_patch_removes_label_with_null_and_checks_resource_version(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    created = kube.add_node("n1", {"keep": "1", "drop": "2"})
    patched = core.patch_node("n1", {"metadata": {"labels": {"drop": None, "new": "3"}}}, _content_type=MERGE)
    assert patched.metadata.labels == {"keep": "1", "new": "3"}
    assert int(patched.metadata.resource_version) > int(created["metadata"]["resourceVersion"])
    assert kube.get_node("n1")["metadata"]["labels"] == {"keep": "1", "new": "3"}
    # The client's default for a dict body becomes strategic merge: the same for labels.
    core.patch_node("n1", {"metadata": {"labels": {"new": None}}})
    assert [p["content_type"] for p in kube.node_patches] == [MERGE, "application/strategic-merge-patch+json"]
    first = kube.node_patches[0]
    assert first["name"] == "n1" and first["body"]["metadata"]["labels"]["drop"] is None
    current = kube.get_node("n1")
    assert current["metadata"]["labels"] == {"keep": "1"}
    # A patch through the main resource cannot change the status.
    not_ready = {"conditions": [{"type": "Ready", "status": "False"}]}
    core.patch_node("n1", {"status": not_ready}, _content_type=MERGE)
    assert kube.get_node("n1") == current
    # The current resourceVersion as a precondition passes; a stale one is a 409 Conflict.
    ok = core.patch_node("n1", {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                                             "labels": {"x": "y"}}}, _content_type=MERGE)
    stale = created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as info:
        core.patch_node(
            "n1", {"metadata": {"resourceVersion": stale, "labels": {"x": "z"}}}, _content_type=MERGE)
    assert info.value.status == 409
    status = status_of(info.value)
    assert status["reason"] == "Conflict" and status["details"] == {"name": "n1", "kind": "nodes"}
    assert status["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again")
    assert kube.get_node("n1")["metadata"]["resourceVersion"] == ok.metadata.resource_version
    # A JSON patch (a list body) works too, `test` included.
    core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/x", "value": "y"},
                           {"op": "remove", "path": "/metadata/labels/x"}])
    assert kube.get_node("n1")["metadata"]["labels"] == {"keep": "1"}
    with pytest.raises(ApiException) as info:
        core.read_node("missing")
    assert info.value.status == 404 and status_of(info.value)["message"] == 'nodes "missing" not found'
    kube.fail_next("PATCH", "/api/v1/nodes/n1", 403)
    with pytest.raises(ApiException) as info:
        core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}, _content_type=MERGE)
    assert info.value.status == 403


# -- ModelPreheat ---------------------------------------------------------------------------------


def test_preheat_list_and_watch(kube: FakeKube, custom: client.CustomObjectsApi) -> None:
    kube.add_preheat("llama", "meta-llama/Llama-3.1-8B", {"pool": "a"})
    listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert listed["kind"] == "ModelPreheatList" and listed["apiVersion"] == f"{GROUP}/{VERSION}"
    (item,) = listed["items"]
    assert item["kind"] == "ModelPreheat" and item["apiVersion"] == f"{GROUP}/{VERSION}"
    assert item["spec"] == {"model": "meta-llama/Llama-3.1-8B", "nodeSelector": {"pool": "a"}}
    assert item["metadata"]["generation"] == 1 and "status" not in item
    kube.add_preheat("qwen", "Qwen/Qwen2.5-7B")
    assert kube.get_preheat("qwen")["spec"] == {"model": "Qwen/Qwen2.5-7B"}
    only = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, field_selector="metadata.name=qwen")
    assert [i["metadata"]["name"] for i in only["items"]] == ["qwen"]

    got: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: got.extend(collect(
        custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=5,
        until=lambda e: len(e) == 5)))
    thread.start()
    loop_until(lambda: kube.open_watches(PLURAL) == 1, timeout=5, what="preheat watch")
    kube.add_node("n1")  # another resource: never on this watch
    kube.add_preheat("mistral", "mistralai/Mistral-7B")
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, PLURAL, "mistral", {"status": {"nodesReady": 2}}, _content_type=MERGE)
    kube.delete_preheat("mistral")
    thread.join(10)
    assert [(e["type"], name_of(e)) for e in got] == [
        ("ADDED", "llama"), ("ADDED", "qwen"), ("ADDED", "mistral"), ("MODIFIED", "mistral"),
        ("DELETED", "mistral")]
    assert got[3]["object"]["status"] == {"nodesReady": 2}
    assert got[4]["object"]["status"] == {"nodesReady": 2}  # DELETED carries the last object
    assert int(got[4]["object"]["metadata"]["resourceVersion"]) == kube.resource_version


def test_preheat_status_subresource(kube: FakeKube, custom: client.CustomObjectsApi) -> None:
    created = kube.add_preheat("llama", "org/llama")
    # The status subresource changes only .status: not spec, not metadata, not the generation.
    after = custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, "llama", {
        "spec": {"model": "org/other"}, "metadata": {"labels": {"x": "y"}},
        "status": {"phase": "Preheating", "nodes": {"n1": "Ready"}},
    }, _content_type=MERGE)
    assert after["spec"] == {"model": "org/llama"} and after["metadata"]["generation"] == 1
    assert "labels" not in after["metadata"] and after["status"]["phase"] == "Preheating"
    assert int(after["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert custom.get_cluster_custom_object_status(GROUP, VERSION, PLURAL, "llama") == after
    # A merge patch of the status keeps the other keys.
    after = custom.patch_cluster_custom_object_status(
        GROUP, VERSION, PLURAL, "llama", {"status": {"nodes": {"n2": "Failed"}}}, _content_type=MERGE)
    assert after["status"] == {"phase": "Preheating", "nodes": {"n1": "Ready", "n2": "Failed"}}
    # The main resource ignores a status change (a no-op: same resourceVersion) ...
    same = custom.patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, "llama", {"status": {"phase": "Done"}}, _content_type=MERGE)
    assert same == after == kube.get_preheat("llama")
    # ... and a spec change bumps the generation; labels do not.
    changed = custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "llama", {
        "spec": {"nodeSelector": {"pool": "a"}}, "status": {"phase": "Done"}}, _content_type=MERGE)
    assert changed["metadata"]["generation"] == 2 and changed["status"] == after["status"]
    assert changed["spec"] == {"model": "org/llama", "nodeSelector": {"pool": "a"}}
    labelled = custom.patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, "llama", {"metadata": {"labels": {"team": "ml"}}}, _content_type=MERGE)
    assert labelled["metadata"]["generation"] == 2 and labelled["metadata"]["labels"] == {"team": "ml"}
    assert kube.update_preheat("llama", {"model": "org/llama-2"})["metadata"]["generation"] == 3
    assert [(p["name"], p["subresource"]) for p in kube.preheat_patches] == [
        ("llama", "status"), ("llama", "status"), ("llama", None), ("llama", None), ("llama", None)]
    assert kube.preheat_patches[0]["body"]["spec"] == {"model": "org/other"}


def test_preheat_preconditions_and_errors(kube: FakeKube, custom: client.CustomObjectsApi) -> None:
    created = kube.add_preheat("llama", "org/llama")
    stale = created["metadata"]["resourceVersion"]
    kube.update_preheat("llama", {"model": "org/llama-2"})
    for patch in (custom.patch_cluster_custom_object_status, custom.patch_cluster_custom_object):
        with pytest.raises(ApiException) as info:
            patch(GROUP, VERSION, PLURAL, "llama",
                  {"metadata": {"resourceVersion": stale}, "status": {"phase": "Ready"}}, _content_type=MERGE)
        assert info.value.status == 409
        status = status_of(info.value)
        assert status["reason"] == "Conflict"
        assert status["details"] == {"name": "llama", "group": GROUP, "kind": PLURAL}
        assert status["message"].startswith(
            f'Operation cannot be fulfilled on modelpreheats.{GROUP} "llama": the object has been modified')
    current = kube.get_preheat("llama")
    fresh = current["metadata"]["resourceVersion"]
    ok = custom.patch_cluster_custom_object_status(  # no _content_type: the client's default
        GROUP, VERSION, PLURAL, "llama",
        {"metadata": {"resourceVersion": fresh}, "status": {"phase": "Ready"}})
    assert ok["status"] == {"phase": "Ready"}
    # What the installed client sends for a dict body without _content_type must work: merge patch.
    assert kube.preheat_patches[-1]["content_type"] == MERGE
    with pytest.raises(ApiException) as info:
        custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "missing")
    assert info.value.status == 404
    assert status_of(info.value)["message"] == f'modelpreheats.{GROUP} "missing" not found'
    with pytest.raises(ApiException) as info:
        custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, "missing", {"status": {}})
    assert info.value.status == 404
    # A real server refuses strategic merge for custom resources.
    with pytest.raises(ApiException) as info:
        custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "llama", {"spec": {"model": "x"}},
                                           _content_type="application/strategic-merge-patch+json")
    assert info.value.status == 415 and status_of(info.value)["reason"] == "UnsupportedMediaType"
    kube.fail_next("PATCH", "/modelpreheats/llama/status", 500)
    with pytest.raises(ApiException) as info:
        custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, "llama", {"status": {"a": 1}})
    assert info.value.status == 500
    with pytest.raises(ApiException) as info:
        custom.list_cluster_custom_object(GROUP, "v1", PLURAL)  # an unknown version: an unknown route
    assert info.value.status == 404
    assert kube.get_preheat("llama") == ok


# -- pods -----------------------------------------------------------------------------------------


def test_pods_still_work(kube: FakeKube, core: client.CoreV1Api) -> None:
    pod = kube.add_pod("p", annotations={"a": "1"})
    kube.add_pod("elsewhere", node="node-b")
    kube.add_node("node-a")
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a")
    assert [p.metadata.name for p in pods.items] == ["p"]
    patched = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"uid": pod["metadata"]["uid"], "annotations": {"a": None, "b": "2"}}},
        _content_type=MERGE)
    assert patched.metadata.annotations == {"b": "2"}
    assert kube.patches[0]["namespace"] == "default" and kube.patches[0]["name"] == "p"
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_pod("p", "default", {"metadata": {"uid": "other"}}, _content_type=MERGE)
    assert info.value.status == 409
    events = collect(core.list_namespaced_pod, "default", resource_version=pods.metadata.resource_version,
                     until=lambda e: len(e) == 1)
    assert [(e["type"], name_of(e)) for e in events] == [("MODIFIED", "p")]
    assert len(kube.list_requests()) == 1 and len(kube.watch_requests("pods")) == 1
