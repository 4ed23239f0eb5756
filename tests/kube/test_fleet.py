"""The fleet side with real agents (libtorrent, a real tracker, a real test hub) whose watchers talk,
through kubeconfigs and the real kubernetes client, to the fake API server: ModelPreheat objects,
node labels, the preheat status counts, and a waiting pod's model overtaking preheat work."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.daemon.node import Daemon
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from agent.kube.labels import LABEL_PREFIX, model_label_key
from agent.kube.requests import MODELS_ANNOTATION, STATUS_ANNOTATION
from tests.kube.test_podsync import write_kubeconfig
from tests.support.cluster import agent_settings, assert_snapshot_verifies, model_origin
from tests.support.fake_kube import FakeKube
from tests.support.procs import loop_until

REPO = "acme/tiny"
KEY = f"{REPO}@main"
MODEL_BYTES = 4 * 2**20
CRD = Path(__file__).parents[2] / "charts/weightswarm/crds/modelpreheats.yaml"


@pytest.fixture
def fleet_agent(tmp_path: Path, kube: FakeKube) -> Iterator[Callable[..., Daemon]]:
    """Start an agent for one node of the fake cluster; stopped at teardown."""
    started: list[Daemon] = []

    def start(node: str, origin_url: str, tracker: Any = None) -> Daemon:
        settings = agent_settings(tmp_path, node, origin_url, tracker)
        kube_settings = dataclasses.replace(
            settings.kube, enabled=True, node_name=node,
            kubeconfig=write_kubeconfig(tmp_path / f"kubeconfig-{node}", kube.url),
            status_min_interval=0.3, poll_interval=0.1, watch_timeout=60, request_timeout=5.0,
            backoff_base=0.05, backoff_max=0.5, preheat_status_interval=0.3,
        )
        daemon = Daemon(dataclasses.replace(settings, kube=kube_settings))
        started.append(daemon)
        daemon.start()
        return daemon

    yield start
    for d in reversed(started):
        d.stop()


def kubectl_get(kube: FakeKube, name: str) -> dict[str, Any]:
    """`kubectl get modelpreheat NAME`: the CRD's printer columns evaluated on the stored object."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    obj = kube.get_preheat(name)
    row: dict[str, Any] = {"NAME": name}
    for column in version["additionalPrinterColumns"]:
        value: Any = obj
        for part in column["jsonPath"].strip(".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        row[column["name"].upper()] = value
    return row


def node_labels(kube: FakeKube, node: str) -> dict[str, str]:
    labels = kube.get_node(node)["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}


def test_a_preheat_selecting_two_of_three_nodes(tmp_path, kube, tracker, fleet_agent) -> None:
    kube.add_node("node-a", {"gpu": "h100"})
    kube.add_node("node-b", {"gpu": "h100"})
    kube.add_node("node-c", {"gpu": "a10"})
    with model_origin(
        tmp_path / "hub", REPO, total_bytes=MODEL_BYTES, shards=2, seed=5, rate_total=4 * 2**20
    ) as origin:
        agents = {n: fleet_agent(n, origin.hub.url, tracker) for n in ("node-a", "node-b", "node-c")}
        kube.add_preheat("tiny", KEY, node_selector={"gpu": "h100"})

        loop_until(lambda: kubectl_get(kube, "tiny")["READY"] == "2/2", timeout=90, what="2/2 ready")
        status = kube.get_preheat("tiny")["status"]
        assert status["nodesWanted"] == 2 and status["nodesReady"] == 2
        assert set(status["nodes"]) == {"node-a", "node-b"}
        commit = status["nodes"]["node-a"]["commit"]
        for node in ("node-a", "node-b"):
            entry = status["nodes"][node]
            assert entry["phase"] == "Ready" and entry["stage"] == "ready" and entry["commit"] == commit
            assert entry["bytesDone"] == entry["bytesTotal"] == origin.size
            (job,) = agents[node].jobs.all()
            assert_snapshot_verifies(job.status().snapshot, origin)
        # The cluster took the model from the origin about once; the second node from its peer.
        row = kubectl_get(kube, "tiny")
        assert row["ORIGIN"] == status["bytesFromOrigin"] and row["PEERS"] == status["bytesFromPeers"]
        assert row["MODEL"] == KEY
        assert status["bytesFromOrigin"] + status["bytesFromPeers"] >= 2 * origin.size * 0.99
        assert status["bytesFromOrigin"] <= origin.size * 1.1
        assert status["bytesFromPeers"] >= origin.size * 0.9
        assert origin.hub.egress_bytes < origin.size * 1.2

        # The third node was never selected: no job, no entry, no label.
        assert agents["node-c"].jobs.all() == []
        key = model_label_key(KEY)
        for node in ("node-a", "node-b"):
            loop_until(lambda node=node: node_labels(kube, node) == {key: commit}, timeout=20, what="label")
            assert KEY in agents[node].ops.extra_pins
        assert node_labels(kube, "node-c") == {}
        assert kube.get_node("node-a")["metadata"]["labels"]["gpu"] == "h100"  # others untouched

        # Unselecting a node removes its entry and its pin; the counts follow.
        kube.update_node("node-b", {"gpu": None})
        loop_until(lambda: kubectl_get(kube, "tiny")["READY"] == "1/1", timeout=20, what="1/1")
        loop_until(lambda: "node-b" not in kube.get_preheat("tiny")["status"]["nodes"], timeout=20,
                   what="entry removed")
        loop_until(lambda: KEY not in agents["node-b"].ops.extra_pins, timeout=20, what="node-b unpinned")

        # Deleting the object unpins the model everywhere; the bytes (and their labels) stay.
        kube.delete_preheat("tiny")
        loop_until(lambda: KEY not in agents["node-a"].ops.extra_pins, timeout=20, what="node-a unpinned")
        assert node_labels(kube, "node-a") == {key: commit}


def test_a_waiting_pods_model_overtakes_preheat_work(tmp_path, kube, fleet_agent) -> None:
    root = tmp_path / "hub"
    make_model(root, "acme/big", total_bytes=12 * 2**20, shards=6, seed=1)
    make_model(root, REPO, total_bytes=2 * 2**20, shards=1, seed=2)
    kube.add_node("node-a", {})
    with HubServer(root, rate_total=2 * 2**20) as hub:
        agent = fleet_agent("node-a", hub.url)
        kube.add_preheat("big", "acme/big")

        def preheat_job() -> Any:
            return next((j for j in agent.jobs.all() if j.key.repo_id == "acme/big"), None)

        loop_until(lambda: preheat_job() is not None and preheat_job().status().bytes_done > 2**20,
                   timeout=30, what="preheat downloading")
        assert preheat_job().status().background
        kube.add_pod("vllm-0", node="node-a", annotations={MODELS_ANNOTATION: REPO})

        def pod_job() -> Any:
            return next((j for j in agent.jobs.all() if j.key.repo_id == REPO), None)

        def pod_phase() -> str | None:
            raw = kube.get_pod("vllm-0")["metadata"]["annotations"].get(STATUS_ANNOTATION)
            return json.loads(raw)[KEY]["phase"] if raw else None

        loop_until(lambda: pod_job() is not None and pod_job().status().bytes_done > 0, timeout=30,
                   what="the pod's model arriving")
        preheat_before = preheat_job().status().bytes_done
        pod_job().wait(60)
        # While the pod's model came, the preheat stepped aside: its connections closed, it read nothing
        # (sharing the origin with it would have given it several times the pod's bytes meanwhile).
        preheat_moved = preheat_job().status().bytes_done - preheat_before
        assert preheat_moved < 0.25 * pod_job().status().bytes_total
        loop_until(lambda: pod_phase() == "Ready", timeout=30, what="the pod's status Ready")
        big = preheat_job().status()
        assert big.phase == "Downloading", "the preheat should still be running behind the pod's model"
        assert big.bytes_done < big.bytes_total
        loop_until(lambda: kube.get_preheat("big").get("status", {}).get("ready") == "1/1", timeout=60,
                   what="the preheat finishes afterwards")


def test_pod_status_shows_stage_rate_and_eta(tmp_path, kube, fleet_agent) -> None:
    kube.add_node("node-a", {})
    with model_origin(
        tmp_path / "hub", REPO, total_bytes=6 * 2**20, shards=1, seed=4, rate_total=2**20
    ) as origin:
        fleet_agent("node-a", origin.hub.url)
        kube.add_pod("vllm-0", node="node-a", annotations={MODELS_ANNOTATION: REPO})
        seen: list[dict[str, Any]] = []

        def downloading_with_eta() -> bool:
            raw = kube.get_pod("vllm-0")["metadata"]["annotations"].get(STATUS_ANNOTATION)
            entry = json.loads(raw)[KEY] if raw else {}
            seen.append(entry)
            # The window starts with the job's plan: connecting and planning first bring the rate down.
            return entry.get("etaSeconds") is not None and entry["rateBytesPerSecond"] > 0.3 * 2**20

        loop_until(downloading_with_eta, timeout=30, what="a rate and an ETA on the pod")
        entry = seen[-1]
        assert entry["phase"] == "Downloading" and entry["stage"] == "origin"
        assert entry["rateBytesPerSecond"] < 3 * 2**20  # the origin's 1 MiB/s, roughly
        assert 0 < entry["etaSeconds"] < 30
