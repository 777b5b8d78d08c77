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

All accepted requests of a batch decode together (:func:`handlers.generation.decoding.generate`): one prefill over
the left-padded prompts, then one cached step per token; a finished request leaves the batch, and each request samples
with its own seeded generator, so its tokens do not depend on its batch-mates. Streamed pieces go out as TorchServe
intermediate responses addressed to the streaming requests only (:mod:`handlers.generation.streaming`). The model
folder: :mod:`handlers.generation.model`; its token limits (``auto`` from the model's positions):
:mod:`handlers.generation.limits`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, Option
from handlers.core.errors import RequestError, ServerError
from handlers.core.http import RequestView, json_body, to_json
from handlers.core.metrics import HandlerMetrics
from handlers.generation import chat
from handlers.generation.answers import Outcome
from handlers.generation.decoding import FINISH_ERROR, generate
from handlers.generation.limits import AUTO, AutoOrInt
from handlers.generation.model import LoadedGenerator, load_generator
from handlers.generation.openai_api import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    Served,
    as_openai_error,
    parse_openai_request,
)
from handlers.generation.requests import (
    AcceptedGeneration,
    Generation,
    GenerationBatch,
    parse_generation_request,
    start_generations,
)
from handlers.generation.semantic_cache.cache import SemanticCache, SemanticQuery, open_semantic_cache
from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION
from handlers.generation.semantic_cache.store import StoredAnswer
from handlers.generation.streaming import send_chunks

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
        "semantic_cache": SEMANTIC_CACHE_OPTION,
    }
    # '' = the native API at /predictions/<model>; the OpenAI routes follow /predictions/<model>/<version>/.
    routes = ("", COMPLETIONS_ROUTE, CHAT_ROUTE)
    loaded: LoadedGenerator

    def __init__(self) -> None:
        super().__init__()
        self.stream_sink = send_chunks  # how intermediate chunks leave; unit tests record them instead

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        model = {
            "name": self.model_name,
            "version": self.model_version,
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
                "routes": [f"/predictions/{self.model_name}/{self.model_version}/{r}" for r in self.routes if r],
                "chat_template": "the model's" if chat.has_chat_template(self.loaded.tokenizer) else "plain",
            },
            "semantic_cache": self.semantic.describe() if self.semantic is not None else None,
        }

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body: Any, request: RequestView) -> AcceptedGeneration:
        """Validate one request (see handlers.generation.requests; OpenAI routes: handlers.generation.openai_api)."""
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
        if parsed.stream and request.over_grpc and request.input(GRPC_STREAM_INPUT) != "true":
            # The worker cannot tell a unary Predictions call from StreamPredictions; pieces sent to a unary call
            # leave a dead worker that TorchServe still reports READY. Only a StreamPredictions caller that says so
            # (scripts/ops/grpc_client.py sends this input) gets them one by one.
            parsed = dataclasses.replace(parsed, send_pieces=False)
        return AcceptedGeneration(request.idx, parsed, self.semantic_query(parsed))

    def semantic_query(self, parsed: Any) -> SemanticQuery | str | None:
        """Where the similarity cache looks this request up (or why it does not: a reason); None: no cache."""
        if self.semantic is None:
            return None
        return self.semantic.query(parsed.settings, parsed.stop, parsed.lookup)

    # ----------------------------------------------------------------------------------------------- per batch
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
        """Decode the batch; streaming requests get their new text pieces after every step."""
        generations = batch.generations
        if not generations:  # every request was answered from the similarity cache
            return batch
        started = time.perf_counter()
        first_token_at: list[float] = []

        def on_step(new_tokens: dict[int, int]) -> None:
            if not first_token_at:
                first_token_at.append(time.perf_counter())
            chunks = {}
            for index, token in new_tokens.items():
                generation = generations[index]
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
        )
        if first_token_at:
            scope.metrics.record("TimeToFirstTokenSeconds", first_token_at[0] - started)
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
            request = payload.request
            hit = batch.answered.get(position)
            if hit is not None:
                results.append(
                    Outcome(
                        text=hit.answer.text,
                        rest=hit.answer.text if request.stream else "",
                        finish_reason=hit.answer.finish_reason,
                        prompt_tokens=len(request.prompt_ids),
                        completion_tokens=hit.answer.completion_tokens,
                        seed=request.settings.seed if request.seed_reported else None,
                        model=self.loaded.info,
                        cached={"similarity": round(hit.similarity, 4), "age_s": round(hit.age_s, 1)},
                    )
                )
                continue
            index, generation = next(decoded)
            sequence = generation.sequence
            if sequence.finish_reason == FINISH_ERROR:
                results.append(
                    ServerError(f"generation stopped after {len(sequence.token_ids)} token(s): {sequence.error}")
                )
                continue
            generation.text.finish()
            if generation.text.stopped:  # a stop sequence completed by the text held back until the end
                sequence.stop()
            outcome = Outcome(
                text=generation.text.text,
                rest=generation.text.rest() if request.stream else "",
                finish_reason=sequence.finish_reason,
                prompt_tokens=len(sequence.prompt_ids),
                completion_tokens=len(sequence.token_ids),
                seed=request.settings.seed if request.seed_reported else None,
                model=self.loaded.info,
            )
            results.append(outcome)
            if index in batch.remember and outcome.finish_reason is not None:
                group, vector = batch.remember[index]
                answer = StoredAnswer(outcome.text, outcome.finish_reason, outcome.completion_tokens)
                remember.append((group, vector, answer))
        if remember and self.semantic is not None:
            self.semantic.remember(remember)
        return results

    def after_batch(self, batch: GenerationBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        if self.semantic is not None:
            self.semantic.record(metrics)

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
