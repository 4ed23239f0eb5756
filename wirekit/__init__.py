"""Wire formats both sides speak: bencoding (metainfo, announces) and bearer tokens.

A package of its own so the agent never imports the tracker service (nor the tracker the agent).
Imports neither `agent` nor `tracker` (an import-linter contract).
"""
