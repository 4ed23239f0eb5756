"""Where each blob's bytes come from, for a daemon fetch: the per-blob policy (`policy`) that chooses
between the local cache, BitTorrent peers, the relay and the origin, and `swarm_source`, its face to the
fetch engine."""
