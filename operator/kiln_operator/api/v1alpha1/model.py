"""spec.model: what to serve — where the weights are, in which format, with which tensors.

Why it exists: the runtime refuses a request whose tensors do not match the declared ones, and
the warm-up gate synthesises requests from them, so the declaration lives in the API.
"""

from pathlib import PurePosixPath
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from kiln_operator.api.v1alpha1.base import ApiModel

Datatype = Literal["FP32", "FP16", "BF16", "INT64", "INT32", "INT8", "UINT8", "BOOL"]
"""Tensor element types, named as the Open Inference Protocol (KServe v2) names them."""

ModelFormat = Literal["torchscript", "torch_export", "onnx"]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MODEL_URI_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^\s]+|file:///[^\s]*[^\s/]|/[^\s]*[^\s/]"
    r"|s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\s]*)?|https://[^\s/]+/[^\s]*[^\s/])$"
)
"""`pvc://<claim>/<path>` (claim mounted read-only); `file:///<path>` or `/<path>` (image);
`s3://<bucket>/<key>` or `s3://<bucket>/<prefix>/` and `https://<host>/<path>` (fetched)."""
REMOTE_SCHEMES = ("s3://", "https://")
DEFAULT_MAX_MODEL_BYTES = 64 * 1024**3
FETCH_ROOT = "/models/fetched"
"""Where the fetch init container writes an s3:// or https:// model (an emptyDir); the model
itself is at <FETCH_ROOT>/model (the fetcher's rename target)."""


CACHE_ROOT = "/models/cache"
"""Where the fetch init container mounts the shared cache claim."""


class ModelCache(ApiModel):
    """A volume the model's pods share, so that only the first downloads (s3:// only)."""

    claim_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN)]
    """A ReadWriteMany PersistentVolumeClaim in the InferenceService's namespace, mounted into
    the fetch init container only. Entries are keyed by URI and the objects' ETags."""
    max_bytes: Annotated[int, Field(ge=1, le=2**50)] = 256 * 1024**3
    """The cache's budget: after a new entry, the least recently used others are removed until
    the entries fit."""


