"""The one data plane behind both protocols: health, metadata, validation, batching, metrics.

REST and gRPC adapters decode the wire into an ``InferRequest``, call ``DataPlane.infer`` and
encode the ``InferResponse``; everything a request must satisfy is checked here, once, and
every failure is an ``InferError`` whose kind the adapters map through ``errors``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kiln_runtime import batch_policy, errors
from kiln_runtime.batcher import DynamicBatcher
from kiln_runtime.config import RuntimeConfig, TensorSpec
from kiln_runtime.datatypes import numpy_carrier
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.decoding import DecodingProcess
from kiln_runtime.protocol.types import InferRequest, InferResponse, Tensor
from kiln_runtime.response_cache import (
    CacheCollector,
    CacheStats,
    Remote,
    ResponseCache,
    lookup_histogram,
)
from kiln_runtime.tracetimes import BatchTimes, RequestTimes, Tracer

log = logging.getLogger(__name__)

Arrays = list[npt.NDArray[Any]]
T = TypeVar("T")


class Model(Protocol):
    """What the data plane needs of a model (``model.ModelRunner`` in production)."""

    def forward(self, inputs: Arrays) -> Arrays: ...

    def warm_up(self, batch_sizes: Sequence[int], repeats: int = 2) -> float: ...

    @property
    def computes_on_cpu(self) -> bool: ...


class DataPlane:
    def __init__(
        self,
        config: RuntimeConfig,
        metrics: RuntimeMetrics,
        executor: Executor | None,
        *,
        compute_threads: int | None = None,
        cpus: int | None = None,
    ) -> None:
        """``compute_threads``: the threads the model computes with (torch's); ``cpus``: those
        the process may run on; either unknown (None): the short inline limit."""
        self.config = config
        self.metrics = metrics
        self._model: Model | None = None
        self._executor = executor
        self._compute_threads = compute_threads
        self._cpus = cpus
        # Large bodies are parsed in a process of their own, never in the model's thread (it
        # must stay free for batches) nor on the event loop (it must stay free for every other
        # client): protocol/decoding.py says why not in a thread.
        self.decoding = DecodingProcess()
        # A port that refuses new clients makes the runtime unready (server.py: ports.py)
        self.saturated: Callable[[], bool] = _never
        # the limits start-up derived from the container's (container.py), for the stats
        self.limits_report: dict[str, Any] = {}
        self._last_inference_ms = 0
        self._spec = config.model
        self._inputs = {spec.name: spec for spec in self._spec.inputs}
        self._outputs = {spec.name: spec for spec in self._spec.outputs}
        self._input_names = [spec.name for spec in self._spec.inputs]
        self._output_names = frozenset(self._outputs)
        self._batcher: DynamicBatcher[Arrays, Arrays] = DynamicBatcher(
            self._process,
            max_batch_rows=config.batching.max_batch_size,
            max_delay_seconds=config.batching.max_queue_delay_microseconds / 1e6,
            max_queue_size=config.batching.max_queue_size,
            executor=executor,
            observer=metrics,
        )
        self._warm = False
        self._draining = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._warmup_inflight = 0  # the warm-up gate's, not load (metrics.py)
        metrics.inflight.set_function(  # read at scrape, not per request
            lambda: self._inflight - self._warmup_inflight
        )
        self.warmup_seconds: float | None = None
        self.cache: ResponseCache | None = None  # spec.runtime.cache: answers kept (issue 46)
        # spec.runtime.tracing: None (off) unless `trace_with` is called (tracing.py)
        self.tracer: Tracer | None = None
        # the batches of sampled requests, by id of the request's arrays: _compute adds a key
        # before submitting, _process sets the batch's times, _compute pops it
        self._traced_batches: dict[int, BatchTimes | None] = {}
        if config.cache is not None:
            lookups = lookup_histogram(self._spec.name, metrics.registry)
            self.cache = ResponseCache(config, config.cache, CacheStats(), lookups)
            CacheCollector(self._spec.name, self.cache, metrics.registry)

    def trace_with(self, tracer: Tracer) -> None:
        """Trace sampled requests (``tracing.Tracing``)."""
        self.tracer = tracer

    def attach_remote(self, remote: Remote) -> None:
        """Share the cache's answers with the service's other replicas (``redis_cache``)."""
        assert self.cache is not None, "a shared tier needs spec.runtime.cache"
        self.cache.remote = remote

    # ---------------------------------------------------------------- lifecycle

    @property
    def live(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return self._warm and not self._draining and not self.saturated()

    @property
    def inflight(self) -> int:
        return self._inflight

    async def start(self, load: Callable[[], Model]) -> None:
        """Load the model and warm it up; ready turns true only when warm-up is done.

        ``load`` runs in the model's executor (it blocks); its errors propagate.
        """
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(self._executor, load)
        sizes = self.config.warmup_batch_sizes()
        seconds = await loop.run_in_executor(self._executor, model.warm_up, sizes)
        self._model = model
        limit = batch_policy.inline_limit_seconds(
            computes_on_cpu=model.computes_on_cpu,
            compute_threads=self._compute_threads,
            cpus=self._cpus,
        )
        timings: dict[int, float] = {}
        for size in sorted(sizes):  # up to the first size over the limit: larger ones are too
            timings[size] = await loop.run_in_executor(self._executor, self._time_batch, size)
            if timings[size] >= limit:
                break
        max_rows = self.config.batching.max_batch_size
        overhead = batch_policy.batch_overhead(timings)
        self._batcher.set_batch_overhead(overhead)
        inline_rows = batch_policy.inline_rows(timings, limit, max_rows)
        if inline_rows:
            self._batcher.run_inline(inline_rows)
        if inline_rows >= max_rows:
            where = "every batch computes inline on the event loop"
        elif inline_rows:
            where = f"batches up to {inline_rows} rows compute inline, larger ones in the thread"
        else:
            where = "every batch computes in the model thread"
        log.info(
            "batches of %s rows take %s ms (%.3f ms of it per batch, whatever its rows): %s "
            "(the inline limit: %.1f ms)",
            list(timings), [round(t * 1e3, 3) for t in timings.values()], overhead * 1e3, where,
            limit * 1e3,
        )  # fmt: skip
        self._batcher.start()
        self.warmup_seconds = seconds
        self.metrics.warmup_seconds.set(seconds)
        self._warm = True
        self.metrics.ready.set(1)
        log.info("model %s warmed up batch sizes %s in %.3f s", self._spec.name, sizes, seconds)

    def _time_batch(self, rows: int) -> float:
        assert self._model is not None
        batch = [
            np.zeros(
                (rows, *(1 if d == -1 else d for d in spec.shape)), numpy_carrier(spec.datatype)
            )
            for spec in self._spec.inputs
        ]
        timings = []
        for _ in range(3):  # the fastest of three: a busy host should not hide a fast model
            started = time.perf_counter()
            self._model.forward(batch)
            timings.append(time.perf_counter() - started)
        return min(timings)

    def begin_drain(self) -> None:
        """Report not ready at once; requests already accepted (and new ones) still complete."""
        self._draining = True
        self.metrics.ready.set(0)

    async def wait_idle(self, deadline_seconds: float) -> bool:
        """Wait until no request is in flight; False if ``deadline_seconds`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), deadline_seconds)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        await self._batcher.stop()
        self.decoding.close()
        if self.cache is not None:
            await self.cache.close()

    # ---------------------------------------------------------------- accounting

    def request_started(self) -> None:
        self._inflight += 1
        if self._inflight == 1:
            self._idle.clear()

    def request_finished(
        self, protocol: str, code: str, seconds: float, warmup: bool = False
    ) -> None:
        """Count a request that ``request_started`` counted in flight; ``warmup``: the warm-up
        gate's, served before any load (``is_warmup``), counted apart from the load."""
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()
        if warmup:
            self._warmup_inflight -= 1
            self.metrics.warmup_request_duration[(protocol, code)].observe(seconds)
        else:
            self.metrics.request_duration[(protocol, code)].observe(seconds)
        if code == errors.OK_METRIC_CODE:
            self._last_inference_ms = int(time.time() * 1000)

    def refused(self, protocol: str, code: str, seconds: float = 0.0) -> None:
        """Count an infer request a transport refused before ``handle`` saw it (too large, too
        slow to arrive, malformed framing, buffers full): it ends in one code like any other,
        so the autoscaler and dashboards see it. It was never in flight; ``seconds`` is what
        the transport spent on it (0 when it was refused before any decoding)."""
        self.metrics.request_duration[(protocol, code)].observe(seconds)

    def is_warmup(self, request: InferRequest) -> bool:
        """Whether a decoded request is the warm-up gate's: marked, and no request without the
        mark has come before it. The first unmarked one starts the load metrics for good, and
        from then on the mark counts for nothing (metrics.py says why that is safe)."""
        metrics = self.metrics
        if request.warmup and not metrics.load_seen:
            metrics.warming = True
            self._warmup_inflight += 1
            return True
        metrics.load_seen, metrics.warming = True, False
        return False

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.metrics.stage[stage].observe(seconds)

    async def handle(
        self,
        protocol: str,
        decode: Callable[[], InferRequest],
        encode: Callable[[InferResponse], T],
        *,
        decode_off_loop: Callable[[], Awaitable[InferRequest]] | None = None,
        traceparent: str | None = None,
    ) -> T:
        """One infer request as both protocols serve it: decode, infer, encode, each stage
        timed, the request counted under exactly one outcome code.

        An ``InferError`` is counted under its code and raised again for the adapter to answer
        in its protocol's terms. Any other exception is a bug: it is logged, counted
        ``internal`` and raised as an INTERNAL ``InferError``, so both protocols answer it
        alike. An ``InferError`` raised while encoding is counted ``internal`` whatever its
        kind: the request was valid and computed, and the runtime could not express the answer
        (an output of NaN asked for as JSON), which is no fault of the client. Cancellation
        (the client went away, or the adapter gave up at the call's deadline) is counted
        ``deadline`` if the request's deadline had passed, else ``cancelled``, and propagates.
        ``decode_off_loop``, when given, decodes instead of ``decode`` without holding the event
        loop (large bodies: parsing must not stall the health probes and other clients).
        ``traceparent``: the caller's W3C trace context, when tracing is on (``tracing``).
        """
        started = time.perf_counter()
        code = errors.OK_METRIC_CODE
        deadline: float | None = None
        encoding = False
        warmup = False
        times: RequestTimes | None = None
        tracer = self.tracer
        if tracer is not None and tracer.sampled(traceparent):
            times = RequestTimes("http" if protocol == "http" else "grpc", started)
        self.request_started()
        try:
            if decode_off_loop is not None:
                request = await decode_off_loop()
            else:
                request = decode()
            warmup = self.is_warmup(request)
            if request.timeout_seconds is not None:
                deadline = started + request.timeout_seconds
            decoded = time.perf_counter()
            self.observe_stage("decode", decoded - started)
            if times is None:
                response = await self.infer(request)
            else:
                times.decoded = decoded
                response = await self.infer(request, times)
            encode_started = time.perf_counter()
            if times is not None:
                times.encode_started = encode_started
            encoding = True
            encoded = encode(response)
            self.observe_stage("encode", time.perf_counter() - encode_started)
            return encoded
        except errors.InferError as error:
            code = errors.INTERNAL_METRIC_CODE if encoding else error.kind.mapping.metric_code
            raise
        except asyncio.CancelledError:
            late = deadline is not None and time.perf_counter() >= deadline
            code = "deadline" if late else errors.CANCELLED_METRIC_CODE
            raise
        except Exception as bug:  # one name per type: mypyc (setup.py)
            code = errors.INTERNAL_METRIC_CODE
            log.exception("internal error answering a %s infer request", protocol)
            raise errors.InferError(
                errors.ErrorKind.INTERNAL, "internal error; see server log"
            ) from bug
        finally:
            ended = time.perf_counter()
            self.request_finished(protocol, code, ended - started, warmup)
            if times is not None and tracer is not None:
                times.ended, times.code = ended, code
                self._trace(tracer, times, traceparent)

    def _trace(self, tracer: Tracer, times: RequestTimes, traceparent: str | None) -> None:
        try:
            tracer.record(times, traceparent)
        except Exception:  # a trace is never worth a request
            log.exception("recording a trace failed")

    # ---------------------------------------------------------------- model queries

    def check_model(self, name: str, version: str = "") -> None:
        if name != self._spec.name or version not in ("", self._spec.version):
            known = f"{self._spec.name} (version {self._spec.version})"
            wanted = errors.clip(name) + (f" version {errors.clip(version)}" if version else "")
            raise errors.not_found(f"unknown model '{wanted}'; this runtime serves {known}")

    def model_ready(self, name: str, version: str = "") -> bool:
        self.check_model(name, version)
        return self.ready

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self.check_model(name, version)

        def describe(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "datatype": s.datatype, "shape": [-1, *s.shape]} for s in specs
            ]

        return {
            "name": self._spec.name,
            "versions": [self._spec.version],
            "platform": _PLATFORMS[self._spec.format],
            "inputs": describe(self._spec.inputs),
            "outputs": describe(self._spec.outputs),
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """A Triton-style model configuration (what ``get_model_config`` returns)."""
        self.check_model(name, version)
        batching = self.config.batching

        def describe(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "data_type": f"TYPE_{s.datatype}", "dims": list(s.shape)}
                for s in specs
            ]

        return {
            "name": self._spec.name,
            "platform": _PLATFORMS[self._spec.format],
            "max_batch_size": batching.max_batch_size,
            "input": describe(self._spec.inputs),
            "output": describe(self._spec.outputs),
            "dynamic_batching": {
                "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
                "default_queue_policy": {"max_queue_size": batching.max_queue_size},
            },
        }

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension for this model, from the metrics the runtime keeps.

        The shape of one ``model_stats`` entry of ``/v2/models/{m}/stats`` (and of gRPC
        ``ModelStatistics``): durations in nanoseconds, ``inference_count`` in rows,
        ``execution_count`` in batches. ``success`` and ``fail`` count requests by their
        outcome code; ``queue`` and the compute stages are per request and per batch.
        """
        if name:
            self.check_model(name, version)
        m = self.metrics

        def duration(count: int, seconds: float) -> dict[str, int]:
            return {"count": count, "ns": int(seconds * 1e9)}

        def requests(ok: bool) -> dict[str, int]:
            series = [h for (_, code), h in m.request_duration.items() if (code == "ok") == ok]
            return duration(sum(h.count for h in series), sum(h.sum for h in series))

        def stage(name: str) -> dict[str, int]:
            return duration(m.stage[name].count, m.stage[name].sum)

        cache = self.cache.stats if self.cache is not None else CacheStats()

        return {
            "name": self._spec.name,
            "version": self._spec.version,
            "last_inference": self._last_inference_ms,
            "inference_count": int(m.batch_size.sum),
            "execution_count": m.batch_size.count,
            "inference_stats": {
                "success": requests(ok=True),
                "fail": requests(ok=False),
                "queue": duration(m.queue_wait_seconds.count, m.queue_wait_seconds.sum),
                "compute_input": stage("preprocess"),
                "compute_infer": stage("forward"),
                "compute_output": stage("postprocess"),
                "cache_hit": duration(cache.hits, cache.hit_seconds),
                "cache_miss": duration(cache.misses, cache.miss_seconds),
            },
            "batch_stats": [],
        }

    # ---------------------------------------------------------------- inference

    async def infer(
        self, request: InferRequest, times: RequestTimes | None = None
    ) -> InferResponse:
        self.check_model(request.model_name, request.model_version)
        if not self._warm or self._model is None:
            raise errors.InferError(
                errors.ErrorKind.UNAVAILABLE, f"model '{self._spec.name}' is not ready (warming up)"
            )
        arrays, rows = self._validate_inputs(request.inputs)
        wanted = self._validate_outputs(request)
        deadline = None
        if request.timeout_seconds is not None:
            deadline = time.monotonic() + request.timeout_seconds
        if self.cache is None:
            outputs = await self._compute(arrays, rows, wanted, deadline, times)
        else:  # a hit never reaches the batcher
            outputs = await self.cache.answer(
                request,
                arrays,
                lambda: self._compute(arrays, rows, wanted, deadline, times),
                deadline,
            )
        binary = {o.name: o.binary for o in request.outputs}
        return InferResponse(
            model_name=self._spec.name,
            model_version=self._spec.version,
            id=request.id,
            outputs=outputs,
            binary={t.name: binary.get(t.name, request.binary_output) for t in outputs},
        )

    async def _compute(
        self,
        arrays: Arrays,
        rows: int,
        wanted: frozenset[str],
        deadline: float | None,
        times: RequestTimes | None = None,
    ) -> list[Tensor]:
        """The requested outputs, computed in a batch (whose times a traced request keeps)."""
        key = tuple(array.shape[1:] for array in arrays)
        if times is None:
            results = await self._batcher.submit(arrays, rows=rows, key=key, deadline=deadline)
        else:
            traced = self._traced_batches
            if len(traced) > MAX_TRACED_WAITING:  # only entries a cancelled request left behind
                traced.clear()
            traced[id(arrays)] = None
            try:
                results = await self._batcher.submit(arrays, rows=rows, key=key, deadline=deadline)
            finally:
                times.batch = traced.pop(id(arrays), None)
        return [
            Tensor(spec.name, spec.datatype, array)
            for spec, array in zip(self._spec.outputs, results, strict=True)
            if spec.name in wanted
        ]

    def _validate_inputs(self, tensors: list[Tensor]) -> tuple[Arrays, int]:
        if [t.name for t in tensors] == self._input_names:
            ordered = tensors  # the usual case: every input once, in the declared order
        else:
            ordered = self._reorder_inputs(tensors)
        arrays = []
        rows: int | None = None
        for spec, tensor in zip(self._spec.inputs, ordered, strict=True):
            if tensor.datatype != spec.datatype:
                raise errors.invalid(
                    f"input '{spec.name}': datatype {tensor.datatype}, expected {spec.datatype}"
                )
            shape = tensor.data.shape
            if shape[1:] != spec.shape and (
                len(shape) != len(spec.shape) + 1
                or any(d not in (-1, s) for d, s in zip(spec.shape, shape[1:], strict=True))
            ):
                raise errors.invalid(
                    f"input '{spec.name}': shape {list(shape)}, expected {[-1, *spec.shape]} "
                    "(batch dimension first)"
                )
            if rows is None:
                rows = shape[0]
            elif shape[0] != rows:
                raise errors.invalid(
                    f"inputs disagree on the batch dimension ({rows} and {shape[0]})"
                )
            arrays.append(tensor.data)
        assert rows is not None  # the config declares at least one input
        if rows < 1 or rows > self.config.batching.max_batch_size:
            raise errors.invalid(
                f"batch dimension {rows} outside 1..{self.config.batching.max_batch_size}"
            )
        return arrays, rows

    def _reorder_inputs(self, tensors: list[Tensor]) -> list[Tensor]:
        """The inputs in the declared order, or an error naming the unknown and missing ones."""
        given = {t.name: t for t in tensors}
        if len(given) != len(tensors):
            raise errors.invalid("an input appears more than once")
        unknown = sorted(set(given) - set(self._inputs))
        missing = sorted(set(self._inputs) - set(given))
        if unknown or missing:
            raise errors.invalid(
                f"model '{self._spec.name}' expects inputs {list(self._inputs)}; "
                + (f"unknown: {unknown} " if unknown else "")
                + (f"missing: {missing}" if missing else "")
            )
        return [given[name] for name in self._input_names]

    def _validate_outputs(self, request: InferRequest) -> frozenset[str]:
        if not request.outputs:
            return self._output_names
        names = frozenset(o.name for o in request.outputs)
        unknown = sorted(names - self._output_names)
        if unknown:
            raise errors.invalid(
                f"unknown output(s) {unknown}; model '{self._spec.name}' has {list(self._outputs)}"
            )
        return names

    def _process(self, payloads: Sequence[Arrays]) -> list[Arrays]:
        """Run one batch (in the model thread): concatenate, forward, split per request."""
        t0 = time.perf_counter()
        if len(payloads) == 1:
            batch = payloads[0]
        else:
            batch = [
                np.concatenate([payload[i] for payload in payloads])
                for i in range(len(self._spec.inputs))
            ]
        t1 = time.perf_counter()
        assert self._model is not None  # the batcher starts after the model loaded
        outputs = self._model.forward(batch)
        t2 = time.perf_counter()
        total = batch[0].shape[0]
        if any(output.shape[0] != total for output in outputs):
            raise errors.InferError(
                errors.ErrorKind.INTERNAL,
                f"model returned {[o.shape[0] for o in outputs]} rows for a batch of {total}",
            )
        results: list[Arrays] = []
        start = 0
        for payload in payloads:
            stop = start + payload[0].shape[0]
            results.append([output[start:stop] for output in outputs])
            start = stop
        t3 = time.perf_counter()
        traced = self._traced_batches
        if traced:  # a sampled request waits for this batch, or another
            batch_times = BatchTimes(t0, t3, total, len(payloads))
            for payload in payloads:
                if id(payload) in traced:
                    traced[id(payload)] = batch_times
        stage = self.metrics.stage
        stage["preprocess"].observe(t1 - t0)
        stage["forward"].observe(t2 - t1)
        stage["postprocess"].observe(t3 - t2)
        return results


_PLATFORMS = {
    "torchscript": "pytorch_libtorch",
    "torch_export": "pytorch_export",
    "onnx": "onnxruntime_onnx",
}


MAX_TRACED_WAITING = 65536
"""More traced requests than this waiting at once is impossible (the queue is shorter): the
surplus is entries of cancelled requests whose batch finished after them."""


def _never() -> bool:
    return False
