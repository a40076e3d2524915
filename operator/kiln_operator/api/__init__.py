"""Kiln's Kubernetes API: pydantic models that are the single source of truth for the CRDs.

Why it exists: the CRD schema, `kubectl explain`, the docs and the operator's parsing all come
from these models (`crdgen` writes crds/), so they cannot disagree.
"""
