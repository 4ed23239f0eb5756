"""BitTorrent: the libtorrent session, the only module that imports libtorrent (`session`: "stop
seeding a blob" is `Swarm.remove`), the tracker's client (`tracker_client`) and the per-blob policy
that decides between peers, an origin lease and a web seed (`policy`).

May import `agent.origin`, `agent.cache` and `agent.core`.
"""
