"""Tests of agent.http (see tests/support for what they share)."""
