"""Names vulture reports as unused that are used where vulture cannot see: by a framework.

Why it exists: `make lint` runs vulture over the operator, the runtime and the local cluster so
that dead code does not come back; this is its whitelist. Each entry is used by kopf, pydantic,
asyncio, httptools, a third-party object's setter, or a caller outside the scanned packages
(tests, e2e scripts). Dead code goes, it is never listed here.
"""


class _Used:
    """Any object: vulture only reads the attribute names below, nothing runs them."""

    def __getattr__(self, _name: str) -> None:
        return None


_ = _Used()

# kopf calls its handlers from the decorators' registry (operator/kiln_operator/handlers/).
_.operator_startup
_.operator_cleanup
_.inferenceservice_event
_.child_changed
_.autoscaler_startup
_.autoscaler_cleanup
_.warmup_gate_startup
_.warmup_gate_cleanup
_.pod_warmup_gate
_.platform_object_changed
_.admission_startup
_.inferenceservice_validate

# kopf reads the OperatorSettings the startup handler sets (handlers/inferenceservice.py).
_.level
_.reporting_component
_.event_name_prefix
_.server_timeout
_.client_timeout
_.request_timeout
_.lifetime

# pydantic runs these model validators (api/v1alpha1/).
_._replicas_only_with_fixed
_._min_not_above_max
_._cron_parses
_._time_zone_exists
_._names_unique
_._warmup_batches_fit
_._gpu_settings_need_a_gpu
_._optimization_fits_format_and_device
_._no_zero_dimension
_._unique_names
_._fetch_settings_need_a_fetched_uri
_._queue_holds_a_batch
_._process_holds_a_connection
_._only_a_deterministic_model_is_cached
_._entry_fits
_._ascending
_._requests_cover_concurrency
_._enough_days
_._one_service_account
_._kiln_labels_are_kilns
_._kiln_annotations_are_kilns
_._kiln_env_is_kilns
_._complete_when_enabled
_._no_dot_segments
_._images_without_dot_segments
_._urls_without_dot_segments

# pydantic fields: part of the CRD schema and written to the API server by model_dump
# (api/v1alpha1/), or persisted in the autoscaler's state (autoscaling/state.py); the state's
# status field is written by its own apply (k8s/autoscaler.py, as `STATE_FIELD`).
_.api_version
_.autoscaler_state
_.updated_replicas
_.available_replicas
_.last_transition_time
_.floor_replicas
_.active_window
_.last_scale_time
_.last_scale_direction
_.next_rise_requests_per_second
_.canary_requests

# Read by the unit tests, which pin them: the warm-up verdict's p50 beside its p99
# (warmup/plan.py) and the instant a pre-warm window starts raising replicas
# (autoscaling/schedule.py).
_.p50_ms
_.raise_at

# Attributes set on third-party objects, which read them: the Kubernetes client's
# configuration and session (k8s/client.py), onnxruntime's session options (model.py),
# protobuf messages (protocol/reflection.py) and kopf's settings (handlers/inferenceservice.py).
_.connection_pool_maxsize
_.diffbase_storage
_._trust_env
_.user_agent
_.graph_optimization_level
_.oneof_index
_.error_code
_.error_message

# Protocol methods and their arguments: `async with` (k8s/client.py), asyncio.Protocol
# (protocol/http2/connection.py, protocol/httpserver.py), httptools' parser callbacks
# (httpserver.py) and kopf's DiffBaseStorage (handlers/inferenceservice.py).
_.extra_fields
_.essence
_.exc_type
_.exc
_.traceback
_.connection_made
_.connection_lost
_.eof_received
_.pause_writing
_.resume_writing
_.on_message_begin
_.on_url
_.on_header
_.on_headers_complete
_.on_body
_.on_message_complete

# RFC 9113's table of setting identifiers, kept whole beside the five the server sends or reads
# (protocol/http2/wire.py).
_.SETTINGS_HEADER_TABLE_SIZE

# The load helpers e2e/demo/load.py and the integration tests call (e2e/kiln_localcluster/load.py).
_.cluster_ip
_.ready_endpoints
_.run_load

# The Prometheus that discovers Kiln's pods through the API server, which the integration tests'
# `start_prometheus` fixture starts (e2e/kiln_localcluster/discovery.py).
_.start_discovering_prometheus

# What the test session's cluster asks before starting it: whether it reuses a running one, so
# that it stops only a cluster it started (tests/sessioncluster.py).
_.reusable

# The local Prometheus' URL as a pod reaches it, for the chart installed by the e2e tier
# (tests/e2e/test_in_cluster.py).
_.pod_prometheus_url

# numpy's flag, set to make the response cache's stored answers read-only (response_cache.py).
_.writeable
