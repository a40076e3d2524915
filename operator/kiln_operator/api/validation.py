"""Parse a stored InferenceService and explain why it is invalid, naming the field.

Why it exists: the CRD schema already rejected what it can at `kubectl apply`; what remains
(min <= max, a cron that parses, a time zone that exists, batch <= queue, ...) surfaces here as
one message per problem, each starting with the field path, for the InvalidSpec condition and
its Warning event.
"""

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kiln_operator.api.v1alpha1 import InferenceServiceSpec

DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 63


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


def parse_spec(name: str, spec: Any) -> InferenceServiceSpec | SpecError:
    """The validated spec, or the reasons it is invalid."""
    name_problem = check_name(name)
    try:
        parsed = InferenceServiceSpec.model_validate(spec if spec is not None else {})
    except ValidationError as error:
        problems = _explain(error)
        return SpecError(((name_problem,) if name_problem else ()) + problems)
    if name_problem is not None:
        return SpecError((name_problem,))
    return parsed
