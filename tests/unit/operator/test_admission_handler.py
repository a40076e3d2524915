"""The webhook's kopf handlers, called as kopf calls them: a refused write raises
`kopf.AdmissionError` (422) with the verdict's message; an admitted one returns; the start
fails, naming the settings, without a certificate, and serves HTTPS with the mounted one."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import kopf
import pytest

from kiln_operator import constants
from kiln_operator.handlers import admission
from tests.unit.operator.conftest import load_sample

# kopf types decorated handlers as its own callback protocols; called here as kopf would.
validate = cast(Callable[..., Awaitable[None]], admission.inferenceservice_validate)
startup = cast(Callable[..., Awaitable[None]], admission.admission_startup)


def invalid() -> dict[str, Any]:
    body = load_sample("cpu-test")
    body["spec"]["autoscaling"] = {"minReplicas": 5, "maxReplicas": 2}
    return body


async def test_an_invalid_create_is_refused_naming_the_field() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        await validate(operation="CREATE", subresource=None, new=invalid(), old=None)
    assert refused.value.code == 422
    assert str(refused.value) == (
        "InferenceService refused by Kiln (1 problem): "
        "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"
    )


async def test_what_is_never_judged_is_admitted() -> None:
    body = invalid()
    await validate(operation="DELETE", subresource=None, new=None, old=body)
    await validate(operation="UPDATE", subresource="status", new=body, old=body)
    await validate(operation="UPDATE", subresource=None, new=body, old=body)
    await validate(operation="CREATE", subresource=None, new=load_sample("minimal"), old=None)


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
