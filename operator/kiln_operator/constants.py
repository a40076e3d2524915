"""Names Kiln shares with the Kubernetes API: group, labels, annotations, condition types, reasons.

Why it exists: every string that another program (kubectl, Argo CD, the runtime, the warm-up gate,
the autoscaler) matches on is defined once here, with a comment saying who reads it.
"""

from typing import Final

# --- API identity -----------------------------------------------------------------------------
GROUP: Final = "serving.kiln.dev"
"""The API group of Kiln's custom resources."""
VERSION: Final = "v1alpha1"
"""The only served and stored version."""
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "InferenceService"
PLURAL: Final = "inferenceservices"
SINGULAR: Final = "inferenceservice"
SHORT_NAMES: Final = ("kis",)
"""`kis`, not `isvc`: KServe owns `isvc` and both may be installed in one cluster."""
CATEGORIES: Final = ("kiln", "all")
"""`kubectl get kiln` lists every Kiln object; `kubectl get all` includes them."""
PLATFORM_CATEGORIES: Final = ("kiln",)
"""The platform's kinds (profiles, policies) are listed by `kubectl get kiln`, not `get all`."""
CLUSTER_PROFILE_KIND: Final = "ClusterInferenceProfile"
CLUSTER_PROFILE_PLURAL: Final = "clusterinferenceprofiles"
PROFILE_KIND: Final = "InferenceProfile"
PROFILE_PLURAL: Final = "inferenceprofiles"
CLUSTER_POLICY_KIND: Final = "ClusterInferencePolicy"
CLUSTER_POLICY_PLURAL: Final = "clusterinferencepolicies"
POLICY_KIND: Final = "InferencePolicy"
POLICY_PLURAL: Final = "inferencepolicies"

# --- labels on every child object (selectors and `kubectl get -l` rely on them) ---------------
LABEL_NAME: Final = "app.kubernetes.io/name"
"""Value: the InferenceService's name."""
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
"""Value: the InferenceService's name; the pod selector of its Deployment, Service and PDB."""
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
"""Value: COMPONENT_PREDICTOR for the runtime pods."""
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
"""Value: MANAGER. The operator watches only children that carry it."""
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
"""Value: "kiln"."""
LABEL_INFERENCESERVICE: Final = f"{GROUP}/inferenceservice"
"""Value: the owning InferenceService's name; how a child event finds its parent."""
COMPONENT_PREDICTOR: Final = "predictor"
MANAGER: Final = "kiln-operator"
"""The value of LABEL_MANAGED_BY and the field manager of every write this operator makes."""

# --- annotations -------------------------------------------------------------------------------
ANNOTATION_PROMETHEUS_SCRAPE: Final = "prometheus.io/scrape"
ANNOTATION_PROMETHEUS_PORT: Final = "prometheus.io/port"
ANNOTATION_PROMETHEUS_PATH: Final = "prometheus.io/path"
"""The three plain scrape annotations, used when the Prometheus Operator is not installed."""
ANNOTATION_IMITATED_GPUS: Final = f"{GROUP}/imitated-gpus"
"""On the pod template of a GPU service while the operator's ENV_IMITATED_GPUS is on: the pods
request GPUs but their runtime runs on CPU. Read by people (`kubectl describe pod`) and tests."""
ANNOTATION_POD_ANNOTATIONS: Final = f"{GROUP}/pod-annotations"
"""On the pod template of a service whose spec.pod sets annotations: their keys, so that one the
spec drops is seen as drift and removed (other tools add template annotations of their own)."""

# --- operator settings (its environment) -------------------------------------------------------
ENV_IMITATED_GPUS: Final = "KILN_IMITATED_GPUS"
"""`true` only on clusters whose GPUs are imitated (the local cluster, kind): GPU pods still
request `nvidia.com/gpu` and go to GPU nodes, but their runtime is told to run on CPU. Off (the
default), a GPU pod's runtime demands CUDA and fails at start-up on a node without it."""

# --- pod readiness gate (issue 5's warm-up gate sets it) ----------------------------------------
CONDITION_WARMED_UP: Final = f"{GROUP}/warmed-up"
"""Pod condition the warm-up gate sets True once the pod met its warm-up p99 bound."""
ANNOTATION_GATE_REOPENED: Final = f"{GROUP}/warm-up-reopened-at"
"""When the gate was closed again because the runtime container restarted. Written to make the
kubelet read the pod afresh (see handlers/warmup_gate.py)."""

