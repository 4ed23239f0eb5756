"""weightswarm node agent: fetches model weights into a Hugging Face hub cache, peer to peer.

Packages, top layer first (each imports only those below it; `.importlinter` enforces it):
`cli`, `daemon`, `http` | `kube`, `fetch`, `swarm` | `origin` | `hub`, `cache`, `core`.
"""
