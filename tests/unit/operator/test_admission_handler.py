"""The webhook's kopf handlers, called as kopf calls them: a refused write raises
`kopf.AdmissionError` (422) with the verdict's message; an admitted one returns; the platform's
objects are read for the object's namespace, and when they cannot be read the write is admitted
with a warning; the start fails, naming the settings, without a certificate, and serves HTTPS
with the mounted one."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import kopf
import pytest

from kiln_operator import constants
from kiln_operator.handlers import admission
from kiln_operator.k8s.client import NoAnswer
from kiln_operator.k8s.resources import Resource
from tests.unit.operator.conftest import load_sample
from tests.unit.operator.test_platform import policy

# kopf types decorated handlers as its own callback protocols; called here as kopf would.
validate = cast(Callable[..., Awaitable[None]], admission.inferenceservice_validate)
startup = cast(Callable[..., Awaitable[None]], admission.admission_startup)


class FakeKube:
    """Answers each LIST of a platform kind from `objects` (by plural); records the scopes."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.objects = objects or {}
        self.listed: list[tuple[str, str | None]] = []

    async def list(self, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
        self.listed.append((resource.plural, namespace))
        return self.objects.get(resource.plural, [])


class DeadKube:
    async def list(self, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
        raise NoAnswer("GET", f"/{resource.plural}", ConnectionRefusedError("refused"))


def invalid() -> dict[str, Any]:
    body = load_sample("cpu-test")
    body["spec"]["autoscaling"] = {"minReplicas": 5, "maxReplicas": 2}
    return body


async def review(kube: Any, warnings: list[str] | None = None, **request: Any) -> None:
    memo = kopf.Memo(kube=kube)
    await validate(namespace="team", warnings=[] if warnings is None else warnings, memo=memo,
                   **request)  # fmt: skip


async def test_an_invalid_create_is_refused_naming_the_field() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        await review(FakeKube(), operation="CREATE", subresource=None, new=invalid(), old=None)
    assert refused.value.code == 422
    assert str(refused.value) == (
        "InvalidSpec: spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
    )


async def test_the_namespaces_policies_are_read_and_applied() -> None:
    limits = policy("team-limits", maxReplicas=1)
    limits["metadata"]["namespace"] = "team"
    kube = FakeKube({"inferencepolicies": [limits]})
    with pytest.raises(kopf.AdmissionError, match="InferencePolicy team-limits"):
        await review(
            kube, operation="CREATE", subresource=None, new=load_sample("cpu-test"), old=None
        )
    assert ("inferencepolicies", "team") in kube.listed
    assert ("clusterinferencepolicies", None) in kube.listed


async def test_what_is_never_judged_is_admitted_without_a_read() -> None:
    body = invalid()
    kube = FakeKube()
    await review(kube, operation="DELETE", subresource=None, new=None, old=body)
    await review(kube, operation="UPDATE", subresource="status", new=body, old=body)
    await review(kube, operation="UPDATE", subresource=None, new=body, old=body)
    assert kube.listed == []
    await review(kube, operation="CREATE", subresource=None, new=load_sample("minimal"), old=None)


async def test_unreadable_platform_objects_admit_with_a_warning() -> None:
    warnings: list[str] = []
    await review(
        DeadKube(), warnings, operation="CREATE", subresource=None, new=invalid(), old=None
    )
    (warning,) = warnings
    assert warning.startswith("Kiln could not read the profiles and policies (")
    assert "admitted unjudged" in warning


async def test_the_start_fails_without_a_certificate_naming_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(constants.ENV_WEBHOOK_PORT, "9443")
    settings = kopf.OperatorSettings()
    monkeypatch.delenv(constants.ENV_WEBHOOK_CERT_DIR, raising=False)
    with pytest.raises(kopf.PermanentError, match="KILN_WEBHOOK_CERT_DIR"):
        await startup(settings=settings)
    (tmp_path / "tls.crt").write_text("certificate")  # the key is missing
    monkeypatch.setenv(constants.ENV_WEBHOOK_CERT_DIR, str(tmp_path))
    with pytest.raises(kopf.PermanentError, match=r"tls\.crt and tls\.key"):
        await startup(settings=settings)
    assert settings.admission.server is None


async def test_the_webhook_is_served_over_https_with_the_mounted_certificate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text(name)
    monkeypatch.setenv(constants.ENV_WEBHOOK_PORT, "9443")
    monkeypatch.setenv(constants.ENV_WEBHOOK_CERT_DIR, str(tmp_path))
    settings = kopf.OperatorSettings()
    await startup(settings=settings)
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    assert (server.port, server.addr, server.insecure) == (9443, None, False)
    assert (server.certfile, server.pkeyfile) == (tmp_path / "tls.crt", tmp_path / "tls.key")
    assert settings.admission.managed is None  # the chart ships the configuration


async def test_a_crash_of_the_check_admits_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf answers "denied" to a handler that raises, and failurePolicy Ignore does not cover
    that: a bug in the check must admit (the reconcile still judges the object), not refuse."""

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(admission, "admission_verdict", broken)
    warnings: list[str] = []
    await review(
        FakeKube(), warnings, operation="CREATE", subresource=None, new=invalid(), old=None
    )
    assert warnings == ["Kiln's admission check failed unexpectedly: admitted unjudged"]
