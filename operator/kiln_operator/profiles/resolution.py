"""Resolve an InferenceService's spec against its profiles: the fields it leaves out are taken
from the namespace's InferenceProfile, else the ClusterInferenceProfile, else Kiln's built-in
defaults (the spec models' own).

Why it exists: the reconcile loop, the autoscaler and the warm-up gate must all act on the same
resolved spec, and the precedence is the contract with platform teams, so it is one pure,
unit-tested function. Resolution works on the wire form (dicts): "left out" means absent from the
stored object, which a parsed model with defaults filled in could no longer tell.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kiln_operator import constants
from kiln_operator.api.v1alpha1.partial import set_fields
from kiln_operator.api.v1alpha1.profile import ProfileSpec
from kiln_operator.builders.naming import Manifest


@dataclass(frozen=True)
class ProfileUsed:
    """A profile a spec was resolved against (status.profiles)."""

    kind: str
    name: str
    generation: int

    def as_status(self) -> dict[str, Any]:
        """The status.profiles entry."""
        return {"kind": self.kind, "name": self.name, "generation": self.generation}


@dataclass(frozen=True)
class Resolved:
    """The spec with every profile's defaults filled in, and the profiles used."""

    spec: Manifest
    profiles: tuple[ProfileUsed, ...]


@dataclass(frozen=True)
class Unresolved:
    """Why the spec cannot be resolved: a named profile is missing or does not parse."""

    reason: str
    message: str


def merged(defaults: Mapping[str, Any], spec: Mapping[str, Any]) -> Manifest:
    """`spec` with every key it leaves out taken from `defaults`, object by object; a key the
    spec sets (lists included) keeps the spec's value whole."""
    result: Manifest = dict(defaults)
    for key, value in spec.items():
        default = result.get(key)
        if isinstance(value, Mapping) and isinstance(default, Mapping):
            result[key] = merged(default, value)
        else:
            result[key] = value
    return result


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name", ""))


def default_profile_name(cluster_profiles: Sequence[Mapping[str, Any]]) -> str | None:
    """The ClusterInferenceProfile marked default (the first by name if several are)."""
    marked = sorted(
        _name(body) for body in cluster_profiles if (body.get("spec") or {}).get("default") is True
    )
    return marked[0] if marked else None


def _layer(kind: str, body: Mapping[str, Any]) -> tuple[ProfileUsed, Manifest] | Unresolved:
    try:
        profile = ProfileSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in detail['loc'])}: {detail['msg']}"
            for detail in error.errors(include_url=False)
        )
        return Unresolved(
            constants.REASON_PROFILE_INVALID,
            f"{kind} {_name(body)} is invalid ({problems}): fix it or name another profile",
        )
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    return ProfileUsed(kind, _name(body), generation), set_fields(profile.defaults)


def resolve(
    spec: Mapping[str, Any] | None,
    cluster_profiles: Sequence[Mapping[str, Any]],
    namespace_profiles: Sequence[Mapping[str, Any]],
) -> Resolved | Unresolved:
    """The spec as the operator runs it. `cluster_profiles`: every ClusterInferenceProfile;
    `namespace_profiles`: the InferenceProfiles of the service's namespace.

    spec.profile names the profile; left out, the cluster's default profile's name is used.
    The namespace's InferenceProfile of that name comes first, then the ClusterInferenceProfile
    of that name, then the built-in defaults. A named profile that exists at neither level is
    Unresolved (the caller changes nothing running); no default profile is no error.
    """
    own: Manifest = dict(spec or {})
    named = own.get("profile")
    name = named if isinstance(named, str) and named else default_profile_name(cluster_profiles)
    if name is None:
        return Resolved(own, ())
    layers: list[tuple[str, Mapping[str, Any]]] = [
        (constants.PROFILE_KIND, body) for body in namespace_profiles if _name(body) == name
    ] + [(constants.CLUSTER_PROFILE_KIND, body) for body in cluster_profiles if _name(body) == name]
    if not layers:
        if named:
            return Unresolved(
                constants.REASON_PROFILE_NOT_FOUND,
                f"spec.profile: no ClusterInferenceProfile or InferenceProfile named {name!r} "
                "exists: create it, or name an existing profile",
            )
        return Resolved(own, ())
    used: list[ProfileUsed] = []
    resolved = own
    for kind, body in layers:  # the namespace's first: it wins over the cluster's
        layer = _layer(kind, body)
        if isinstance(layer, Unresolved):
            return layer
        profile, defaults = layer
        used.append(profile)
        resolved = merged(defaults, resolved)
    return Resolved(resolved, tuple(used))
