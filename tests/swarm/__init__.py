"""Tests of agent.swarm (see tests/support for what they share)."""
