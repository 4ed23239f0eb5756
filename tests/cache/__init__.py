"""Tests of agent.cache (see tests/support for what they share)."""
