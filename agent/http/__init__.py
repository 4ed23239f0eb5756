"""The agent's HTTP surface: the local API (`api`), the Hugging Face-compatible read endpoint
(`hf`), Prometheus metrics (`metrics`), and the client the CLI uses to talk to a daemon (`client`).

May import `agent.fetch` and below; never `agent.daemon` or `agent.kube`.
"""
