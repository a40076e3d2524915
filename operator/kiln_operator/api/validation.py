"""Parse a stored InferenceService and explain why it is invalid, naming the field.

Why it exists: the CRD schema already rejected what it can at `kubectl apply`; what remains
(min <= max, a cron that parses, a time zone that exists, batch <= queue, ...) surfaces here as
one message per problem, each starting with the field path, for the InvalidSpec condition and
its Warning event. It also refuses what the API server would refuse only when the Deployment is
written (a quantity that is no quantity, a label key that is no label key), and what no child
should ever be given (a model path leaving its claim, a warm-up request larger than the
operator's memory budget), so the reconcile never writes a child it knows to be wrong.
`parse_spec` is pure and needs only the spec, so the validating admission webhook
(profiles/admission.py, through the effective spec) refuses such a spec at `kubectl apply`.
"""

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.model import TensorSpec
from kiln_operator.api.v1alpha1.resources import Toleration

DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 63

QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]|[eE][+-]?[0-9]+)?$"
)
"""Kubernetes' quantity grammar (apimachinery resource.Quantity): a signed decimal number, then
a binary-SI suffix, a decimal-SI suffix or a decimal exponent. No library in the operator's
dependencies parses it exactly (kubernetes' parse_quantity lives in the I/O client)."""
QUANTITY_SUFFIXES = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6),
    "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""The name part of a label key, and a non-empty label value (apimachinery IsQualifiedName)."""
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
MAX_LABEL_NAME = 63
MAX_LABEL_PREFIX = 253

DEFAULT_WARMUP_BUDGET_BYTES = 64 * 2**20
"""The default byte budget for warm-up request data held by the operator at once (all services
together): an eighth of the operator's 512 Mi memory limit. The KILN_WARMUP_BUDGET_BYTES
setting of the operator changes it."""
DATATYPE_BYTES = {
    "FP32": 4, "FP16": 2, "BF16": 4, "INT64": 8, "INT32": 4, "INT8": 1, "UINT8": 1, "BOOL": 1,
}  # fmt: skip
"""Bytes per element, as the warm-up holds tensors: BF16 as float32 (numpy has no bfloat16,
and tritonclient takes and returns BF16 data as float32; only the wire form is 2 bytes)."""


@dataclass(frozen=True)
class SpecError:
    """Why a spec was refused: one line per problem, each naming its field path."""

    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        """All problems in one message, as the InvalidSpec condition shows it."""
        return "; ".join(self.problems)


def _field_path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _explain(error: ValidationError) -> tuple[str, ...]:
    problems = []
    for detail in error.errors(include_url=False):
        message = str(detail["msg"]).removeprefix("Value error, ")
        problems.append(f"{_field_path(tuple(detail['loc']))}: {message}")
    return tuple(problems)


def check_name(name: str) -> str | None:
    """The InferenceService's name also names its Service: it must be a DNS-1035 label."""
    if len(name) > MAX_NAME_LENGTH or not DNS_1035_LABEL.match(name):
        return (
            f"metadata.name: {name!r} must be a DNS-1035 label (lower-case letters, digits, '-', "
            f"starting with a letter, at most {MAX_NAME_LENGTH} characters): it names the Service"
        )
    return None


def parse_quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity ("500m" -> 0.5, "1Gi" -> 1073741824), or None when
    `text` is not one ("1.2.3", "1x", "")."""
    match = QUANTITY.match(text)
    if match is None:
        return None
    suffix = match.group("suffix") or ""
    try:
        number = Decimal(match.group("number"))
        if suffix[:1] in ("e", "E") and len(suffix) > 1:
            return number.scaleb(int(suffix[1:]))
        return number * QUANTITY_SUFFIXES[suffix]
    except (InvalidOperation, ValueError, OverflowError):
        return None


def check_positive_quantity(path: str, text: str) -> str | None:
    """Why `text` is not a positive Kubernetes quantity, naming `path`; None if it is one."""
    value = parse_quantity(text)
    if value is None:
        return f"{path}: {text!r} is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)"
    if value <= 0:
        return f"{path}: {text!r} must be greater than zero"
    return None


def check_label_key(path: str, key: str) -> str | None:
    """Why `key` is not a valid label key (an optional DNS subdomain prefix and '/', then a
    name of at most 63 characters), naming `path`; None if it is one."""
    prefix, _, label = key.rpartition("/")
    if "/" in key and (
        not prefix or len(prefix) > MAX_LABEL_PREFIX or not DNS_1123_SUBDOMAIN.match(prefix)
    ):
        return f"{path}: key {key!r} has an invalid prefix (a lower-case DNS subdomain)"
    if len(label) > MAX_LABEL_NAME or not LABEL_NAME.match(label):
        return (
            f"{path}: key {key!r} is not a label key (at most {MAX_LABEL_NAME} characters of "
            "letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        )
    return None


def check_label_value(path: str, value: str) -> str | None:
    """Why `value` is not a valid label value, naming `path`; None if it is one."""
    if value and (len(value) > MAX_LABEL_NAME or not LABEL_NAME.match(value)):
        return (
            f"{path}: value {value!r} is not a label value (empty, or at most "
            f"{MAX_LABEL_NAME} characters of letters, digits, '-', '_', '.', starting and "
            "ending with a letter or digit)"
        )
    return None


def _toleration_problems(index: int, toleration: Toleration) -> list[str]:
    path = f"spec.resources.tolerations[{index}]"
    problems = []
    if toleration.key:
        problems.append(check_label_key(f"{path}.key", toleration.key))
    elif toleration.operator != "Exists":
        problems.append(f"{path}.operator: must be Exists when key is empty")
    if toleration.operator == "Exists" and toleration.value:
        problems.append(f"{path}.value: must be empty when operator is Exists")
    if toleration.value:
        problems.append(check_label_value(f"{path}.value", toleration.value))
    if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
        problems.append(f"{path}.tolerationSeconds: only allowed with effect NoExecute")
    return [problem for problem in problems if problem]


def check_model_path(uri: str) -> str | None:
    """Why the model's path leaves its source (a `..` segment: out of the claim, or out of
    the image's model directory), naming spec.model.uri; None if it stays inside."""
    if uri.startswith("pvc://"):
        path = uri.removeprefix("pvc://").partition("/")[2]
    elif uri.startswith(("file://", "/")):
        path = uri.removeprefix("file://")
    else:
        return None
    if ".." in path.split("/"):
        return (
            f"spec.model.uri: {uri!r} contains a '..' segment: the model path must stay inside "
            "its source (the claim, or the image)"
        )
    return None


