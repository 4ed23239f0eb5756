"""Tests of agent.kube (see tests/support for what they share)."""