# --- validating admission webhook (handlers/admission.py; the chart's webhook configuration) --
ENV_WEBHOOK_PORT: Final = "KILN_WEBHOOK_PORT"
"""The operator's HTTPS port for the validating admission webhook; unset: no webhook."""
ENV_WEBHOOK_CERT_DIR: Final = "KILN_WEBHOOK_CERT_DIR"
"""Directory of the webhook's serving certificate and key (`tls.crt`, `tls.key`: a mounted
`kubernetes.io/tls` Secret)."""
WEBHOOK_HANDLER_ID: Final = "validate-inferenceservice"
"""The admission handler's id. kopf picks the handler by the request's URL path, so the webhook
configuration's URL (or service path) must be exactly `/validate-inferenceservice`: a path
naming no handler would run none, and so admit everything."""

# --- runtime contract ----------------------------------------------------------------------------
RUNTIME_CONTAINER: Final = "runtime"
FETCH_CONTAINER: Final = "fetch-model"
"""The init container that downloads an s3:// or https:// model (`kiln_runtime fetch`)."""
ENV_RUNTIME_CONFIG: Final = "KILN_RUNTIME_CONFIG"
"""Environment variable carrying the runtime config JSON (the operator/runtime contract)."""
ENV_CACHE_REDIS_USERNAME: Final = "KILN_CACHE_REDIS_USERNAME"
ENV_CACHE_REDIS_PASSWORD: Final = "KILN_CACHE_REDIS_PASSWORD"
"""The response cache's Redis credentials, from spec.runtime.cache.redis.secretName's keys
username and password (the runtime's redis_cache reads them)."""
HTTP_PORT: Final = 8000
GRPC_PORT: Final = 8001
METRICS_PORT: Final = 8002
PORT_NAME_HTTP: Final = "http"
PORT_NAME_GRPC: Final = "grpc"
PORT_NAME_METRICS: Final = "metrics"
HEALTH_LIVE_PATH: Final = "/v2/health/live"
HEALTH_READY_PATH: Final = "/v2/health/ready"
METRICS_PATH: Final = "/metrics"
MODEL_MOUNT_ROOT: Final = "/models"
"""Where a `pvc://` model's claim is mounted read-only inside the runtime container."""
GPU_RESOURCE: Final = "nvidia.com/gpu"
"""Extended resource name of NVIDIA's device plugin; also the taint key of GPU nodes."""
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
"""Node label set by GPU feature discovery, e.g. NVIDIA-A100-SXM4-80GB."""

# --- condition types on InferenceService.status.conditions ---------------------------------------
CONDITION_READY: Final = "Ready"
"""Aggregate: True only when the spec is valid, the Deployment is available and rolled out."""
CONDITION_SPEC_VALID: Final = "SpecValid"
"""False when the spec fails a semantic check; the last valid spec keeps serving."""
CONDITION_DEPLOYMENT_AVAILABLE: Final = "DeploymentAvailable"
"""Mirrors the Deployment's Available condition (at least minAvailable pods ready)."""
CONDITION_PROGRESSING: Final = "Progressing"
"""True while a rollout is in progress; Ready is False meanwhile."""
CONDITION_REPLICA_FLOOR_MET: Final = "ReplicaFloorMet"
"""False while fewer pods are available than spec.autoscaling.minReplicas, with the first cause;
Ready stays True meanwhile as long as pods of the current spec serve."""
CONDITION_REPLICAS_FEASIBLE: Final = "ReplicasFeasible"
"""False while pods the Deployment asks for cannot exist: the ReplicaSet cannot create them
(PodsRefused: a ResourceQuota, a LimitRange, an admission webhook) or the scheduler finds no node
for one (Unschedulable: too few GPUs, no node with the GPU product), with Kubernetes' message.
The autoscaler adds no replicas meanwhile; Ready is unaffected while pods serve."""
CONDITION_STALLED: Final = "Stalled"
"""kstatus's abnormal-true condition: True when the service cannot reach its spec without a
person acting (an invalid spec, a refused child, a stalled rollout, a failed warm-up), with
Ready's reason and message; Flux and `kubectl wait` then report Failed instead of waiting."""
CONDITION_RECONCILING: Final = "Reconciling"
"""kstatus's abnormal-true condition: True while the operator is still bringing the service to
its spec (a rollout, pods warming up, fewer pods than the floor), with Ready's reason and
message (ReplicaFloorMet's below the floor); False once converged or stalled."""
CONDITION_METRICS_AVAILABLE: Final = "MetricsAvailable"
"""Written by the autoscaler: False while Prometheus is down, stale or has no series for the
service (replicas then never go down; spec.autoscaling.whenMetricsMissing applies)."""

