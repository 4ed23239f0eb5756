"""`agent serve`: building the node's parts and running them (`node`), and the node operations
wired from them (`nodeops`: metrics, eviction, admin routes). Wiring and lifecycle only: policy
lives in the packages below.

May import every other agent package except `agent.cli`.
"""
