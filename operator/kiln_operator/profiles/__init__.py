"""Platform profiles and policies applied to an InferenceService: pure, no I/O.

`resolution` fills the fields a spec leaves out from its profiles; `guardrails` checks the
resolved spec against every policy that applies. The operator's effects layer
(`kiln_operator.k8s.platform`) feeds both from its watch-fed cache. `effective` is the one
answer for an object built from them, and `admission` the validating webhook's verdict on it.
"""
