"""Prometheus metrics of one agent (own `CollectorRegistry` per daemon, so in-process test daemons and
the default registry never mix), served as `GET /metrics` on the agent API.

Event counters are incremented where things happen (a fetch job ends, a blob is evicted, the HF
endpoint serves a file); the state of the swarm and the cache's disk usage are read at scrape time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.core.modelnames import ModelNames

if TYPE_CHECKING:
    from agent.fetch.jobs import JobStatus

log = logging.getLogger(__name__)

_FETCH_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)


@dataclass(frozen=True)
class SwarmSnapshot:
    """What the scrape reads from the daemon: torrents, connected peers, bytes uploaded since start."""

    torrents: int
    peers: int
    uploaded: int
    blob_peers: dict[str, int] = field(default_factory=dict)
    """blob id -> peers connected to its torrent."""


SOURCES = ("peers", "origin", "cache")
"""Where a fetch's bytes came from: the one vocabulary of every series' `source` label."""

STAGES = ("queued", "lease", "locked", "origin", "peers", "verifying")
"""The stages a running job can be in (agent.fetch.jobs.Stage), each a series of `fetch_stage`."""


class _StateCollector(Collector):
    def __init__(
        self,
        swarm: Callable[[], SwarmSnapshot],
        cache_bytes: Callable[[], int],
        jobs: Callable[[], list[JobStatus]],
        preheats: Callable[[], dict[str, int]],
    ) -> None:
        self._swarm = swarm
        self._cache_bytes = cache_bytes
        self._jobs = jobs
        self._preheats = preheats

    def describe(self) -> Iterator[Any]:
        return iter(())  # registering must not run a scrape (it would cache an empty cache size)

    def collect(self) -> Iterator[Any]:
        try:
            s = self._swarm()
        except Exception:  # a scrape must not fail because a torrent vanished mid-read
            log.debug("swarm state unavailable for metrics", exc_info=True)
            s = SwarmSnapshot(0, 0, 0)
        per_blob = GaugeMetricFamily(
            "weightswarm_agent_blob_peers", "Peers connected to each blob's torrent.", labels=["blob"]
        )
        for blob, n in sorted(s.blob_peers.items()):
            per_blob.add_metric([blob], n)
        yield per_blob
        stages = dict.fromkeys(STAGES, 0)
        for job in self._jobs():
            if job.stage in stages:
                stages[job.stage] += 1
        stage = GaugeMetricFamily(
            "weightswarm_agent_fetch_stage", "Running fetch jobs by the stage they are in.", labels=["stage"]
        )
        for name, n in stages.items():
            stage.add_metric([name], n)
        yield stage
        preheats = GaugeMetricFamily(
            "weightswarm_agent_preheats",
            "ModelPreheat objects that select this node, by this node's phase for them.",
            labels=["phase"],
        )
        counts = self._preheats()
        for phase in ("Pending", "Downloading", "Ready", "Failed"):
            preheats.add_metric([phase], counts.get(phase, 0))
        yield preheats
        yield GaugeMetricFamily(
            "weightswarm_agent_active_torrents", "Blob torrents in the session.", s.torrents
        )
        yield GaugeMetricFamily(
            "weightswarm_agent_connected_peers", "Peer connections, all torrents.", s.peers
        )
        yield CounterMetricFamily(
            "weightswarm_agent_upload_bytes",
            "Payload bytes uploaded to peers since the agent started.",
            s.uploaded,
        )
        yield GaugeMetricFamily(
            "weightswarm_agent_cache_bytes",
            "Bytes of blobs (complete and partial) in the hub cache.",
            self._cache_bytes(),
        )


class _LabelCollector(Collector):
    """Which hidden label is which model: on the admin socket only (agent.core.modelnames)."""

    def __init__(self, names: ModelNames) -> None:
        self._names = names

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "weightswarm_agent_model_label",
            "1 for each hidden model label this agent used, with the model it stands for (node-local).",
            labels=["model", "name"],
        )
        for label, name in sorted(self._names.known().items()):
            family.add_metric([label, name], 1)
        yield family


class AgentMetrics:
    """The agent's metrics. `bind_state` once the swarm exists; the rest can be used from the start.

    Every series with a `model` label takes it from `names` (agent.core.modelnames): a model the origin
    does not report public is a hidden label on every channel."""

    def __init__(self, names: ModelNames) -> None:
        self.names = names
        self.registry = CollectorRegistry(auto_describe=True)
        self.admin_registry = CollectorRegistry(auto_describe=False)
        """What only the admin socket adds: the hidden labels' names."""
        self.admin_registry.register(_LabelCollector(names))
        r = self.registry
        self.bytes = Counter(
            "weightswarm_agent_fetched_bytes",
            "Bytes of fetched models by where they came from (peers, origin, cache).",
            ["source"],
            registry=r,
        )
        for source in SOURCES:
            self.bytes.labels(source)
        self.fetch_duration = Histogram(
            "weightswarm_agent_fetch_duration_seconds",
            "Wall time of a model fetch job (successful ones).",
            buckets=_FETCH_BUCKETS,
            registry=r,
        )
        self.fetches = Counter(
            "weightswarm_agent_fetches", "Fetch jobs finished, by outcome.", ["outcome"], registry=r
        )
        for outcome in ("ready", "failed"):
            self.fetches.labels(outcome)
        self.fetch_failures = Counter(
            "weightswarm_agent_fetch_failures", "Fetch jobs that failed.", registry=r
        )
        self.evictions = Counter("weightswarm_agent_evictions", "Blobs evicted from the cache.", registry=r)
        self.evicted_bytes = Counter(
            "weightswarm_agent_evicted_bytes", "Bytes evicted from the cache.", registry=r
        )
        self.cache_full = Counter(
            "weightswarm_agent_cache_full",
            "Model requests refused because they cannot fit under the limit.",
            registry=r,
        )
        self.hf_requests = Counter(
            "weightswarm_agent_hf_requests",
            "HF-endpoint requests by route kind and status.",
            ["route", "status"],
            registry=r,
        )
        self.served_bytes = Counter(
            "weightswarm_agent_served_bytes",
            "File bytes the HF endpoint answered with (Content-Length).",
            registry=r,
        )
        self.time_to_ready = Histogram(
            "weightswarm_agent_time_to_ready_seconds",
            "From a model's request to every byte verified in the cache, by model and by the source "
            "most of its bytes came from (origin, peers, cache).",
            ["model", "source"],
            buckets=_FETCH_BUCKETS,
            registry=r,
        )
        self.model_bytes = Counter(
            "weightswarm_agent_model_bytes",
            "Bytes of each model's finished fetches by source (origin, peers, cache).",
            ["model", "source"],
            registry=r,
        )
        self.preheat_counts: Callable[[], dict[str, int]] = dict
        """Replaced by the preheat controller (agent.kube.preheat) when there is one."""

    def bind_state(
        self,
        swarm: Callable[[], SwarmSnapshot],
        cache_bytes: Callable[[], int],
        jobs: Callable[[], list[JobStatus]],
    ) -> None:
        self.registry.register(_StateCollector(swarm, cache_bytes, jobs, lambda: self.preheat_counts()))

    def observe_job(self, status: JobStatus, source: str = "") -> None:
        """One finished fetch job (`source`: its bucket URL, if any): bytes by source, duration, outcome."""
        if status.phase == "Ready":
            self.fetches.labels("ready").inc()
            end = status.finished or time.time()
            took = max(0.0, end - status.created)
            self.fetch_duration.observe(took)
            model = self.names.label(status.repo_id, status.revision, source)
            by_source = {
                "origin": status.bytes_from_origin,
                "peers": status.bytes_from_peers,
                "cache": status.bytes_from_cache,
            }
            for where, n in by_source.items():
                self.bytes.labels(where).inc(n)
                self.model_bytes.labels(model, where).inc(n)
            if not status.partial:
                # Ties (a model of empty files) count as cache: nothing was fetched.
                main = max(("cache", "peers", "origin"), key=by_source.__getitem__)
                self.time_to_ready.labels(model, main).observe(took)
        elif status.phase == "Failed":
            self.fetches.labels("failed").inc()
            self.fetch_failures.inc()

    def render(self, admin: bool = False) -> bytes:
        out = generate_latest(self.registry)
        return out + generate_latest(self.admin_registry) if admin else out


def metrics_router(metrics: AgentMetrics, admin: bool = False) -> APIRouter:
    """`GET /metrics`; `admin`: the node-local channel, which also says which hidden label is which model."""
    router = APIRouter()

    @router.get("/metrics")
    def get_metrics(_request: Request) -> Response:
        return Response(metrics.render(admin), media_type=CONTENT_TYPE_LATEST)

    return router
