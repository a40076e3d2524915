"""Fetch a model from object storage or HTTPS into a pod volume before the runtime starts.

Why it exists: model owners keep models in buckets, not in PersistentVolumeClaims. The runtime
image runs ``python -m kiln_runtime fetch`` as an init container; the runtime then loads what it
wrote. Verified (size, ETag or sha256), bounded (a size limit, timeouts, a retry budget), never
partial where the runtime reads, and every failure ends in one line the operator carries to the
InferenceService's Ready condition (the container's termination message).
"""