# --- condition reasons (CamelCase, as Kubernetes asks) --------------------------------------------
REASON_INVALID_SPEC: Final = "InvalidSpec"
"""The spec failed validation; message names the field path."""
REASON_VALID: Final = "Valid"
"""The spec passed every semantic check."""
REASON_POLICY_VIOLATION: Final = "PolicyViolation"
"""The resolved spec breaks a ClusterInferencePolicy or InferencePolicy; the message names the
policy, the rule and the limit. Nothing running is changed: the service is frozen."""
REASON_PROFILE_NOT_FOUND: Final = "ProfileNotFound"
"""spec.profile names a profile that exists neither as a ClusterInferenceProfile nor as an
InferenceProfile of the namespace; nothing running is changed."""
REASON_PROFILE_INVALID: Final = "ProfileInvalid"
"""A profile the service resolves against does not parse (it was stored under an older schema);
the message names it; nothing running is changed."""
REASON_AVAILABLE: Final = "Available"
"""Every desired replica of the current revision is ready and available."""
REASON_ROLLOUT_IN_PROGRESS: Final = "RolloutInProgress"
"""New pods are being created or old ones removed."""
REASON_ROLLOUT_COMPLETE: Final = "RolloutComplete"
"""The Deployment's current revision is fully rolled out."""
REASON_MINIMUM_REPLICAS_UNAVAILABLE: Final = "MinimumReplicasUnavailable"
"""Fewer ready pods than the Deployment needs to be Available."""
REASON_DEPLOYMENT_MISSING: Final = "DeploymentMissing"
"""The Deployment does not exist (yet, or was deleted and is being recreated)."""
REASON_PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
"""The rollout made no progress within the Deployment's progressDeadlineSeconds."""
REASON_METRICS_READ: Final = "MetricsRead"
"""The autoscaler read fresh p99, queue depth and request rate for the service."""
REASON_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
"""The autoscaler could not read usable metrics; the message says why."""
REASON_SCALED_TO_ZERO: Final = "ScaledToZero"
"""The Deployment has zero replicas: nothing serves, by choice. With minReplicas 0 Ready stays
True (the first request wakes the service); otherwise Ready is False until the autoscaler raises
the replicas to the floor."""
REASON_WAKING: Final = "Waking"
"""minReplicas 0: the service was woken from zero and its first pod is not ready yet; Ready
stays True (Kiln's activator holds the requests until a pod passed its warm-up gate)."""
REASON_ROLLOUT_STALLED: Final = "RolloutStalled"
"""New pods of the current spec cannot serve (the message says why); pods of the previous spec
keep serving meanwhile (the message says how many)."""
REASON_UNSCHEDULABLE: Final = "Unschedulable"
"""A pod cannot be scheduled; the message has the scheduler's reason (GPUs, GPU product, a
missing PersistentVolumeClaim, taints)."""
REASON_PODS_REFUSED: Final = "PodsRefused"
"""The ReplicaSet cannot create pods (a ResourceQuota, a LimitRange, an admission webhook)."""
REASON_IMAGE_PULL_FAILED: Final = "ImagePullFailed"
"""The runtime image cannot be pulled."""
REASON_CONTAINER_CANNOT_START: Final = "ContainerCannotStart"
"""The kubelet cannot create the container as specified (CreateContainerConfigError)."""
REASON_CRASH_LOOP: Final = "CrashLoop"
"""The runtime container keeps exiting; the message has its last termination message."""
REASON_WARMUP_FAILED: Final = "WarmupFailed"
"""A pod's warm-up failed (p99 over the bound, request errors, runtime never ready)."""
REASON_RUNTIME_NOT_READY: Final = "RuntimeNotReady"
"""The runtime container runs but is not ready yet (loading the model)."""
REASON_WARMING_UP: Final = "WarmingUp"
"""The warm-up gate is sending a pod its warm-up requests."""
REASON_FLOOR_MET: Final = "FloorMet"
"""At least minReplicas pods are available."""
REASON_FLOOR_NOT_MET: Final = "FloorNotMet"
"""Fewer than minReplicas pods are available; the message says why."""
REASON_ALL_PODS_PLACED: Final = "AllPodsPlaced"
"""ReplicasFeasible is True: every pod the Deployment asks for was created and scheduled."""
REASON_CHILD_CONFLICT: Final = "ChildConflict"
"""A child's name (Deployment, Service, PodDisruptionBudget, ServiceMonitor) is held by an
object the InferenceService does not control; Kiln writes nothing to it until it is gone."""
REASON_CHILD_REJECTED: Final = "ChildRejected"
"""The API server refused to create, update or delete a child (HTTP 400, 403, 422: sent again
unchanged, it gets the same answer); the message has its answer."""
REASON_CHILD_APPLY_FAILED: Final = "ChildApplyFailed"
"""Reading or writing a child failed in a way that may pass: the API server answered a 5xx or
429, a 409 conflict stayed after re-reading, or no answer came in time. The message has the
answer; the reconcile retries with backoff."""
REASON_MODEL_DOWNLOAD_FAILED: Final = "ModelDownloadFailed"
"""A pod's fetch init container failed; the message is its own ("model download failed:
AccessDenied for s3://…")."""

