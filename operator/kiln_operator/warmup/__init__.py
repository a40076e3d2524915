"""The warm-up gate: a pod takes traffic only after real-shaped requests through it meet its p99.

`plan` is pure (what to send, how to judge, when to retry); `probe` sends the requests with
tritonclient; the kopf handler in `handlers/warmup_gate.py` ties them to each pod.
"""
