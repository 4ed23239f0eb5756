"""Tests of agent.origin (see tests/support for what they share)."""
