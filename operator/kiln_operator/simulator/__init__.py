"""Kiln's autoscaling simulator: its policy against HPA, KEDA, Knative and oracles, on traces.

Why it exists: a platform team adopts an autoscaler when it sees, on traffic like its own,
that it meets the SLO for fewer GPU-hours. This package replays traces through a
discrete-event model of replicas with dynamic batching, shows each policy the metrics the
way Prometheus would, and scores SLO attainment against replica-hours. Kiln's policy is the
operator's real `decide`, imported, never copied.

Pure and deterministic: no clock, no I/O outside `report` and the CLI, and every random draw
comes from a generator seeded by the caller.
"""
