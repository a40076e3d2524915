"""`..` does not walk out of an allow-list: paths are compared as the HTTP client requests them,
and a dot segment (raw or percent-encoded) in a Prometheus URL, an allow-list entry or an image
is refused outright, naming the rule, on the reconcile's path and the admission webhook's alike
(both go through `effective_spec`)."""

from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.api.dotsegments import (
    decode_unreserved,
    has_dot_segment,
    image_has_dot_segment,
    normalized_path,
    remove_dot_segments,
)
from kiln_operator.profiles.admission import AdmissionRequest, admission_verdict
from kiln_operator.profiles.effective import PlatformState, effective_spec
from kiln_operator.profiles.guardrails import url_allowed
from tests.unit.operator.test_platform import MODEL, PLATFORM, policy

ALLOWED = "http://prom.monitoring:9090/prom"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://prom.monitoring:9090/prom/../p7", False),
        ("http://prom.monitoring:9090/prom/%2e%2e/p7b", False),
        ("http://prom.monitoring:9090/prom/%2E%2E/p7b", False),
        ("http://prom.monitoring:9090/prom/.%2e/p7c", False),
        ("http://prom.monitoring:9090/prom/tenant/../../p7", False),
        ("http://prom.monitoring:9090/prom/a/../b", True),
        ("http://prom.monitoring:9090/%70rom/x", True),
        ("http://prom.monitoring:9090/prom/x", True),
    ],
)
def test_the_allow_list_compares_normalized_paths(url: str, allowed: bool) -> None:
    assert url_allowed(url, ALLOWED) is allowed


def test_an_entry_is_normalized_too() -> None:
    # an operator-set entry (KILN_ALLOWED_PROMETHEUS_URLS is not an API object) is read as the
    # client would request it
    assert url_allowed("http://prom:9090/p7/x", "http://prom:9090/prom/../p7")
    assert not url_allowed("http://prom:9090/prom/x", "http://prom:9090/prom/../p7")


@pytest.mark.parametrize(
    ("path", "normalized"),
    [
        ("/prom/../p7", "/p7"),
        ("/prom/%2e%2e/p7b", "/p7b"),
        ("/a/b/c/./../../g", "/a/g"),  # RFC 3986 section 5.2.4's example
        ("mid/content=5/../6", "mid/6"),  # and its second one
        ("/..", "/"),
        ("/../../x", "/x"),
        ("/a/.", "/a/"),
        ("/%7Euser/%2Fx", "/~user/%2Fx"),  # an encoded slash is not unreserved: it stays
        ("", ""),
    ],
)
def test_normalization_follows_rfc_3986(path: str, normalized: str) -> None:
    assert normalized_path(path) == normalized


def test_only_unreserved_characters_are_decoded() -> None:
    assert decode_unreserved("%2e%41%7e%2f%25") == ".A~%2F%25"
    assert remove_dot_segments("/a/%2e%2e/b") == "/a/%2e%2e/b"  # decoding comes first


def test_dot_segments_raw_or_encoded_are_found() -> None:
    assert has_dot_segment("/prom/../p7") and has_dot_segment("/prom/%2e%2e/p7b")
    assert has_dot_segment("/prom/./x") and has_dot_segment("/prom/%2E")
    assert not has_dot_segment("/prom/..x/a.b/...")
    # an encoded dot anywhere, and dot segments between encoded slashes or backslashes, which a
    # proxy that decodes before it normalizes would resolve
    assert has_dot_segment("/prom/a%2Eb") and has_dot_segment("/prom%2F..%2Fp7")
    assert has_dot_segment("/prom%5c..%5cp7") and has_dot_segment("/prom\\..\\p7")
    assert image_has_dot_segment("kiln/runtime/../evil:1")
    assert image_has_dot_segment("./kiln/runtime:1") and image_has_dot_segment("kiln/..@sha256:a")
    assert not image_has_dot_segment("registry.example.com:5000/kiln/runtime:1.4.0")


def _judged(spec: dict[str, Any], state: PlatformState) -> tuple[str | None, str]:
    result = effective_spec("mlp", {"model": MODEL, **spec}, state)
    assert result.spec is None
    return result.reason, result.message or ""


@pytest.mark.parametrize(
    "url", ["http://prom.monitoring:9090/prom/../p7", "http://prom.monitoring:9090/prom/%2e%2e/p7b"]
)
def test_a_prometheus_url_with_a_dot_segment_is_invalid_naming_the_rule(url: str) -> None:
    state = PlatformState(
        cluster_profiles=[PLATFORM],
        cluster_policies=[policy("limits", allowedPrometheusUrls=[ALLOWED])],
    )
    reason, message = _judged({"autoscaling": {"prometheusUrl": url}}, state)
    assert reason == constants.REASON_INVALID_SPEC
    assert "spec.autoscaling.prometheusUrl" in message
    assert "may not hold a dot segment" in message


def test_an_image_with_a_dot_segment_is_invalid_naming_the_rule() -> None:
    state = PlatformState(
        cluster_profiles=[PLATFORM],
        cluster_policies=[policy("limits", allowedImages=["kiln/runtime"])],
    )
    reason, message = _judged({"runtime": {"image": "kiln/runtime/../evil:1"}}, state)
    assert reason == constants.REASON_INVALID_SPEC
    assert "spec.runtime.image" in message
    assert "path components may not be '.' or '..'" in message
    # and the percent-encoded form never was an image reference
    reason, message = _judged({"runtime": {"image": "kiln/runtime/%2e%2e/evil:1"}}, state)
    assert reason == constants.REASON_INVALID_SPEC and "spec.runtime.image" in message


@pytest.mark.parametrize(
    "limits",
    [
        {"allowedPrometheusUrls": ["http://prom.monitoring:9090/prom/../p7"]},
        {"allowedPrometheusUrls": ["http://prom.monitoring:9090/prom/%2e%2e"]},
        {"allowedImages": ["kiln/runtime/.."]},
    ],
)
def test_a_policy_entry_with_a_dot_segment_makes_it_allow_nothing(limits: dict[str, Any]) -> None:
    state = PlatformState(cluster_profiles=[PLATFORM], cluster_policies=[policy("bad", **limits)])
    reason, message = _judged({}, state)
    assert reason == constants.REASON_POLICY_VIOLATION
    assert "ClusterInferencePolicy bad does not parse" in message
    assert "may not" in message and "'.' or '..'" in message


def test_the_admission_webhook_refuses_the_same() -> None:
    state = PlatformState(
        cluster_profiles=[PLATFORM],
        cluster_policies=[policy("limits", allowedPrometheusUrls=[ALLOWED])],
    )
    body = {
        "metadata": {"name": "mlp", "namespace": "team-a"},
        "spec": {
            "model": MODEL,
            "autoscaling": {"prometheusUrl": "http://prom.monitoring:9090/prom/../p7"},
        },
    }
    verdict = admission_verdict(AdmissionRequest("CREATE", None, body), state)
    assert verdict.refusal is not None and verdict.refusal.startswith("InvalidSpec: ")
    assert "may not hold a dot segment" in verdict.refusal
