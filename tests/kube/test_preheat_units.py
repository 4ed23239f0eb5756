"""The pieces of the fleet side that need no cluster: the ModelPreheat object, its counts, the node
label rule, and the job's stage, rate, ETA and priority that the statuses show."""

from __future__ import annotations

import hashlib
import re
import threading
import time

import pytest

from agent.core.errors import AnnotationError
from agent.fetch.jobs import Job, JobFile, JobKey, JobTable
from agent.kube.labels import LABEL_PREFIX, model_label_key
from agent.kube.preheat import parse_preheat, summarise
from agent.kube.requests import ModelRef

# Kubernetes' rules for a qualified label name (prefix/name) and a label value.
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def preheat_object(model: object = "acme/tiny@v1", selector: object = None) -> dict[str, object]:
    spec: dict[str, object] = {"model": model}
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": "p", "uid": "u-1", "generation": 3}, "spec": spec}


def test_a_preheat_parses_and_selects_like_a_node_selector() -> None:
    p = parse_preheat(preheat_object(selector={"gpu": "h100", "zone": "a"}))
    assert p.model == ModelRef("acme/tiny", "v1") and p.generation == 3
    assert p.selects({"gpu": "h100", "zone": "a", "other": "x"})
    assert not p.selects({"gpu": "h100"}) and not p.selects({"gpu": "a10", "zone": "a"})
    assert p.label_selector == "gpu=h100,zone=a"
    every = parse_preheat(preheat_object("acme/tiny"))
    assert every.selects({}) and every.label_selector == "" and every.model.revision == "main"


@pytest.mark.parametrize(
    ("model", "selector", "message"),
    [
        (None, None, "spec.model"),
        ("acme tiny", None, "whitespace"),
        ("../etc/passwd", None, "repo id"),
        ("acme/tiny", {"gpu": 1}, "nodeSelector"),
        ("acme/tiny", ["gpu"], "nodeSelector"),
    ],
)
def test_a_bad_preheat_is_refused_with_the_reason(model: object, selector: object, message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        parse_preheat(preheat_object(model, selector))


def test_counts_cover_only_the_wanted_nodes() -> None:
    p = parse_preheat(preheat_object())
    nodes = {
        "a": {"phase": "Ready", "bytesFromOrigin": 10, "bytesFromPeers": 0},
        "b": {"phase": "Downloading", "bytesFromOrigin": 0, "bytesFromPeers": 4},
        "gone": {"phase": "Ready", "bytesFromOrigin": 99, "bytesFromPeers": 99},
    }
    counts = summarise(p, nodes, ["a", "b", "c"])
    assert counts == {
        "nodesWanted": 3, "nodesReady": 1, "ready": "1/3", "bytesFromOrigin": 10, "bytesFromPeers": 4,
        "observedGeneration": 3,
    }


@pytest.mark.parametrize(
    "ref",
    ["Qwen/Qwen2.5-72B-Instruct@main", "a/b@" + "0" * 40, "org/_x_@v1", "o/" + "N" * 96 + "@refs/pr/1"],
)
def test_model_label_keys_are_valid_unique_and_computable_elsewhere(ref: str) -> None:
    key = model_label_key(ref)
    prefix, _, name = key.partition("/")
    assert prefix + "/" == LABEL_PREFIX and LABEL_NAME.match(name), key
    assert name.endswith(hashlib.sha256(ref.encode()).hexdigest()[:10])
    assert model_label_key(ref.replace("@", "@x")) != key


def test_the_label_key_of_a_known_model() -> None:
    # What the chart's `weightswarm.modelLabel` and `agent label-key` print for it.
    digest = hashlib.sha256(b"Qwen/Qwen2.5-72B-Instruct@main").hexdigest()[:10]
    assert model_label_key("Qwen/Qwen2.5-72B-Instruct@main") == f"{LABEL_PREFIX}Qwen2.5-72B-Instruct.{digest}"


def test_a_job_says_its_stage_rate_and_eta() -> None:
    job = Job(JobKey("acme/tiny", "main"))
    assert job.status().stage == "queued"
    job.set_plan("c" * 40, [JobFile("a", 100), JobFile("b", 1000), JobFile("c", 50, stage="ready", done=50)])
    assert job.status().stage == "queued"
    job.file_stage("b", "lease")
    assert job.status().stage == "lease"
    job.file_stage("a", "peers")
    assert job.status().stage == "peers"
    job.file_stage("b", "origin")
    assert job.status().stage == "origin"  # what the node is pulling from the origin matters most
    job.file_progress("b", 1000, "origin")
    job.file_progress("a", 100, "peers")
    assert job.status().stage == "verifying"  # every file in; the index checks are left
    job.finish("/snap")
    assert job.status().stage == "ready"

    slow = Job(JobKey("acme/slow", "main"))
    slow.set_plan("c" * 40, [JobFile("a", 10_000)])
    for done in (1000, 2000, 3000):
        time.sleep(0.4)
        slow.file_progress("a", done)
    st = slow.status()
    assert st.rate is not None and 1000 < st.rate < 4000
    assert st.eta_seconds is not None and st.eta_seconds == pytest.approx((10_000 - 3000) / st.rate)


def test_background_work_waits_for_foreground_jobs() -> None:
    table = JobTable(history=10)
    preheat, _ = table.get_or_create(JobKey("acme/big", "main", background=True))
    stop = threading.Event()
    table.wait_turn(preheat, stop)  # nothing else runs: no wait at all

    pod, _ = table.get_or_create(JobKey("acme/tiny", "main"))
    waited = threading.Event()

    def preheat_worker() -> None:
        table.wait_turn(preheat, stop, poll=0.02)
        waited.set()

    t = threading.Thread(target=preheat_worker)
    t.start()
    assert not waited.wait(0.3)  # yields while the pod's model runs
    pod.finish("/snap")
    assert waited.wait(5)
    t.join()

    # A foreground request for the same model joins the preheat job and promotes it.
    same, new = table.get_or_create(JobKey("acme/big", "main"))
    assert same is preheat and not new
    preheat.promote()
    assert not preheat.background
    assert preheat.claim() and not preheat.claim()  # one of the two queues runs it
