"""Prometheus metrics, one CollectorRegistry per app so several apps can live in one process.

What every announce counts (its event, its latency) is kept as plain numbers (`Tally`, `Timings`) that
a collector reads when /metrics is scraped: prometheus_client's own Counter and Histogram take a lock
per call, and on this path that was about a tenth of an announce's CPU. Those numbers are written only
on the event loop's thread.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from tracker.store import StoreLifecycle

EVENT_LABELS = ("started", "completed", "stopped", "update", "error")
ROUTES = ("announce", "scrape", "api")
REFUSALS = ("passkey", "token", "role")


LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)


class Tally:
    """A count."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class Timings:
    """A latency histogram: a count per bucket (the first bound at or above the value) and the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.announces = {e: Tally() for e in EVENT_LABELS}
        self.scrapes = Tally()
        self.over_limit = Tally()
        self.latency = {route: Timings() for route in ROUTES}
        r.register(_PerRequest(self))
        refusals = Counter(
            "tracker_auth_refusals",
            "Requests refused: announce/scrape without the passkey, API calls without a known token "
            "(401), or with a token of the wrong role (403)",
            ["reason"],
            registry=r,
        )
        self.refusals = {reason: refusals.labels(reason) for reason in REFUSALS}
        self.peers = Gauge("tracker_peers", "Live peers over all torrents", registry=r)
        self.seeders = Gauge("tracker_seeders", "Live seeders over all torrents", registry=r)
        self.torrents = Gauge("tracker_torrents", "Torrents with at least one live peer", registry=r)
        self.lease_grants = Counter("tracker_lease_grants", "Origin leases granted or renewed", registry=r)
        self.lease_denials = Counter(
            "tracker_lease_denials", "Lease requests refused (held by others)", registry=r
        )
        self.lease_expiries = Counter(
            "tracker_lease_expiries", "Leases found expired (holder stopped heartbeating)", registry=r
        )
        self.lease_takeovers = Counter(
            "tracker_lease_takeovers",
            "Leases taken over from a holder whose reported bytes did not change for `stale_after`",
            registry=r,
        )
        self.metainfo_quarantined = Counter(
            "tracker_metainfo_quarantined", "Info dicts removed after a node reported them wrong", registry=r
        )

    def announce(self, label: str) -> None:
        """Count an announce by its label (`tracker.announce.announce`): 'limit' is an error too."""
        if label == "limit":
            self.over_limit.inc()
            label = "error"
        self.announces[label].inc()

    async def render(self, store: StoreLifecycle) -> bytes:
        """The exposition text, with the swarm gauges refreshed from the store first."""
        stats = await store.stats()
        self.peers.set(stats.peers)
        self.seeders.set(stats.seeders)
        self.torrents.set(stats.torrents)
        return bytes(generate_latest(self.registry))


class _PerRequest:
    """The per-request numbers of `Metrics` as Prometheus families, read at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        announces = CounterMetricFamily(
            "tracker_announces", "Announces handled, by event ('error' = refused)", labels=["event"]
        )
        for event, tally in m.announces.items():
            announces.add_metric([event], tally.value)
        yield announces
        yield CounterMetricFamily("tracker_scrapes", "Scrape requests handled", value=m.scrapes.value)
        yield CounterMetricFamily(
            "tracker_announces_over_limit",
            "Announces refused over a swarm or peer limit (--max-swarms, --max-peers...): nothing stored",
            value=m.over_limit.value,
        )
        latency = HistogramMetricFamily(
            "tracker_request_seconds", "Request latency by route", labels=["route"]
        )
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        for route, timings in m.latency.items():
            total, buckets = 0, []
            for bound, count in zip(bounds, timings.counts, strict=True):
                total += count
                buckets.append((bound, float(total)))
            latency.add_metric([route], buckets, sum_value=timings.sum)
        yield latency
