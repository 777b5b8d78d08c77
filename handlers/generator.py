"""Handler for ``generator``: text generation with a Hugging Face causal LM, KV cache, optional streaming.

Request ``{"prompt": "...", "max_new_tokens": n, "temperature": t, "top_k": k, "seed": s, "stream": bool}``
(validated by :mod:`handlers.generation.requests`) -> ``{"text", "finish_reason", "prompt_tokens",
"completion_tokens", "model": {"name", "weights"}}`` (+ ``"seed"`` when sampling). With ``"stream": true`` the answer
is newline-delimited JSON sent as the tokens are produced: ``{"text": piece, "done": false}`` lines, then one
``{"text": rest, "done": true, ...counts...}`` line; the pieces concatenate to the non-streamed text.

The same model speaks OpenAI's completions and chat completions at ``/predictions/<model>/<version>/v1/completions``
and ``.../v1/chat/completions`` (:mod:`handlers.generation.openai_api`, chat templates in
:mod:`handlers.generation.chat`): those bodies map onto the same generation requests and limits, and only the framing
of answers and streams differs (server-sent events instead of NDJSON; :mod:`handlers.generation.answers`).

Requests are scheduled per step by default (``continuousBatching: true`` in model-config.yaml, TorchServe's own
iteration-level batching): TorchServe hands the worker, at every step, the requests it serves, up to ``batchSize``.
A request that arrives while others decode is prefilled in the next pass and joins the running batch; one that reaches
its end (length, end-of-text, a stop sequence, an error) leaves at once and its answer is sent then; one whose client
has gone is no longer handed over and its rows are freed (:mod:`handlers.generation.scheduler`,
:mod:`handlers.generation.running`). Each step answers TorchServe with the new text of every open stream; a plain
request is left out of the answer until it is complete, so its status is that of its outcome. Prompts reuse the keys
and values of a prefix computed before (:mod:`handlers.generation.prefix_cache`). Without ``continuousBatching`` the
handler decodes each batch TorchServe collected to its end (:func:`handlers.generation.running.generate`), sending
stream pieces as intermediate responses (:mod:`handlers.generation.streaming`). Either way each request samples with
its own seeded generator, so its tokens do not depend on what it shares steps with. The model folder:
:mod:`handlers.generation.model`; its token limits (``auto`` from the model's positions):
:mod:`handlers.generation.limits`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import torch

from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.errors import RequestError, ServerError
from handlers.core.http import RequestView, json_body, to_json
from handlers.core.metrics import HandlerMetrics
from handlers.generation import chat, kv_cache
from handlers.generation.answers import Outcome
from handlers.generation.decoding import FINISH_ERROR
from handlers.generation.limits import AUTO, AutoOrInt
from handlers.generation.model import LoadedGenerator, load_generator
from handlers.generation.openai_api import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    Served,
    as_openai_error,
    parse_openai_request,
)
from handlers.generation.prefix_cache import PREFIX_CACHE_OPTION, PrefixCache, open_prefix_cache
from handlers.generation.requests import (
    AcceptedGeneration,
    Generation,
    GenerationBatch,
    GenerationRequest,
    parse_generation_request,
    start_generations,
)
from handlers.generation.running import RunningBatch, generate
from handlers.generation.scheduler import Active, Iteration, StepScheduler
from handlers.generation.semantic_cache.cache import SemanticCache, SemanticQuery, open_semantic_cache
from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION
from handlers.generation.semantic_cache.store import StoredAnswer
from handlers.generation.streaming import send_chunks

logger = logging.getLogger(__name__)

# The gRPC input a StreamPredictions caller adds beside "body" to get a streamed answer piece by piece.
GRPC_STREAM_INPUT = "stream_pieces"
# /predictions/<model>/<version>/describe answers what the customized describe answers. With continuousBatching,
# TorchServe 0.12 puts a customized describe (GET /models/<model>?customized=true) back in the queue each time it
# takes it, for ever: the worker then serves nothing else. This route is the safe way to ask.
DESCRIBE_ROUTE = "describe"

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
        "prefix_cache": PREFIX_CACHE_OPTION,
        "semantic_cache": SEMANTIC_CACHE_OPTION,
    }
    # '' = the native API at /predictions/<model>; the OpenAI routes follow /predictions/<model>/<version>/.
    routes = ("", COMPLETIONS_ROUTE, CHAT_ROUTE, DESCRIBE_ROUTE)
    loaded: LoadedGenerator

    def __init__(self) -> None:
        super().__init__()
        self.stream_sink = send_chunks  # how intermediate chunks leave; unit tests record them instead

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        # TorchServe's continuousBatching hands the worker its requests at every step: decode one step per call.
        self.per_step = bool(yaml_config.get("continuousBatching", False))
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
        self.scheduler = StepScheduler(
            RunningBatch(self.loaded.model, self.loaded.pad_token_id, self.loaded.stop_token_ids, self.prefix_cache),
            self.batch_token_budget(),
        )
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

    def batch_token_budget(self) -> int:
        """handler.max_batch_tokens resolved: at least one request at its longest must fit."""
        limits = self.loaded.limits
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
                "top_k_max": limits.vocab_size,
                "positions": limits.positions,  # the model's longest sequence (prompt + output), from its config
                "auto": list(limits.auto),  # the limits resolved from the positions (handler.<key>: auto)
            },
            "stop_token_ids": self.loaded.stop_token_ids,
            "openai": {
                "routes": [
                    f"/predictions/{self.model_name}/{self.model_version}/{r}"
                    for r in self.routes
                    if r and r != DESCRIBE_ROUTE
                ],
                "chat_template": "the model's" if chat.has_chat_template(self.loaded.tokenizer) else "plain",
            },
            "scheduling": {
                "per_step": self.per_step,  # continuousBatching: true in model-config.yaml
                "max_batch_tokens": self.scheduler.max_batch_tokens,
                "running": len(self.scheduler.running),
                "waiting": len(self.scheduler.waiting),
                "decode_steps": self.scheduler.decode_steps,
                "prefills": self.scheduler.prefills,
            },
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
            if payload == DESCRIBE_ROUTE:
                self.set_content_type(scope.context, idx, None)
                responses[idx] = to_json(self.describe())
            else:
                accepted.append((idx, payload))
        return accepted

    def parse_request(self, body: Any, request: RequestView) -> Any:
        """Validate one request (see handlers.generation.requests; OpenAI routes: handlers.generation.openai_api)."""
        if request.url_path == DESCRIBE_ROUTE:
            return DESCRIBE_ROUTE
        if request.url_path:
            served = Served(self.model_name, self.loaded.info, self.loaded.limits, self.loaded.tokenizer)
            try:
                value = None if body is None else json_body(body, request)
                parsed = parse_openai_request(request.url_path, value, served)
                return AcceptedGeneration(request.idx, parsed, self.semantic_query(parsed))
            except RequestError as error:  # invalid JSON or a bad cache option: refused in OpenAI's shape too
                raise as_openai_error(error) from None
        if body is None:
            raise RequestError("body must be a JSON object with a 'prompt' field, got null")
        tokenize = self.loaded.tokenizer.encode
        parsed = parse_generation_request(json_body(body, request), self.loaded.limits, tokenize)
        if parsed.stream and request.over_grpc and (self.per_step or request.input(GRPC_STREAM_INPUT) != "true"):
            # The worker cannot tell a unary Predictions call from StreamPredictions; pieces sent to a unary call
            # leave a dead worker that TorchServe still reports READY. Only a StreamPredictions caller that says so
            # (scripts/ops/grpc_client.py sends this input) gets them one by one, and only without per-step
            # scheduling: TorchServe 0.12's continuous batching takes a gRPC call it sends a piece to for a closed
            # one (GRPCJob.isOpen answers the opposite) and drops it, so there the stream comes in one message.
            parsed = dataclasses.replace(parsed, send_pieces=False)
        return AcceptedGeneration(request.idx, parsed, self.semantic_query(parsed))

    def semantic_query(self, parsed: Any) -> SemanticQuery | str | None:
        """Where the similarity cache looks this request up (or why it does not: a reason); None: no cache."""
        if self.semantic is None:
            return None
        return self.semantic.query(parsed.settings, parsed.stop, parsed.lookup)

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
        then one forward pass prefills those that fit or steps the running ones. The answer of this call carries the
        final answer of every request that ended, and the new text of every open stream (``ts_stream_next`` true:
        TorchServe keeps it and hands it over again). Any other request is left out of the answer (TorchServe then
        hands it over again with its body, which is ignored)."""
        arrived = time.perf_counter()
        scope = BatchScope(context, HandlerMetrics(context, self.model_name))
        request_ids = [context.get_request_id(idx) for idx in range(len(data))]
        index_of = {request_id: idx for idx, request_id in enumerate(request_ids)}
        self.cancel_missing(request_ids, scope)
        responses: list[str | None] = [None] * len(data)
        new = [idx for idx, request_id in enumerate(request_ids) if not self.scheduler.knows(request_id)]
        finals: dict[int, tuple[AcceptedGeneration, Any]] = {}
        self.start_requests(self.accept(data, new, scope, responses), request_ids, arrived, finals)

        with torch.inference_mode():
            iteration = self.scheduler.iterate()
        pieces = self.advance_step(iteration)
        self.record_step(iteration, arrived, scope)
        for active in self.scheduler.finished():
            idx = index_of[active.request_id]
            result = self.decoded_result(active.generation)
            if isinstance(result, Outcome) and "remember" in active.extra:
                self.remember([(*active.extra["remember"], result)])
            finals[idx] = (active.extra["payload"], result)
            if active.extra.get("opened"):
                scope.partly_answered.add(idx)

        criteria: dict[int, bool | None] = {idx: None for idx, response in enumerate(responses) if response is not None}
        for idx, (payload, result) in finals.items():
            responses[idx] = self.answer(scope, idx, payload, result)
            criteria[idx] = True if idx in scope.partly_answered else None  # a stream's last chunk, or one answer
        for request_id, piece in pieces.items():
            idx = index_of[request_id]
            active = self.scheduler.active[request_id]
            active.extra["opened"] = True
            answers = active.generation.request.answers
            context.set_response_content_type(idx, answers.stream_content_type)
            responses[idx] = answers.piece(piece)
            criteria[idx] = False  # ts_stream_next: true
        self.end_grpc_streams(context, len(data))
        context.stopping_criteria = {idx: (lambda _answer, last=last: last) for idx, last in criteria.items()}
        for idx in range(len(data)):
            if idx not in criteria:  # not part of this answer: TorchServe hands it over again at the next step
                del context.request_ids[idx]
        return [response if response is not None else "" for response in responses]

    def cancel_missing(self, request_ids: list[str], scope: BatchScope) -> None:
        """Requests TorchServe no longer hands over: their clients went away, their rows are freed."""
        for active in self.scheduler.cancel_missing(request_ids):
            logger.info(
                "request %s: client gone after %d token(s); its generation is dropped",
                active.request_id,
                len(active.sequence.token_ids),
            )
            scope.metrics.record("CancelledRequests", 1)

    def start_requests(
        self,
        accepted: list[tuple[int, AcceptedGeneration]],
        request_ids: list[str],
        arrived: float,
        finals: dict[int, tuple[AcceptedGeneration, Any]],
    ) -> None:
        """New accepted requests: answered from the similarity cache (into ``finals``) or queued to decode."""
        if not accepted:
            return
        payloads = [payload for _, payload in accepted]
        looked = self.semantic.look_up_batch([p.cache for p in payloads]) if self.semantic is not None else None
        generations = start_generations(payloads, self.loaded.tokenizer).generations
        for position, ((idx, payload), generation) in enumerate(zip(accepted, generations, strict=True)):
            item = looked[position] if looked is not None else None
            if item is not None and item.hit is not None:
                finals[idx] = (payload, self.cached_result(payload.request, item.hit))
                continue
            request = payload.request
            active = Active(
                request_id=request_ids[idx],
                generation=generation,
                arrived=arrived,
                reserve=len(request.prompt_ids) + request.settings.max_new_tokens,
                extra={"payload": payload},
            )
            if item is not None and item.vector is not None:
                active.extra["remember"] = (item.group, item.vector)
            self.scheduler.add(active)

    def advance_step(self, iteration: Iteration) -> dict[str, str]:
        """The step's tokens into each request's text; returns the new text of each stream that has some (a stream
        without new text this step is left out of the answer, as a plain request is)."""
        pieces = {}
        for request_id, token in iteration.new_tokens.items():
            piece = self.advance(self.scheduler.active[request_id].generation, token)
            if piece:
                pieces[request_id] = piece
        return pieces

    def record_step(self, iteration: Iteration, arrived: float, scope: BatchScope) -> None:
        metrics = scope.metrics
        now = time.perf_counter()
        for request_id in iteration.new_tokens:
            active = self.scheduler.active[request_id]
            if len(active.sequence.token_ids) == 1:
                metrics.record("TimeToFirstTokenSeconds", now - active.arrived)
        if iteration.new_tokens:
            metrics.record("GeneratedTokens", len(iteration.new_tokens))
        if iteration.kind == "decode":
            metrics.record("DecodeSteps", 1)
        metrics.record("InferenceSeconds", iteration.seconds)
        metrics.record("BatchRows", iteration.rows)
        metrics.record("Batches", 1)
        metrics.record("RunningRequests", len(self.scheduler.running))
        metrics.record("WaitingRequests", len(self.scheduler.waiting))
        self.record_caches(metrics)

    def record_caches(self, metrics: HandlerMetrics) -> None:
        """What the prefix and similarity caches counted since they were last recorded."""
        if self.prefix_cache is not None:
            pending = self.prefix_cache.stats.drain()
            for name, metric in (("hits", "PrefixCacheHits"), ("misses", "PrefixCacheMisses")):
                if pending.get(name):
                    metrics.record(metric, pending[name])
            if pending.get("reused_tokens"):
                metrics.record("PrefixCacheTokens", pending["reused_tokens"])
        computed = self.scheduler.batch.computed_prompt_tokens
        if computed:
            metrics.record("PrefillTokens", computed)
            self.scheduler.batch.computed_prompt_tokens = 0
        if self.semantic is not None:
            self.semantic.record(metrics)

    # ----------------------------------------------------------------------------------------------- whole batch
    def preprocess(self, payloads: list[AcceptedGeneration]) -> GenerationBatch:
        """The requests to decode; with the similarity cache on, those it answers are set aside first."""
        if self.semantic is None:
            return start_generations(payloads, self.loaded.tokenizer)
        looked = self.semantic.look_up_batch([payload.cache for payload in payloads])
        answered = {position: item.hit for position, item in enumerate(looked) if item.hit is not None}
        to_decode = [position for position in range(len(payloads)) if position not in answered]
        batch = start_generations([payloads[position] for position in to_decode], self.loaded.tokenizer)
        remember = {
            index: (looked[position].group, looked[position].vector)
            for index, position in enumerate(to_decode)
            if looked[position].vector is not None
        }
        return dataclasses.replace(batch, answered=answered, remember=remember)

    def inference(self, batch: GenerationBatch, scope: BatchScope) -> GenerationBatch:
        """Decode the whole batch; streaming requests get their new text pieces after every step."""
        generations = batch.generations
        if not generations:  # every request was answered from the similarity cache
            return batch
        started = time.perf_counter()

        def on_step(new_tokens: dict[int, int]) -> None:
            now = time.perf_counter()
            chunks = {}
            for index, token in new_tokens.items():
                generation = generations[index]
                if not generation.sequence.token_ids[:-1]:  # its first token: from the request's arrival
                    scope.metrics.record("TimeToFirstTokenSeconds", now - started)
                piece = self.advance(generation, token)
                if piece:
                    chunks[generation.idx] = generation.request.answers.piece(piece)
            if chunks and scope.context is not None:
                for generation in generations:
                    if generation.idx in chunks:
                        scope.context.set_response_content_type(
                            generation.idx, generation.request.answers.stream_content_type
                        )
                self.stream_sink(scope.context, chunks)
                scope.partly_answered.update(chunks)

        generate(
            self.loaded.model,
            [g.sequence for g in generations],
            self.loaded.stop_token_ids,
            self.loaded.pad_token_id,
            use_cache=True,
            on_step=on_step,
            prefix_cache=self.prefix_cache,
        )
        scope.metrics.record("GeneratedTokens", sum(len(g.sequence.token_ids) for g in generations))
        return batch  # its generations now hold their tokens and text

    @staticmethod
    def advance(generation: Generation, token: int) -> str:
        """Add one new token to a generation's text; returns the text its stream may send now ('' for none).

        A stop sequence in the text finishes the generation at once (it leaves the batch before the next step). A
        finished request's last text goes in its final chunk, which closes its stream."""
        generation.text.push(token)
        if generation.text.stopped:
            generation.sequence.stop()
        if not generation.request.stream or not generation.request.send_pieces or generation.sequence.finished:
            return ""
        return generation.text.take()

    def postprocess(self, batch: GenerationBatch, payloads: list[AcceptedGeneration]) -> list[Any]:
        """One result per accepted request, in order: its answer from the cache, or its decoded one (which the
        similarity cache keeps when it looked the request up)."""
        decoded = iter(enumerate(batch.generations))
        results: list[Any] = []
        remember = []
        for position, payload in enumerate(payloads):
            hit = batch.answered.get(position)
            if hit is not None:
                results.append(self.cached_result(payload.request, hit))
                continue
            index, generation = next(decoded)
            result = self.decoded_result(generation)
            results.append(result)
            if index in batch.remember and isinstance(result, Outcome):
                remember.append((*batch.remember[index], result))
        self.remember(remember)
        return results

    def cached_result(self, request: GenerationRequest, hit: Any) -> Outcome:
        """The answer of a request the similarity cache answers."""
        return Outcome(
            text=hit.answer.text,
            rest=hit.answer.text if request.stream else "",
            finish_reason=hit.answer.finish_reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=hit.answer.completion_tokens,
            seed=request.settings.seed if request.seed_reported else None,
            model=self.loaded.info,
            cached={"similarity": round(hit.similarity, 4), "age_s": round(hit.age_s, 1)},
        )

    def decoded_result(self, generation: Generation) -> Outcome | ServerError:
        """The answer of a finished generation (or the error that stopped it)."""
        sequence, request = generation.sequence, generation.request
        if sequence.finish_reason == FINISH_ERROR:
            return ServerError(f"generation stopped after {len(sequence.token_ids)} token(s): {sequence.error}")
        generation.text.finish()
        if generation.text.stopped:  # a stop sequence completed by the text held back until the end
            sequence.stop()
        return Outcome(
            text=generation.text.text,
            rest=generation.text.rest() if request.stream else "",
            finish_reason=sequence.finish_reason,
            prompt_tokens=len(sequence.prompt_ids),
            completion_tokens=len(sequence.token_ids),
            seed=request.settings.seed if request.seed_reported else None,
            model=self.loaded.info,
        )

    def remember(self, answers: list[tuple[bytes, Any, Outcome]]) -> None:
        """Give the similarity cache new answers, each with the group and prompt vector it was looked up with."""
        kept = [
            (group, vector, StoredAnswer(outcome.text, outcome.finish_reason, outcome.completion_tokens))
            for group, vector, outcome in answers
            if outcome.finish_reason is not None
        ]
        if kept and self.semantic is not None:
            self.semantic.remember(kept)

    def after_batch(self, batch: GenerationBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        self.record_caches(metrics)

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
