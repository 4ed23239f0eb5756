"""Tests of the test origin (agent.hub), proven against the real huggingface_hub client."""
