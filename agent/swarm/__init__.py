"""BitTorrent: the libtorrent session (`session`, with `ltkit` the only modules that import
libtorrent; "stop seeding a blob" is `Swarm.remove`), what the node seeds (`seeding`), the tracker's
client (`tracker_client`) and the per-blob policy that decides between peers, an origin lease and a
web seed (`policy`), with what it does about a wrong metainfo (`trust`).

May import `agent.cache` and `agent.core`; the origin is handed in as callables, never imported.
"""
