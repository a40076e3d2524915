"""serving.kiln.dev/v1alpha1: the InferenceService API, one module per part of the spec.

Why it exists: validation, the builders, the reconciler and crdgen import every model of this
version from one place, whichever module declares it.
"""

from kiln_operator.api.v1alpha1.autoscaling import (
    AutoscalingSpec,
    AutoscalingStatus,
    PrewarmSpec,
    SloSpec,
)
from kiln_operator.api.v1alpha1.conditions import Condition
from kiln_operator.api.v1alpha1.drain import DrainSpec
from kiln_operator.api.v1alpha1.inferenceservice import (
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
)
from kiln_operator.api.v1alpha1.model import ModelSpec, ModelStorage, TensorSpec
from kiln_operator.api.v1alpha1.resources import ResourcesSpec, Toleration
from kiln_operator.api.v1alpha1.runtime import BatchingSpec, OptimizationSpec, RuntimeSpec
from kiln_operator.api.v1alpha1.warmup import WarmupSpec

__all__ = [
    "AutoscalingSpec",
    "AutoscalingStatus",
    "BatchingSpec",
    "Condition",
    "DrainSpec",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "ModelSpec",
    "ModelStorage",
    "OptimizationSpec",
    "PrewarmSpec",
    "ResourcesSpec",
    "RuntimeSpec",
    "SloSpec",
    "TensorSpec",
    "Toleration",
    "WarmupSpec",
]
