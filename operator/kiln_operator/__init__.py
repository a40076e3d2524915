"""Kiln's operator: InferenceServices in, Deployments, Services and a replica count out.

Why it exists: serving a model under a latency SLO takes more than a Deployment — warm-up
before traffic, replicas from p99 and queue depth, conditions a person and Argo CD can read.
A pure core (api, builders, status, autoscaling policy, warm-up plan) decides; only `k8s`,
the handlers and the Prometheus and warm-up adapters do I/O (`.importlinter` checks it).
"""