def tensor_bytes(tensors: list[TensorSpec]) -> int:
    """Bytes of the tensors at batch 1, each variable dimension (-1) taken as 1: how the
    warm-up synthesises them."""
    total = 0
    for tensor in tensors:
        elements = 1
        for dimension in tensor.shape:
            elements *= max(dimension, 1)
        total += elements * DATATYPE_BYTES[tensor.datatype]
    return total


def warmup_attempt_bytes(input_bytes: int, output_bytes: int, in_flight: int) -> int:
    """What one warm-up attempt holds in the operator with `in_flight` requests at once: its
    inputs, prepared once and shared by its requests, and per request in flight the request
    and its response, each twice (the message and its wire form)."""
    return input_bytes + in_flight * 2 * (input_bytes + output_bytes)


def warmup_request_bytes(spec: InferenceServiceSpec) -> int:
    """What a warm-up attempt of the spec holds with a single request in flight: the least
    the operator's warm-up budget must allow."""
    return warmup_attempt_bytes(
        tensor_bytes(spec.model.inputs), tensor_bytes(spec.model.outputs), 1
    )


def check_warmup_budget(spec: InferenceServiceSpec, budget_bytes: int) -> str | None:
    """Why one warm-up request of the spec cannot fit in the operator's warm-up budget."""
    if spec.warmup.requests == 0:
        return None
    size = warmup_request_bytes(spec)
    if size <= budget_bytes:
        return None
    return (
        f"spec.model.inputs: one warm-up request needs {size} bytes of tensor data in the "
        f"operator (inputs at batch 1 prepared once, then the request and its response; "
        f"spec.warmup.batchSizes run inside the runtime and do not count), more than the "
        f"operator's warm-up budget of {budget_bytes} bytes: declare smaller inputs, set "
        "spec.warmup.requests to 0, or raise the budget (KILN_WARMUP_BUDGET_BYTES)"
    )


def applicable_problems(
    spec: InferenceServiceSpec, warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES
) -> list[str]:
    """What the schema lets through but the API server, the runtime or the operator's own
    limits would refuse later, one message per problem, each naming its field."""
    resources = spec.resources
    problems = [
        check_positive_quantity("spec.resources.cpu", resources.cpu),
        check_positive_quantity("spec.resources.memory", resources.memory),
        check_model_path(spec.model.uri),
        check_warmup_budget(spec, warmup_budget_bytes),
    ]
    for key, value in resources.node_selector.items():
        problems.append(check_label_key("spec.resources.nodeSelector", key))
        problems.append(check_label_value(f"spec.resources.nodeSelector[{key}]", value))
    for index, toleration in enumerate(resources.tolerations):
        problems.extend(_toleration_problems(index, toleration))
    for key, value in spec.pod.labels.items():
        problems.append(check_label_key("spec.pod.labels", key))
        problems.append(check_label_value(f"spec.pod.labels[{key}]", value))
    for key in spec.pod.annotations:  # annotation keys follow the label key grammar
        problems.append(check_label_key("spec.pod.annotations", key))
    ceiling = spec.autoscaling.max_replicas
    for index, schedule in enumerate(spec.prewarm.schedules):
        if schedule.min_replicas > ceiling:
            problems.append(
                f"spec.prewarm.schedules[{index}].minReplicas ({schedule.min_replicas}) exceeds "
                f"spec.autoscaling.maxReplicas ({ceiling}): the floor could never be met; "
                "lower it or raise maxReplicas"
            )
    return [problem for problem in problems if problem]


def parse_spec(
    name: str, spec: Any, *, warmup_budget_bytes: int = DEFAULT_WARMUP_BUDGET_BYTES
) -> InferenceServiceSpec | SpecError:
    """The validated spec, or the reasons it is invalid. `warmup_budget_bytes`: the operator's
    warm-up budget, which one warm-up request must fit in."""
    name_problem = check_name(name)
    try:
        parsed = InferenceServiceSpec.model_validate(spec if spec is not None else {})
    except ValidationError as error:
        problems = _explain(error)
        return SpecError(((name_problem,) if name_problem else ()) + problems)
    later = applicable_problems(parsed, warmup_budget_bytes)
    if name_problem is not None or later:
        return SpecError(((name_problem,) if name_problem else ()) + tuple(later))
    return parsed
