"""The only code that talks to the Kubernetes API server.

Everything above it (builders, status, api) is pure; handlers call into this package.
"""
