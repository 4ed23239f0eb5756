"""Benchmarks and the multi-node harness (scripts, not timed tests; see README "Benchmarks")."""
