"""The TorchServe side of a team's own network: one handler for every packaged program (handlers/network_model.py).

What a worker loads (:class:`NetworkServingEngine`): the archive's ``model.pt2`` and optional ``signature.yaml``
(handlers/network/program.py), optional ``handler.py`` hooks (handlers/network/hooks.py), and what computes the
program (handlers/network/backends.load_served): ``handler.backend`` / ``handler.precision`` ``auto`` serve the best
candidate packaging recorded in ``backends/manifest.json`` that loads and passes the gate again here, else eager fp32
with the reason; an explicit value (``eager``, ``aot``, ``openvino``, ``jit``; ``fp32``, ``bf16``, ``fp16``) serves
that one, or eager fp32 with the reason where it cannot. Describe shows the choice, why, and each candidate's gate
values and speed (``backends``).

What it answers:

- ``POST /v2/models/<name>/infer``: the Open Inference Protocol v2, JSON or Triton's binary extension (tritonclient's
  default); TorchServe hands it over like a prediction, without the ``url_path`` header a ``/predictions`` request
  carries, which is how it is told apart. Answers and refusals (``{"error": "..."}``) in that protocol; a binary
  answer sets ``Inference-Header-Content-Length``.
- ``POST /predictions/<name>``: the native JSON form (an OIP body or a binary one is answered in OIP here too), or,
  when the archive has ``handler.py``, whatever its ``preprocess`` reads and its ``postprocess`` writes.
- ``/predictions/<name>/<version>/metadata``: the protocol's model metadata (each input's and output's name, datatype
  and shape, -1 where dynamic). TorchServe answers ``GET /v2/models/<name>`` itself, with 404, so the metadata lives
  here and in the management API's ``GET /models/<name>?customized=true``.

Every request is checked, refused or computed on its own (handlers/network/engine.py): a bad tensor or a failing hook
costs its own request a 4xx (or 500), never its neighbours in the batch, and the worker keeps serving.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.core import runtime
from handlers.core.answer_size import answer_too_large
from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, Option
from handlers.core.engine import BackendChoice, Engine, EngineSettings, Loaded
from handlers.core.errors import OIP, RequestError, ServerError, error_body, shaped
from handlers.core.http import RequestView, to_json
from handlers.network import backends, binary, oip
from handlers.network.engine import NETWORK_OPTIONS, NetworkEngine, lowest
from handlers.network.hooks import HookRequest, Hooks, load_hooks
from handlers.network.inputs import WireTensor, check_request, native_tensor
from handlers.network.program import LoadedProgram, ProgramModule, load_program
from handlers.network.signature import Signature, TensorSpec

logger = logging.getLogger(__name__)

METADATA_ROUTE = "metadata"
# A pass shorter than this runs on one thread where handler.threads is 0 (NetworkServingEngine.fit_threads).
SHORT_PASS_MS = 2.0
TYPICAL_PASS_ROWS = 64
OCTET_STREAM = "application/octet-stream"
NETWORK_HANDLER_OPTIONS: dict[str, Option] = {
    **COMMON_OPTIONS,
    "precision": Option(
        str,
        "auto",
        backends.PRECISIONS,
        help="auto = the recorded winner's; fp32 = the dtypes the program was exported with; bf16 (native bf16 CPUs) "
        "and fp16 (CUDA) cast float inputs, weights and outputs",
    ),
    "backend": Option(
        str,
        "auto",
        backends.CHOICES,
        help="what runs the program: auto = the best candidate in backends/manifest.json that passes the gate here "
        "(else eager); eager = the exported program as saved; aot, openvino = the packaged artifact; jit = "
        "torch.compile at load",
    ),
    **NETWORK_OPTIONS,
}


@dataclass
class LoadedNetwork(Loaded):
    signature: Signature
    hooks: Hooks
    program: LoadedProgram


@dataclass
class NetworkPayload:
    """One accepted request: how it asked (``oip``, ``native`` or ``hooks``) and its input tensors."""

    dialect: str
    wires: Mapping[str, WireTensor]
    request: oip.InferRequest | None = None  # oip and native
    hook_request: HookRequest | None = None  # hooks


@dataclass
class NetworkBatch:
    requests: list[Mapping[str, WireTensor]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(rows_of(wires) for wires in self.requests)


@dataclass(frozen=True)
class Encoded:
    """One request's answer as it goes out."""

    body: bytes
    headers: Mapping[str, str]
    content_type: str


