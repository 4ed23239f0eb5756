"""Prometheus metrics, one CollectorRegistry per app so several apps can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tracker.store import StoreLifecycle

EVENT_LABELS = ("started", "completed", "stopped", "update", "error")
ROUTES = ("announce", "scrape", "api")
REFUSALS = ("passkey", "token", "role")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        announces = Counter(
            "tracker_announces", "Announces handled, by event ('error' = refused)", ["event"], registry=r
        )
        # Label children resolved once: .labels() per announce would cost a dict lookup and a lock.
        self.announces = {e: announces.labels(e) for e in EVENT_LABELS}
        self.scrapes = Counter("tracker_scrapes", "Scrape requests handled", registry=r)
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
        latency = Histogram(
            "tracker_request_seconds",
            "Request latency by route",
            ["route"],
            registry=r,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0),
        )
        self.latency = {route: latency.labels(route) for route in ROUTES}

    async def render(self, store: StoreLifecycle) -> bytes:
        """The exposition text, with the swarm gauges refreshed from the store first."""
        stats = await store.stats()
        self.peers.set(stats.peers)
        self.seeders.set(stats.seeders)
        self.torrents.set(stats.torrents)
        return bytes(generate_latest(self.registry))
