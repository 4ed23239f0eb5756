"""Models in OCI registries (docs/registries.md): the registry protocol, self-contained.

`reference` (oci:// URLs, the allow-list; no I/O, what the CLI and the daemon's request checks load),
`auth` (docker config credentials, Basic and the Bearer token flow), `registry` (the OCI distribution
API: manifests, indexes, blobs with Range, redirects to storage) and `modelpack` (a manifest's layers as
files). The adapter, an origin `Kind` (agent.origin.base), is agent.origin.oci_origin.
"""
