"""Tests of agent.cli (see tests/support for what they share)."""
