"""Tests of the tracker: routes, stores, auth, bad input, real BitTorrent clients."""
