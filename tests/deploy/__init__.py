"""Deployment: the Helm chart rendered by Helm's engine and validated, the Dockerfile."""
