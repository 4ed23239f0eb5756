"""Tests of agent.fetch (see tests/support for what they share)."""
