"""Tests of agent.daemon (see tests/support for what they share)."""
