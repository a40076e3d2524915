"""The canary rollout: the pure state machine (`machine`) and its Prometheus adapter
(`prometheus`). docs/rollout.md describes the strategy."""
