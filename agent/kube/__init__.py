"""Kubernetes, in and out apart. The port (`api`: the six calls the agent makes) and its one adapter
(`adapter`: the only module that imports the kubernetes client); the list-watch loop (`listwatch`);
pods in (`pods_in`: annotations to requests), pods out (`pods_out`: status and Events), and the glue
that decides every write to a pod (`podsync`); the fleet (`fleet`: node labels, ModelPreheat status)
and the ModelPreheat object with its watcher (`preheat`). Free of Kubernetes: the annotation grammar
and per-model request tracking (`requests`), the node label rule (`labels`).

May import `agent.fetch` and below; never `agent.daemon` or `agent.http`.
"""
