"""Benchmarks and the multi-node harness (scripts, not timed tests; docs/benchmarks.md has each one)."""
