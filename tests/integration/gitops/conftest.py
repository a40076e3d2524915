"""Fixtures of the GitOps tests: the operator fixtures of tests/integration/operator, shared."""

from tests.integration.operator.conftest import (  # noqa: F401  (pytest finds fixtures by name)
    audit,
    kiln_crds,
    operator,
    start_operator,
)
