"""The shared vocabulary every other part of the agent speaks: settings (one object, built once),
errors (each with its exit code), what a fetch plan is (`plan`), content hashing (`hashing`), a
blob's BitTorrent metainfo (`metainfo`, the one place that builds it) and progress reporting.

Imports nothing from the rest of `agent`; may import the standard library and `wirekit.bencode`.
"""