class NetworkServingEngine(Engine):
    def __init__(self, settings: EngineSettings, options: dict[str, Option]) -> None:
        super().__init__(settings, options)

    def family_name(self) -> str:
        return "network"

    def load_model(self, model_dir: str) -> LoadedNetwork:
        program = load_program(model_dir)
        self.signature = program.signature
        return LoadedNetwork(
            model=ProgramModule(program), signature=program.signature, hooks=load_hooks(model_dir), program=program
        )

    def select_backend(self, fp32_model: torch.nn.Module, loaded: Any, reference: Any) -> BackendChoice:
        """The requested backend and precision through the network's own walk and gate (backends.load_served):
        every output compared with eager, fp32 within 1e-5; what is passed over is kept with its reason."""
        signature = loaded.signature
        rows = lowest(self.config["max_rows_per_pass"], signature.limits.max_rows_per_pass, signature.rows.high)
        with self.load_phases.phase("backend_load"):
            served = backends.load_served(
                self.model_dir,
                loaded.program.program,
                signature,
                self.threads,
                self.device,
                max_rows=max(rows, signature.rows.low, 1),
                min_cosine=self.config["min_cosine"],
                backend=self.config["backend"],
                precision=self.config["precision"],
            )
        self.served = served
        fallbacks = [fallback(reason) for reason in served.passed_over]
        similarity = float(served.gate.get("gate_min_cosine", 1.0))
        return BackendChoice(served.program, served.backend, served.precision, similarity, served.why, fallbacks)

    def start(self) -> None:
        super().start()
        self.threads_why = self.fit_threads()

    def fit_threads(self) -> str:
        """With ``handler.threads: 0`` (cores / workers), a program whose pass is short computes on one thread.

        A parallel region waits for its slowest thread; while the frontend, the clients and the other workers share
        the cores, one of its threads is often descheduled for a scheduler slice (milliseconds), which a pass that
        one thread computes in a fraction of a millisecond cannot afford: on the ranking network two threads served
        a fifth of what one served (docs/your-model.md). The pass timed is a full one (TYPICAL_PASS_ROWS rows, or
        the most a pass takes), on one thread; SHORT_PASS_MS or more keeps every thread."""
        if self.config["threads"] or self.threads == 1:
            return "set" if self.config["threads"] else "one core per worker"
        threads = self.threads
        runtime.set_threads(1, 1)
        batch = reference_tensors(self.signature)
        with torch.inference_mode():
            pass_ms = timed_pass_ms(lambda: self.forward(self.model, batch))
            rows = min(
                TYPICAL_PASS_ROWS, self.config["max_rows_per_pass"], self.signature.rows.high or TYPICAL_PASS_ROWS
            )
            if pass_ms < SHORT_PASS_MS and rows > batch[0].shape[0]:
                full = [tensor[:1].expand(rows, *tensor.shape[1:]).contiguous() for tensor in batch]
                pass_ms = timed_pass_ms(lambda: self.forward(self.model, full))
            else:
                rows = batch[0].shape[0]
        if pass_ms >= SHORT_PASS_MS:
            self.threads = runtime.set_threads(threads, 1)
            return f"a pass of {rows} rows takes {pass_ms:.2f} ms on one thread"
        why = (
            f"a pass of {rows} rows takes {pass_ms:.3f} ms on one thread, under {SHORT_PASS_MS:g} ms: one thread, "
            "so that a descheduled thread never holds a pass back"
        )
        self.threads = 1
        logger.info("threads=1: %s", why)
        return why

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "threads_why": self.threads_why, "backends": self.served.describe()}

    def reference_batch(self, loaded: LoadedNetwork) -> list[torch.Tensor]:
        return reference_tensors(loaded.signature)

    def warmup_batches(self, loaded: LoadedNetwork) -> list[list[torch.Tensor]]:
        return [reference_tensors(loaded.signature)]

    def forward(self, model: Any, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """Every output of one pass, flattened per row side by side (the warm-up's pass)."""
        outputs = self.signature.call(model, batch)
        return torch.cat([tensor.reshape(tensor.shape[0], -1).double() for tensor in outputs.values()], dim=1)


class NetworkHandler(ServingHandler):
    options = NETWORK_HANDLER_OPTIONS
    routes = ("", METADATA_ROUTE)
    loaded: LoadedNetwork

    def create_engine(self, settings: EngineSettings) -> Engine:
        return NetworkServingEngine(settings, self.options)

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.signature = self.loaded.signature
        self.hooks = self.loaded.hooks
        limits = {key: self.config[key] for key in NETWORK_OPTIONS}
        # The request side computes with what the backend walk chose (self.model), checking the example at load.
        self.network = NetworkEngine(self.model, self.signature, limits)

    def describe(self) -> dict[str, Any]:
        hooks = [name for name in ("preprocess", "postprocess") if getattr(self.hooks, name) is not None]
        return {
            **super().describe(),
            "metadata": self.metadata(),
            "hooks": hooks,
            "max_rows_per_request": self.network.max_rows_per_request,
            "max_rows_per_pass": self.network.max_rows_per_pass,
        }

    def metadata(self) -> dict[str, Any]:
        """The protocol's metadata, with what computes the program in its ``parameters``: the backend, precision and
        why, and each packaged candidate's gate values and speed (the customized describe's ``backends`` in full)."""
        assert isinstance(self.engine, NetworkServingEngine)
        served = self.engine.served.describe()
        computed = {key: served[key] for key in ("backend", "precision", "why", "passed_over", "candidates")}
        return {**oip.metadata(self.signature, self.model_name, [self.model_version]), "parameters": computed}

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body: Any, request: RequestView) -> NetworkPayload | Encoded:
        if request.url_path == METADATA_ROUTE:
            return Encoded(to_json(self.metadata()).encode("utf-8"), {}, "application/json")
        header = request.header(binary.HEADER)
        # /v2/models/<name>/infer comes without the url_path header every /predictions request carries.
        protocol_path = request.header("url_path") is None and not request.over_grpc
        if protocol_path or header is not None:
            try:
                parsed = oip.parse_request(body, header, self.signature)
            except RequestError as error:
                raise shaped(error, OIP) from None
            return NetworkPayload(parsed.dialect, parsed.inputs, request=parsed)
        if self.hooks.preprocess is not None:
            hook_request = HookRequest(body, request.header, request.content_type)
            return NetworkPayload("hooks", self.hooks.inputs(hook_request), hook_request=hook_request)
        parsed = oip.parse_request(body, None, self.signature)
        if parsed.dialect == "native" and self.hooks.postprocess is not None:
            hook_request = HookRequest(body, request.header, request.content_type)
            return NetworkPayload("hooks", parsed.inputs, hook_request=hook_request)
        return NetworkPayload(parsed.dialect, parsed.inputs, request=parsed)

    # ----------------------------------------------------------------------------------------------- per batch
    def preprocess(self, payloads: list[Any]) -> NetworkBatch:
        return NetworkBatch([p.wires for p in payloads if isinstance(p, NetworkPayload)])

    def inference(self, batch: NetworkBatch, scope: BatchScope) -> list[Any]:
        return self.network.infer(batch.requests)

    def postprocess(self, outputs: list[Any], payloads: list[Any]) -> list[Any]:
        answers = iter(outputs)
        return [
            payload if isinstance(payload, Encoded) else self.encode(payload, next(answers)) for payload in payloads
        ]

    def encode(self, payload: NetworkPayload, result: Any) -> Encoded | RequestError:
        if isinstance(result, RequestError):
            return result
        try:
            if payload.request is not None:
                body, headers = oip.encode_answer(
                    payload.request, result, self.signature, self.model_name, self.model_version
                )
                content_type = OCTET_STREAM if headers else "application/json"
                return Encoded(body, headers, content_type)
            assert payload.hook_request is not None
            if self.hooks.postprocess is None:
                request = oip.InferRequest(
                    "native", {}, tuple(oip.RequestedOutput(s.name) for s in self.signature.outputs)
                )
                body, headers = oip.encode_answer(request, result, self.signature)
                return Encoded(body, headers, "application/json")
            value = self.hooks.answer(result, payload.hook_request)
            try:
                text = to_json(value)
            except (TypeError, ValueError) as error:
                return ServerError(f"handler.py postprocess returned what JSON cannot carry: {error}"[:300])
            return Encoded(text.encode("utf-8"), {}, "application/json")
        except RequestError as error:
            return error

    # ----------------------------------------------------------------------------------------------- answers
    def answer(self, scope: BatchScope, idx: int, payload: Any, result: Any) -> Any:
        if isinstance(result, Encoded):
            if len(result.body) > self.max_answer_bytes:
                result = answer_too_large(len(result.body), self.max_answer_bytes, None, estimated=False)
            else:
                for key, value in result.headers.items():
                    setter = getattr(scope.context, "set_response_header", None)
                    if setter is not None:
                        setter(idx, key, value)
                content_setter = getattr(scope.context, "set_response_content_type", None)
                if content_setter is not None:
                    content_setter(idx, result.content_type)
                return result.body
        return super().answer(scope, idx, payload, result)

    def error_value(self, payload: Any, error: RequestError) -> dict[str, Any]:
        if isinstance(payload, NetworkPayload) and payload.dialect == "oip":
            return error_body(error, OIP)
        return error.to_body()


