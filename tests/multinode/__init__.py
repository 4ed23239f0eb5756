"""Several nodes in network namespaces with shaped links (root)."""
