"""weightswarm tracker: BitTorrent tracker, manifest registry and origin leases."""
