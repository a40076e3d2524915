"""The validating admission webhook: `kubectl apply` of an invalid InferenceService fails.

Thin: it reads the profiles and policies of the object's namespace from the API server, hands
them and kopf's admission request to `profiles.admission.admission_verdict`, the one place that
decides, and raises `kopf.AdmissionError` with its message (every problem, each naming its
field) or passes its warnings on. Every replica serves it: kopf runs its webhook server beside
peering, not under it, so a replica waiting for its turn to reconcile still answers the API
server, and the webhook's Service spreads the reviews over all of them. That is why the
platform's objects are read per request: a waiting replica's watches are paused. If they cannot
be read in time, the write is admitted with a warning (the reconcile judges it anyway), as when
no replica answers.

The webhook's configuration is not managed here: the ValidatingWebhookConfiguration ships with
the chart (or the kustomize component), with `failurePolicy: Ignore`, so the operator needs no
cluster-wide right to rewrite webhook configurations, and an operator that is down delays a
write by at most the webhook's timeout instead of blocking it. The serving certificate is read
from KILN_WEBHOOK_CERT_DIR (`tls.crt`, `tls.key`: a mounted Secret, e.g. cert-manager's); kopf
re-reads the files every minute and serves a renewed certificate without a restart.

Imported (and so registered) only when KILN_WEBHOOK_PORT is set (`__main__`): kopf refuses to
start with an admission handler and no webhook server.
"""

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import kopf

from kiln_operator import constants
from kiln_operator.handlers.inferenceservice import (
    ALLOWED_PROMETHEUS_URLS,
    PROMETHEUS_URL,
    WARMUP_BUDGET_BYTES,
)
from kiln_operator.k8s.client import RequestFailed
from kiln_operator.k8s.platform import read_platform_state
from kiln_operator.profiles.admission import AdmissionRequest, admission_verdict

logger = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
PLATFORM_READ_SECONDS = 3.0
"""How long a review waits for the platform's objects: well inside the webhook's 5 s timeout."""
REFUSED = 422
"""The HTTP status of a refusal, as the API server's own validation uses (Unprocessable)."""


@kopf.on.startup()
async def admission_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Serve the webhook over HTTPS with the mounted certificate; fail the start without one."""
    configured = os.environ.get(constants.ENV_WEBHOOK_CERT_DIR, "")
    directory = Path(configured)
    if not configured or not all((directory / name).is_file() for name in (CERT_FILE, KEY_FILE)):
        raise kopf.PermanentError(
            f"{constants.ENV_WEBHOOK_PORT} is set, so the admission webhook needs its serving "
            f"certificate: {constants.ENV_WEBHOOK_CERT_DIR} ({configured!r}) must name a "
            f"directory holding {CERT_FILE} and {KEY_FILE}"
        )
    settings.admission.server = kopf.WebhookServer(
        port=int(os.environ[constants.ENV_WEBHOOK_PORT]),
        certfile=directory / CERT_FILE,
        pkeyfile=directory / KEY_FILE,
    )


@kopf.on.validate(
    constants.GROUP,
    constants.VERSION,
    constants.PLURAL,
    id=constants.WEBHOOK_HANDLER_ID,
    operations=["CREATE", "UPDATE"],
)
async def inferenceservice_validate(
    *, subresource: str | None, namespace: str | None, warnings: list[str], memo: Any, **kwargs: Any
) -> None:
    """Refuse the write when the operator could not run the spec it would store, naming every
    field. (kopf's `operation`, `new` and `old` arrive in kwargs: its WebhookFn protocol does
    not declare them.)"""
    request = AdmissionRequest(
        operation=kwargs.get("operation") or "",
        subresource=subresource,
        new=kwargs.get("new"),
        old=kwargs.get("old"),
    )
    if not request.judged:
        return
    try:
        platform = await asyncio.wait_for(
            read_platform_state(
                memo.kube, namespace or "", PROMETHEUS_URL, ALLOWED_PROMETHEUS_URLS
            ),
            PLATFORM_READ_SECONDS,
        )
    except (RequestFailed, TimeoutError) as error:
        warnings.append(
            f"Kiln could not read the profiles and policies ({error or 'timed out'}): admitted "
            "unjudged; the operator's Ready condition will judge it"
        )
        return
    try:
        verdict = admission_verdict(request, platform, warmup_budget_bytes=WARMUP_BUDGET_BYTES)
    except Exception:  # a bug must not turn into a refusal: kopf answers "denied" to a crash
        name = ((request.new or {}).get("metadata") or {}).get("name")
        logger.exception("admission review of %s/%s failed", namespace, name)
        warnings.append("Kiln's admission check failed unexpectedly: admitted unjudged")
        return
    warnings.extend(verdict.warnings)
    if verdict.refusal is not None:
        raise kopf.AdmissionError(verdict.refusal, code=REFUSED)