class ModelStorage(ApiModel):
    """How an s3:// or https:// model is fetched before the runtime starts."""

    secret_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """A Secret in the InferenceService's namespace, mounted read-only into the fetch init
    container only. Keys: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally
    AWS_SESSION_TOKEN) for s3://; ca.crt, a PEM bundle of the CAs to trust, for either scheme.
    Without keys, s3:// uses the pod's identity (serviceAccountName: workload identity)."""
    service_account_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """The runtime pods' ServiceAccount, for workload identity (e.g. an IAM role bound to it);
    its API token is still not mounted."""
    endpoint: Annotated[
        str | None, Field(max_length=512, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    ] = None
    """The URL of an S3-compatible store, e.g. https://minio.storage.svc:9000; unset is AWS."""
    region: Annotated[str | None, Field(max_length=32, pattern=r"^[a-z0-9\-]+$")] = None
    """The store's region (us-east-1 when unset)."""
    path_style: bool = False
    """Address buckets as <endpoint>/<bucket> (most S3-compatible stores) instead of
    <bucket>.<endpoint>."""
    tls_verify: bool = True
    """Verify the store's TLS certificate (against ca.crt of the Secret when it has one)."""
    cache: ModelCache | None = None
    """A shared cache of s3:// models (a ReadWriteMany claim); without one each pod fetches."""
    max_bytes: Annotated[int, Field(ge=1, le=2**50)] = DEFAULT_MAX_MODEL_BYTES
    """The largest model (all objects of a prefix together) the fetcher downloads; a larger
    one fails with TooLarge. Also the size limit of the pod's model volume."""


class TensorSpec(ApiModel):
    """One named input or output tensor of the model."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")]
    """Tensor name as clients send it, e.g. INPUT__0."""
    datatype: Datatype
    """Element type in the protocol's naming: FP32, FP16, BF16, INT64, INT32, INT8, UINT8, BOOL."""
    shape: Annotated[list[Annotated[int, Field(ge=-1, le=1_000_000)]], Field(max_length=8)]
    """Dimensions without the batch dimension; -1 marks a variable dimension. [] is a scalar."""

    @field_validator("shape")
    @classmethod
    def _no_zero_dimension(cls, shape: list[int]) -> list[int]:
        if 0 in shape:
            raise ValueError("a dimension is 0; use a positive size or -1 for variable")
        return shape


class ModelSpec(ApiModel):
    """The model to serve."""

    uri: Annotated[str, Field(max_length=1024, pattern=MODEL_URI_PATTERN)]
    """Where the model is. `pvc://<claim>/<path>` mounts the PersistentVolumeClaim <claim>
    read-only at /models/<claim> and loads /models/<claim>/<path>; `file:///<path>` or `/<path>` is
    a file already inside the runtime image; `s3://<bucket>/<key>` (one object),
    `s3://<bucket>/<prefix>/` (every object under it, a directory-shaped model) and
    `https://<host>/<path>` are downloaded, verified, by an init container before the runtime
    starts (see storage)."""
    sha256: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$")] = None
    """The expected sha256 (lower-case hex) of an https:// file or a single s3:// object; the
    download fails with ChecksumMismatch otherwise. (s3:// objects are also checked against
    their ETag.)"""
    storage: ModelStorage | None = None
    """Settings for fetching an s3:// or https:// model: credentials, endpoint, limits."""
    format: ModelFormat
    """Serialisation of the model file: torchscript (torch.jit.save), torch_export
    (torch.export.save) or onnx."""
    name: Annotated[str | None, Field(max_length=63, pattern=DNS_LABEL)] = None
    """Model name in the inference protocol's URLs (/v2/models/<name>); defaults to the
    InferenceService's name."""
    version: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.\-]+$")] = "1"
    """Model version reported by the protocol's model metadata."""
    inputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=64)]
    """Input tensors, in the order the model's forward() takes them."""
    outputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=64)]
    """Output tensors, in the order the model returns them."""
    deterministic: bool = False
    """true: the model answers the same inputs with the same outputs (no sampling, no dropout or
    randomness at inference), so its answers may be cached (runtime.cache). Left false, Kiln
    never caches them."""

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique_names(cls, tensors: list[TensorSpec]) -> list[TensorSpec]:
        names = [tensor.name for tensor in tensors]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tensor names must be unique; repeated: {', '.join(duplicates)}")
        return tensors

    @model_validator(mode="after")
    def _fetch_settings_need_a_fetched_uri(self) -> "ModelSpec":
        if not self.is_fetched and (self.storage is not None or self.sha256 is not None):
            raise ValueError("model.storage and model.sha256 apply to s3:// and https:// URIs only")
        if self.sha256 is not None and self.uri.startswith("s3://") and self.is_prefix:
            raise ValueError("model.sha256 checks one file: an s3:// prefix (ending in /) has many")
        return self

    @property
    def is_fetched(self) -> bool:
        """True when an init container downloads the model (s3://, https://)."""
        return self.uri.startswith(REMOTE_SCHEMES)

    @property
    def is_prefix(self) -> bool:
        """True for a directory-shaped model: an s3:// URI ending in / (or naming a bucket)."""
        return self.uri.endswith("/") or self.uri.count("/") == 2

    @property
    def pvc_claim(self) -> str | None:
        """The claim name of a `pvc://` URI, else None."""
        if not self.uri.startswith("pvc://"):
            return None
        return self.uri.removeprefix("pvc://").split("/", 1)[0]

    def path_in_container(self, mount_root: str) -> str:
        """The model file's path inside the runtime container."""
        if self.uri.startswith("pvc://"):
            return f"{mount_root}/{self.uri.removeprefix('pvc://')}"
        if self.is_fetched:
            if self.is_prefix:
                return f"{FETCH_ROOT}/model"
            name = PurePosixPath(urlsplit(self.uri).path).name
            return f"{FETCH_ROOT}/model/{name}"
        return self.uri.removeprefix("file://")
