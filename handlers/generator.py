"""Handler for ``generator``: text generation with a Hugging Face causal LM, KV cache, optional streaming.

Request ``{"prompt": "...", "max_new_tokens": n, "temperature": t, "top_k": k, "seed": s, "stream": bool}``
(validated by :mod:`handlers.generation.native`) -> ``{"text", "finish_reason", "prompt_tokens",
"completion_tokens", "model": {"name", "weights"}}`` (+ ``"seed"`` when sampling). With ``"stream": true`` the answer
is newline-delimited JSON sent as the tokens are produced: ``{"text": piece, "done": false}`` lines, then one
``{"text": rest, "done": true, ...counts...}`` line; the pieces concatenate to the non-streamed text.

The same model speaks OpenAI's completions and chat completions at ``/predictions/<model>/<version>/v1/completions``
and ``.../v1/chat/completions`` (:mod:`handlers.generation.openai_api`, chat templates in
:mod:`handlers.generation.chat`): those bodies map onto the same generation requests and limits, and only the framing
of answers and streams differs (server-sent events instead of NDJSON; :mod:`handlers.generation.answers`). Each
request's path is looked up once in the route table (:mod:`handlers.generation.routes`), which gives its parser,
answer writer and error shape.

This module is the TorchServe adapter: it reads TorchServe's batches and context, and answers through them; the
generation itself is :class:`handlers.generation.loop.GenerationLoop`. Requests are scheduled per step by default
(``continuousBatching: true`` in model-config.yaml, TorchServe's own iteration-level batching): TorchServe hands the
worker, at every step, the requests it serves, up to ``batchSize``. A request that arrives while others decode is
prefilled in the next pass and joins the running batch; one that reaches its end (length, end-of-text, a stop
sequence, an error) leaves at once and its answer is sent then; one whose client has gone is no longer handed over and
its rows are freed (:mod:`handlers.generation.scheduler`, :mod:`handlers.generation.running`). Each step answers
TorchServe with the new text of every open stream; a plain request is left out of the answer until it is complete, so
its status is that of its outcome. Prompts reuse the keys and values of a prefix computed before
(:mod:`handlers.generation.prefix_cache`). Without ``continuousBatching`` the handler decodes each batch TorchServe
collected to its end (:func:`handlers.generation.running.generate`), sending stream pieces as intermediate responses
(:mod:`handlers.generation.streaming`). Either way each request samples with its own seeded generator, so its tokens
do not depend on what it shares steps with. ``handler.precision`` bf16 (or auto, on a CPU with native bf16) decodes
in bf16 with an fp32 output layer, served only if greedy decoding of fixed prompts gives fp32's tokens
(:mod:`handlers.generation.precision`). The model folder: :mod:`handlers.generation.model`; its token limits
(``auto`` from the model's positions): :mod:`handlers.generation.limits`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import torch

from handlers.core import runtime
from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.engine import Engine, EngineSettings
from handlers.core.errors import OPENAI, RequestError
from handlers.core.http import RequestView, to_json
from handlers.core.metrics import HandlerMetrics
from handlers.core.routes import Route
from handlers.generation import chat, compiled, decode_attention, kv_cache, paged_openvino, structured
from handlers.generation.answers import Outcome
from handlers.generation.limits import AUTO, AutoOrInt
from handlers.generation.loop import GenerationLoop
from handlers.generation.model import LoadedGenerator, load_generator
from handlers.generation.precision import GeneratorEngine
from handlers.generation.prefix_cache import PREFIX_CACHE_OPTION, PrefixCache, open_prefix_cache
from handlers.generation.requests import (
    AcceptedGeneration,
    FieldError,
    Generation,
    GenerationBatch,
    GenerationRequest,
    Served,
)
from handlers.generation.routes import DESCRIBE, GENERATION_ROUTES, DescribeRequest
from handlers.generation.scheduler import Active
from handlers.generation.semantic_cache.cache import SemanticCache, open_semantic_cache
from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION
from handlers.generation.streaming import STEP_PIECES, frontend_takes_step_pieces, send_chunks

logger = logging.getLogger(__name__)

# The gRPC input a StreamPredictions caller adds beside "body" to get a streamed answer piece by piece.
GRPC_STREAM_INPUT = "stream_pieces"

ModelInputs = dict[str, torch.Tensor]  # input_ids and attention_mask


class GeneratorHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "backend": Option(str, "eager", ("eager",), help="decoding runs eagerly (shapes change every step)"),
        "model_subdir": Option(str, "lm", help="the Hugging Face model folder inside the archive"),
        "info_file": Option(str, "model_info.json", help="JSON {name, weights} shown in answers (optional file)"),
        "max_prompt_tokens": AutoOrInt(
            int, AUTO, minimum=1, help="longest prompt accepted, in tokens; auto = min(256, the model's positions // 2)"
        ),
        "max_new_tokens": AutoOrInt(
            int,
            AUTO,
            minimum=1,
            help="largest max_new_tokens a request may ask for; auto = min(256, the model's positions // 2)",
        ),
        "default_max_new_tokens": Option(int, 32, minimum=1, help="max_new_tokens when a request gives none"),
        "max_temperature": Option(float, 5.0, minimum=0.0, help="largest temperature a request may ask for"),
        "max_batch_tokens": AutoOrInt(
            int,
            AUTO,
            minimum=1,
            help="per-step scheduling: keys and values the running batch may hold, in tokens (rows x the longest "
            "prompt + max_new_tokens); a request that does not fit waits; auto = batchSize x (max_prompt_tokens + "
            "max_new_tokens)",
        ),
        "prefill_chunk_tokens": Option(
            int,
            64,
            minimum=0,
            help="per-step scheduling: prompt tokens a joining request computes per step, in the running requests' "
            "decoding pass (chunked prefill: a long prompt does not stall the streams); 0 = whole prompts in a "
            "step of their own",
        ),
        "decode_call_ms": Option(
            int,
            0,
            minimum=0,
            help="per-step scheduling: while only running rows decode, more decoding steps run in the same TorchServe "
            "call until it would last longer than this (ms): the frontend's round trip is paid once for several "
            "tokens, and each step's text still goes out as it comes (on the project's patched frontend; on "
            "TorchServe as released the call's text goes out in one piece); a request that arrives meanwhile waits "
            "at most this long more to join, and one that ends or gets its first token is answered at once; 0 = one "
            "step a call",
        ),
        "compile_decode": compiled.CompileOption(
            str,
            "false",
            compiled.SETTINGS,
            help="torch.compile the decoding passes' MLPs: true = compile, kept only if greedy fp32 tokens equal "
            "eager's on a few prompts; auto = that and only if a step of 1 row and of batchSize rows is faster; "
            "false = eager (the default: it did not pay, docs/generation.md)",
        ),
        "decode_attention": Option(
            str,
            "auto",
            decode_attention.SETTINGS,
            help="a decoding step's attention: padded = over every column of the running batch (padding masked); "
            "per_row = each row over its own columns, kept only if greedy fp32 tokens equal padded's; auto = that "
            "and only if a step of batchSize rows, a long prompt among short ones, is faster (the default: it was, "
            "docs/generation.md)",
        ),
        "decode_step": Option(
            str,
            "auto",
            paged_openvino.SETTINGS,
            help="what runs the decoding passes: eager = the model in torch; openvino = the model in OpenVINO with "
            "paged attention (keys and values in a block pool, logits only where a token is chosen; the decoder "
            "exported at package time, else traced at load) at handler.precision (auto: bf16 where the CPU has it "
            "natively, its output layer compiled apart at fp32), then at fp32, each kept only if its greedy decoding "
            "of a few prompts passes the decoding gate against eager fp32's (the same tokens, log probabilities "
            "within 0.1), else eager (describe says why); auto (the default) = openvino without what the "
            "package-time build refused (decode/manifest.json: a failed gate, or slower than eager on a CPU of this "
            "kind)",
        ),
        "decode_weights": Option(
            str,
            "auto",
            paged_openvino.WEIGHT_SETTINGS,
            help="the paged step's weights (handler.decode_step openvino or auto): int8 = the decoder's matrices in "
            "int8 (one scale per output channel; the output layer stays fp32, computing in fp32) tried first, behind "
            "the same decoding gate; full = the model's own weights only; auto (the default) = int8 only where the "
            "package-time build gated it and ranked it (decode/manifest.json), fastest first",
        ),
        "max_n": Option(
            int,
            8,
            minimum=1,
            help="largest n (choices per request) a request may ask for; its n rows must also fit max_batch_tokens",
        ),
        "prefix_cache": PREFIX_CACHE_OPTION,
        "semantic_cache": SEMANTIC_CACHE_OPTION,
    }
    # The API surfaces, one row per dialect (handlers/generation/routes.py): '' = the native API at
    # /predictions/<model>; the others follow /predictions/<model>/<version>/. A new dialect is a module and a row.
    route_table: dict[str, Route] = GENERATION_ROUTES
    loaded: LoadedGenerator

    def __init__(self) -> None:
        super().__init__()
        self.stream_sink = send_chunks  # how intermediate chunks leave; unit tests record them instead

    @property
    def routes(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.route_table)

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        # TorchServe's continuousBatching hands the worker its requests at every step: decode one step per call.
        self.per_step = bool(yaml_config.get("continuousBatching", False))
        # Several decoding steps in one call (decode_call_ms) send each step's text as it comes where the frontend
        # reads pieces of a running call (the project's patched jar); else the call's text goes out with its answer.
        self.step_pieces = self.per_step and frontend_takes_step_pieces()
        self.prefix_cache: PrefixCache | None = open_prefix_cache(self.config["prefix_cache"], self.identity)
        unsupported = kv_cache.unsupported_layers(self.loaded.model)
        if unsupported and self.per_step:
            raise ConfigError(
                f"continuousBatching: true needs a full-attention model; this one's key/value cache has "
                f"{', '.join(unsupported)} layers: set continuousBatching: false in model-config.yaml"
            )
        if unsupported and self.prefix_cache is not None:
            logger.warning("prefix reuse is off: the model's cache has %s layers", ", ".join(unsupported))
            self.prefix_cache = None
        budget = self.batch_token_budget(self.loaded.limits)
        # The engine chose the decoding step in its walk (choose_decode_step, from the fp32 model). The eager step's
        # own options (compiled MLPs, per-row attention) apply only when the eager step serves.
        engine = self.engine
        assert isinstance(engine, GeneratorEngine)
        self.decode_step = engine.decode_step
        if self.decode_step.serving == "eager":
            self.compiled = compiled.compile_decode(
                self.loaded.model, self.config["compile_decode"], self.loaded.pad_token_id, self.max_batch_requests
            )
            self.decode_attention = decode_attention.select(
                self.loaded.model,
                self.config["decode_attention"],
                self.loaded.pad_token_id,
                self.max_batch_requests,
                self.loaded.limits.max_prompt_tokens,
            )
        else:
            unused = "not applied: the OpenVINO paged step decodes (handler.decode_step)"
            self.compiled = compiled.CompileOutcome(self.config["compile_decode"], False, unused)
            self.decode_attention = decode_attention.AttentionOutcome(self.config["decode_attention"], False, unused)
        model = {
            "name": self.model_name,
            "version": self.model_version,
            "identity": self.identity,
            "info": f"{self.loaded.info['name']}; {self.loaded.info['weights']}",
        }
        self.semantic: SemanticCache | None = open_semantic_cache(
            self.config["semantic_cache"],
            self.model_dir,
            model,
            self.loaded.limits.max_new_tokens,
            self.threads,
            context.system_properties.get("gpu_id"),
        )
        chunk_tokens = self.config["prefill_chunk_tokens"] if self.per_step else 0
        self.loop = GenerationLoop(
            self.loaded, budget, self.prefix_cache, self.semantic, chunk_tokens, self.decode_step.paged
        )
        # What every route's parser needs to know about the served model.
        self.served = Served(self.model_name, self.loaded.info, self.loaded.limits, self.loaded.tokenizer)
        structured.prepare_in_background(self.served)  # response_format's grammar vocabulary, off the first request

    def choose_decode_step(self, fp32_model: Any, loaded: LoadedGenerator, gate: Any) -> paged_openvino.BackendOutcome:
        """``handler.decode_step`` applied to the fp32 model (:func:`handlers.generation.paged_openvino.select`): the
        paged step with int8 weights (handler.decode_weights), at ``handler.precision`` (auto: bf16 where native),
        then at fp32, each behind ``gate``."""
        wanted = runtime.resolve_precision(self.config["precision"], self.device)
        precisions, ranked_only = paged_openvino.walk_order(wanted, self.config["decode_weights"])
        pool = self.paged_pool(self.batch_token_budget(loaded.limits), loaded.limits.max_n)
        setting = self.config["decode_step"]
        return paged_openvino.select(
            fp32_model, setting, self.threads, pool, precisions, gate, self.model_dir, ranked_only
        )

    def batch_token_budget(self, limits: Any) -> int:
        """handler.max_batch_tokens resolved: at least one request at its longest must fit."""
        longest = limits.max_prompt_tokens + limits.max_new_tokens
        budget = self.config["max_batch_tokens"]
        if budget == AUTO:
            return self.max_batch_requests * longest
        if budget < longest:
            raise ConfigError(
                f"handler.max_batch_tokens ({budget}) is below one request at its longest (max_prompt_tokens "
                f"{limits.max_prompt_tokens} + max_new_tokens {limits.max_new_tokens} = {longest}); raise it or "
                "lower the limits"
            )
        return int(budget)

    def paged_pool(self, budget: int, max_n: int) -> tuple[int, int]:
        """(tokens, rows) the paged step's block pool holds: the scheduler's budget, and a row for each choice of
        each request of a full batch (each may leave a block partly empty)."""
        return budget, self.max_batch_requests * max_n

    def create_engine(self, settings: EngineSettings) -> Engine:
        """bf16 keeps an fp32 output layer and is gated on greedy decoding (handlers/generation/precision.py)."""
        return GeneratorEngine(settings, self)

    def load_model(self, model_dir: str) -> LoadedGenerator:
        return load_generator(model_dir, self.config, self.model_name)

    def reference_batch(self, loaded: LoadedGenerator) -> ModelInputs:
        # Fixed, seeded token ids: the accuracy gate compares next-token logits of reduced precision with fp32.
        generator = torch.Generator().manual_seed(1234)
        input_ids = torch.randint(0, loaded.limits.vocab_size, (4, 16), generator=generator)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

    def warmup_batches(self, loaded: LoadedGenerator) -> list[ModelInputs]:
        shapes = {(1, 8), (self.max_batch_requests, 8)}
        return [
            {
                "input_ids": torch.zeros(rows, width, dtype=torch.long),
                "attention_mask": torch.ones(rows, width, dtype=torch.long),
            }
            for rows, width in sorted(shapes)
        ]

    def forward(self, model: Any, batch: ModelInputs) -> torch.Tensor:
        """Next-token logits of the last column (the gate and warm-up; decoding uses handlers.generation.decoding)."""
        output = model(
            input_ids=batch["input_ids"].to(self.device), attention_mask=batch["attention_mask"].to(self.device)
        )
        return output.logits[:, -1, :]

    def describe(self) -> dict[str, Any]:
        limits = self.loaded.limits
        return {
            **super().describe(),
            "model": {**self.loaded.info, "source": self.loaded.source},
            "limits": {
                "max_prompt_tokens": limits.max_prompt_tokens,
                "max_new_tokens": limits.max_new_tokens,
                "default_max_new_tokens": limits.default_max_new_tokens,
                "max_temperature": limits.max_temperature,
                "max_n": limits.max_n,  # choices per OpenAI request (handler.max_n)
                "top_k_max": limits.vocab_size,
                "positions": limits.positions,  # the model's longest sequence (prompt + output), from its config
                "auto": list(limits.auto),  # the limits resolved from the positions (handler.<key>: auto)
            },
            "stop_token_ids": self.loaded.stop_token_ids,
            "openai": {
                "routes": [
                    f"/predictions/{self.model_name}/{self.model_version}/{route.path}"
                    for route in self.route_table.values()
                    if route.error_shape == OPENAI
                ],
                "chat_template": "the model's" if chat.has_chat_template(self.loaded.tokenizer) else "plain",
                "tools": chat.takes_tools(self.loaded.tokenizer),  # chat's tools: the template can show them
            },
            "scheduling": {
                "per_step": self.per_step,  # continuousBatching: true in model-config.yaml
                "max_batch_tokens": self.loop.scheduler.max_batch_tokens,
                "prefill_chunk_tokens": self.loop.scheduler.batch.chunk_tokens,
                "decode_call_ms": self.config["decode_call_ms"] if self.per_step else 0,
                "step_pieces": self.step_pieces,
                "mixed_passes": self.loop.scheduler.batch.mixable,  # chunks ride in the decoding passes
                "running": len(self.loop.scheduler.running),
                "waiting": len(self.loop.scheduler.waiting),
                "decode_steps": self.loop.scheduler.decode_steps,
                "prefills": self.loop.scheduler.prefills,
            },
            "compile_decode": self.compiled.describe(),
            "decode_attention": self.decode_attention.describe(),
            "decode_step": self.decode_step.describe(),
            "prefix_cache": self.prefix_cache.describe() if self.prefix_cache is not None else None,
            "semantic_cache": self.semantic.describe() if self.semantic is not None else None,
        }

    # ----------------------------------------------------------------------------------------------- per request
    def accept(
        self, data: list[Any], indices: Iterable[int], scope: BatchScope, responses: list[str | None]
    ) -> list[tuple[int, Any]]:
        """As the base; a request to the describe route is answered at once with the description."""
        accepted = []
        for idx, payload in super().accept(data, indices, scope, responses):
            if isinstance(payload, DescribeRequest):
                self.set_content_type(scope.context, idx, None)
                responses[idx] = DESCRIBE.answer(self.describe())
            else:
                accepted.append((idx, payload))
        return accepted

    def parse_request(self, body: Any, request: RequestView) -> AcceptedGeneration | DescribeRequest:
        """Validate one request by its route's parser (handlers.generation.routes; the base has checked the path is
        one of the routes); a refusal takes the route's error shape."""
        route = self.route_table[request.url_path]
        try:
            parsed = route.parse(body, request, self.served)
            if isinstance(parsed, DescribeRequest):
                return parsed
            self.check_room(parsed)
            return AcceptedGeneration(request.idx, self.over_grpc(parsed, request), self.loop.cache_query(parsed))
        except RequestError as error:  # invalid JSON or a bad cache option too: in the route's shape
            raise route.refusal(error) from None

    def check_room(self, parsed: GenerationRequest) -> None:
        """A request's n choices decode together, as n rows of the running batch: refused (naming ``n``) when they
        could never fit its room, rather than left waiting for ever."""
        room = self.loop.scheduler.max_batch_tokens
        if parsed.n > 1 and parsed.n * parsed.reserve > room:
            raise FieldError(
                "n",
                f"'n' is {parsed.n}: {parsed.n} choices of {parsed.reserve} tokens each (prompt + max tokens) need "
                f"{parsed.n * parsed.reserve} tokens of the running batch's room, which holds {room} "
                "(handler.max_batch_tokens); ask for fewer choices or fewer tokens",
            )

    def over_grpc(self, parsed: GenerationRequest, request: RequestView) -> GenerationRequest:
        """The request as it may be answered over its transport (gRPC reaches the native route)."""
        if parsed.stream and request.over_grpc and (self.per_step or request.input(GRPC_STREAM_INPUT) != "true"):
            # The worker cannot tell a unary Predictions call from StreamPredictions; pieces sent to a unary call
            # leave a dead worker that TorchServe still reports READY. Only a StreamPredictions caller that says so
            # (scripts/ops/grpc_client.py sends this input) gets them one by one, and only without per-step
            # scheduling: TorchServe 0.12's continuous batching takes a gRPC call it sends a piece to for a closed
            # one (GRPCJob.isOpen answers the opposite) and drops it, so there the stream comes in one message.
            return dataclasses.replace(parsed, send_pieces=False)
        return parsed

    # ----------------------------------------------------------------------------------------------- per step
    def handle(self, data: list[Any], context: Any) -> list[str]:
        """One scheduling step with per-step scheduling, else the whole batch (the base's stages below)."""
        if not self.per_step:
            return super().handle(data, context)
        self.set_identity_headers(context, len(data))
        context.stopping_criteria = None  # set again below for this step's answers; a describe call needs none
        if self.asks_describe(data, context):
            return [to_json(self.describe())]
        return self.step(data, context)

    def step(self, data: list[Any], context: Any) -> list[str]:
        """Serve one step of TorchServe's continuous batching: ``data`` holds every request the frontend serves now
        (running ones are known by their request id and come without their body), new ones included.

        New requests are parsed (refusals answered now) and looked up in the similarity cache (hits answered now);
        then one forward pass prefills those that fit or steps the running ones (GenerationLoop.step). The answer
        of this call carries the final answer of every request that ended, and the new text of every open stream
        (``ts_stream_next`` true: TorchServe keeps it and hands it over again). Any other request is left out of the
        answer (TorchServe then hands it over again with its body, which is ignored)."""
        arrived = time.perf_counter()
        scope = BatchScope(context, HandlerMetrics(context, self.model_name))
        request_ids = [context.get_request_id(idx) for idx in range(len(data))]
        index_of = {request_id: idx for idx, request_id in enumerate(request_ids)}
        self.cancel_missing(request_ids, scope)
        responses: list[str | None] = [None] * len(data)
        new = [idx for idx, request_id in enumerate(request_ids) if not self.loop.knows(request_id)]
        accepted = self.accept(data, new, scope, responses)
        finals: dict[int, tuple[AcceptedGeneration, Any]] = {
            payload.idx: (payload, outcome)
            for payload, outcome in self.loop.start([(request_ids[idx], p) for idx, p in accepted], arrived)
        }

        # Something to answer already (a refusal, a cached answer) goes out after one step, not after several.
        budget_s = 0.0 if finals or any(r is not None for r in responses) else self.config["decode_call_ms"] / 1000

        def send_pieces(pieces: list[tuple[Active, str]]) -> None:  # a step's text before the call's answer
            self.stream_sink(context, self.stream_chunks(context, index_of, pieces), STEP_PIECES)

        step = self.loop.step(arrived, scope.metrics, budget_s, send_pieces if self.step_pieces else None)
        for active, result in step.ended:
            idx = index_of[active.request_id]
            finals[idx] = (active.payload, result)
            if active.opened:
                scope.partly_answered.add(idx)

        criteria: dict[int, bool | None] = {idx: None for idx, response in enumerate(responses) if response is not None}
        for idx, (payload, result) in finals.items():
            responses[idx] = self.answer(scope, idx, payload, result)
            criteria[idx] = True if idx in scope.partly_answered else None  # a stream's last chunk, or one answer
        for idx, chunk in self.stream_chunks(context, index_of, step.pieces).items():
            responses[idx] = chunk
            criteria[idx] = False  # ts_stream_next: true
        self.end_grpc_streams(context, len(data))
        context.stopping_criteria = {idx: (lambda _answer, last=last: last) for idx, last in criteria.items()}
        for idx in range(len(data)):
            if idx not in criteria:  # not part of this answer: TorchServe hands it over again at the next step
                del context.request_ids[idx]
        return [response if response is not None else "" for response in responses]

    @staticmethod
    def stream_chunks(context: Any, index_of: dict[str, int], pieces: list[tuple[Active, str]]) -> dict[int, str]:
        """Streams' pieces as {batch index: chunk}, each request's content type set (n > 1: every choice's new text
        in its request's one chunk)."""
        chunks: dict[int, str] = {}
        for active, piece in pieces:
            idx = index_of[active.client_id]  # n > 1: a choice's request
            context.set_response_content_type(idx, active.generation.request.answers.stream_content_type)
            chunks[idx] = chunks.get(idx, "") + piece
        return chunks

    def cancel_missing(self, request_ids: list[str], scope: BatchScope) -> None:
        """Requests TorchServe no longer hands over: their clients went away, their rows are freed."""
        for active in self.loop.cancel_missing(request_ids):
            logger.info(
                "request %s: client gone after %d token(s); its generation is dropped",
                active.request_id,
                len(active.sequence.token_ids),
            )
            scope.metrics.record("CancelledRequests", 1)

    # ----------------------------------------------------------------------------------------------- whole batch
    def preprocess(self, payloads: list[AcceptedGeneration]) -> GenerationBatch:
        return self.loop.preprocess(payloads)

    def inference(self, batch: GenerationBatch, scope: BatchScope) -> GenerationBatch:
        """Decode the whole batch; streaming requests get their new text pieces after every step."""
        return self.loop.decode(batch, scope.metrics, lambda pieces: self.send_pieces(scope, pieces))

    def send_pieces(self, scope: BatchScope, pieces: list[tuple[Generation, str]]) -> None:
        """One step's stream chunks out as intermediate responses (none without a TorchServe context)."""
        if scope.context is None:
            return
        for generation, _ in pieces:
            scope.context.set_response_content_type(generation.idx, generation.request.answers.stream_content_type)
        chunks: dict[int, str] = {}
        for generation, chunk in pieces:  # n > 1: every choice's new text in one chunk
            chunks[generation.idx] = chunks.get(generation.idx, "") + chunk
        self.stream_sink(scope.context, chunks)
        scope.partly_answered.update(chunks)

    def postprocess(self, batch: GenerationBatch, payloads: list[AcceptedGeneration]) -> list[Any]:
        return self.loop.postprocess(batch, payloads)

    def after_batch(self, batch: GenerationBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        self.loop.record_caches(metrics)

    # ------------------------------------------------------------------------------ how answers are framed
    # Each request's API (native, OpenAI completions or chat) frames its answer: request.answers.
    @staticmethod
    def streams(payload: AcceptedGeneration | None) -> bool:
        return payload is not None and payload.request.stream

    def answer(self, scope: BatchScope, idx: int, payload: AcceptedGeneration, result: Any) -> str:
        """As the base; a server-sent-events stream that failed before its first chunk gets a plain JSON error with
        its status, which an OpenAI client reads (after a chunk the status is 200 already: an error event ends it)."""
        answers = payload.request.answers
        unopened = self.streams(payload) and idx not in scope.partly_answered
        if isinstance(result, RequestError) and unopened and answers.plain_error_until_streamed:
            payload = dataclasses.replace(payload, request=dataclasses.replace(payload.request, stream=False))
        return super().answer(scope, idx, payload, result)

    def serialize(self, payload: AcceptedGeneration | None, value: Any) -> str:
        """An Outcome in the request's API shape (a streamed one as its stream's last chunk); an error body as JSON, or
        as the chunk that closes the stream."""
        if payload is None:
            return super().serialize(payload, value)
        answers = payload.request.answers
        if isinstance(value, Outcome):
            return answers.stream_end(value) if payload.request.stream else to_json(answers.body(value))
        return answers.stream_error(value) if payload.request.stream else to_json(value)

    def error_value(self, payload: AcceptedGeneration | None, error: RequestError) -> dict[str, Any]:
        """The error in the request's API shape (payload None: refused while parsing, already in its shape)."""
        return super().error_value(payload, error) if payload is None else payload.request.answers.error_body(error)

    def content_type(self, payload: AcceptedGeneration | None) -> str:
        if payload is not None and payload.request.stream:
            return payload.request.answers.stream_content_type
        return super().content_type(payload)
