"""Kiln's Kubernetes API: pydantic models that are the single source of truth for the CRDs."""