def timed_pass_ms(run: Callable[[], Any], repeats: int = 5) -> float:
    """The median of ``repeats`` timed calls of ``run`` (after one untimed), in ms."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def fallback(reason: str) -> dict[str, str]:
    """A passed-over candidate (``backend/precision: why``) as the engine's describe lists fallbacks."""
    where, _, why = reason.partition(": ")
    backend, _, precision = where.partition("/")
    return {"backend": backend, "precision": precision, "reason": why}


def rows_of(wires: Mapping[str, WireTensor]) -> int:
    first = next(iter(wires.values()), None)
    if first is None or not first.shape:
        return 1
    return 1 if first.one_row and len(first.shape) == 1 else first.shape[0]


def reference_tensors(signature: Signature) -> list[torch.Tensor]:
    """Fixed inputs the program takes: the signature file's example when it has one, else seeded values of each
    input's dtype and a size its dimensions admit (two rows, where the program takes two)."""
    if signature.example is not None:
        wires = {name: native_tensor(name, data) for name, data in signature.example.items()}
        return list(check_request(wires, signature, 2**31).tensors)
    generator = torch.Generator().manual_seed(1234)
    sizes: dict[str, int] = {}
    return [reference_tensor(spec, generator, sizes) for spec in signature.inputs]


def reference_tensor(spec: TensorSpec, generator: torch.Generator, sizes: dict[str, int]) -> torch.Tensor:
    shape = []
    for dim in spec.dims:
        if dim.size is not None:
            shape.append(dim.size)
            continue
        wanted = max(dim.low, 2)
        size = sizes.setdefault(dim.symbol or "", wanted if dim.high is None else min(wanted, dim.high))
        shape.append(size)
    if spec.dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(spec.dtype)
    if spec.dtype == torch.bool:
        return torch.zeros(shape, dtype=torch.bool)
    high = spec.value_range.high if spec.value_range is not None else 1
    low = spec.value_range.low if spec.value_range is not None else 0
    return torch.randint(low, high + 1, shape, generator=generator).to(spec.dtype)
