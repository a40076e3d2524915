"""PlatformObjects: the start-up listing survives a CRD that is still initializing, a missing
CRD counts as no objects, a refusal is raised; watch events report whether what applies
changed (the handler requeues services only then)."""

from typing import Any

import pytest

from kiln_operator.k8s import platform
from kiln_operator.k8s.client import ApiError, NoAnswer
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.resources import CLUSTER_PROFILES, Resource

PROFILE = {"metadata": {"name": "gpu", "generation": 1}, "spec": {"default": True}}


class FlakyKube:
    """Fails each list `failures[plural]` times with `error`, then answers `items`."""

    def __init__(self, error: Exception, failures: int, items: list[dict[str, Any]]) -> None:
        self.error, self.failures, self.items = error, failures, items
        self.calls = 0

    async def list(self, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
        self.calls += 1
        if resource is CLUSTER_PROFILES and self.calls <= self.failures:
            raise self.error
        return self.items if resource is CLUSTER_PROFILES else []


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "PRIME_FIRST_RETRY_SECONDS", 0.001)
    monkeypatch.setattr(platform, "PRIME_LAST_RETRY_SECONDS", 0.001)


INITIALIZING = ApiError(429, "GET", "/x", '{"message": "storage is (re)initializing"}')


@pytest.mark.parametrize(
    "error",
    [INITIALIZING, ApiError(503, "GET", "/x", "{}"), NoAnswer("GET", "/x", TimeoutError())],
    ids=["initializing", "unavailable", "no-answer"],
)
async def test_answers_that_may_pass_are_retried(error: Exception) -> None:
    objects = PlatformObjects()
    await objects.prime(FlakyKube(error, 3, [PROFILE]))  # type: ignore[arg-type]
    assert [body["metadata"]["name"] for body in objects.state("team").cluster_profiles] == ["gpu"]


async def test_a_missing_crd_is_no_objects_and_a_refusal_is_raised() -> None:
    objects = PlatformObjects()
    await objects.prime(FlakyKube(ApiError(404, "GET", "/x", "{}"), 1, []))  # type: ignore[arg-type]
    assert objects.state("team").cluster_profiles == []
    with pytest.raises(ApiError):
        await PlatformObjects().prime(FlakyKube(ApiError(403, "GET", "/x", "{}"), 1, []))  # type: ignore[arg-type]


async def test_retries_end_after_their_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "PRIME_SECONDS", 0.05)
    kube = FlakyKube(INITIALIZING, 10**6, [])
    with pytest.raises(ApiError, match="429"):
        await PlatformObjects().prime(kube)  # type: ignore[arg-type]
    assert kube.calls > 1


def test_only_a_change_of_what_applies_is_reported() -> None:
    objects = PlatformObjects()
    plural = CLUSTER_PROFILES.plural
    assert objects.observe(plural, None, PROFILE)
    assert not objects.observe(plural, "MODIFIED", {**PROFILE, "status": {"x": 1}})
    bumped = {"metadata": {"name": "gpu", "generation": 2}, "spec": {"default": False}}
    assert objects.observe(plural, "MODIFIED", bumped)
    assert objects.observe(plural, "DELETED", bumped)
    assert not objects.observe(plural, "DELETED", bumped)