REASON_NOT_STALLED: Final = "NotStalled"
"""Stalled is False: nothing needs a person; Reconciling says whether work is under way."""
REASON_CONVERGED: Final = "Converged"
"""Reconciling is False: Ready for the current generation and the replica floor met."""
REASON_STALLED: Final = "Stalled"
"""Reconciling is False because the operator cannot progress: the Stalled condition says why."""

# --- event reasons ------------------------------------------------------------------------------
EVENT_READY: Final = "Ready"
EVENT_NOT_READY: Final = "NotReady"
EVENT_SCALED_TO_ZERO: Final = "ScaledToZero"
"""The autoscaler took a service at minReplicas 0 to zero replicas after its idle window."""
EVENT_WAKING_UP: Final = "WakingUp"
"""The autoscaler raised a service from zero (held requests, a pre-warm window)."""

# --- the canary rollout (spec.rollout.canary; rollout/machine.py) ------------------------------
LABEL_TRACK: Final = "serving.kiln.dev/track"
"""On the canary Deployment's pods only (value TRACK_CANARY): the scrape config copies it into
the `kiln_track` series label, so the canary's and the stable version's metrics come apart."""
TRACK_CANARY: Final = "canary"
CANARY_SUFFIX: Final = "-canary"
"""The canary Deployment is named like its InferenceService plus this suffix."""
ANNOTATION_REVISION: Final = "serving.kiln.dev/revision"
"""On the canary Deployment: the revision (hash of the pod template) it runs."""
REASON_CANARY_PROGRESSING: Final = "CanaryProgressing"
"""Reconciling is True: a canary of a new version is on a step (status.rollout says which)."""
REASON_CANARY_PROMOTING: Final = "CanaryPromoting"
"""Reconciling is True: every step passed; the stable Deployment rolls to the new version."""
REASON_CANARY_ROLLED_BACK: Final = "CanaryRolledBack"
"""Stalled is True: the canary was judged worse and removed; the stable version serves until
the spec changes. status.rollout.lastVerdict has the numbers."""
EVENT_CANARY_STARTED: Final = "CanaryStarted"
EVENT_CANARY_STEP_PASSED: Final = "CanaryStepPassed"
EVENT_CANARY_PROMOTED: Final = "CanaryPromoted"
EVENT_CANARY_ROLLED_BACK: Final = "CanaryRolledBack"
EVENT_CANARY_ABANDONED: Final = "CanaryAbandoned"
REASON_CANARY_ERRORS: Final = "CanaryErrors"
"""Fail: the canary's error ratio exceeded maxErrorRatio."""
REASON_CANARY_SLO_BREACHED: Final = "CanarySloBreached"
"""Fail: the canary's p99 exceeded spec.slo.p99LatencyMilliseconds."""
REASON_CANARY_SLOWER: Final = "CanarySlowerThanStable"
"""Fail: the canary's p99 exceeded the stable p99 times maxP99Ratio plus p99SlackMilliseconds."""
REASON_CANARY_STEP_PASSED: Final = "CanaryStepPassed"
"""Pass: the window ended with enough requests and no failure."""
REASON_CANARY_WARMUP_FAILED: Final = "CanaryWarmupFailed"
"""Fail: a canary pod of the new revision failed its warm-up gate on every attempt (the gate's
verdict stays until the pod is replaced): the version cannot meet spec.warmup's bound here."""
REASON_CANARY_PROGRESS_DEADLINE: Final = "CanaryProgressDeadlineExceeded"
"""Fail: no canary pod of the new revision was ready for the canary's progressDeadlineSeconds;
the message has the first cause the pods showed (a crash loop, an image, the scheduler)."""
REASON_CANARY_NOT_READY: Final = "CanaryNotReady"
"""Hold: no ready canary pod runs the new revision; the window restarts when the step's
replicas are ready again (a rollback after progressDeadlineSeconds of it)."""
REASON_CANARY_SCALING: Final = "CanaryScaling"
"""Hold: the Deployments are not yet at the step's sizes with every pod ready; the step's window
starts when they are (errors and an SLO breach are judged meanwhile)."""
REASON_CANARY_MEASURING: Final = "CanaryMeasuring"
"""Hold: both Deployments are at the step's sizes and ready: the step's window (re)started."""
REASON_CANARY_TOO_FEW_REQUESTS: Final = "CanaryTooFewRequests"
"""Hold: the window ended with fewer canary requests than minRequests; the step goes on."""
REASON_CANARY_METRICS_UNAVAILABLE: Final = "CanaryMetricsUnavailable"
"""Hold: Prometheus could not be read; nothing is promoted blind."""
