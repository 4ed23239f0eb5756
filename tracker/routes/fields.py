"""Request-field patterns that more than one router validates."""

from __future__ import annotations

NODE_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$"
"""A node's stable id (e.g. its Kubernetes node name), as leases and metainfo reports name it."""
