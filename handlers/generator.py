"""Handler for ``generator``: text generation with a Hugging Face causal LM, KV cache, optional streaming.

Request ``{"prompt": "...", "max_new_tokens": n, "temperature": t, "top_k": k, "seed": s, "stream": bool}``
(validated by :mod:`handlers.generation.requests`) -> ``{"text", "finish_reason", "prompt_tokens",
"completion_tokens", "model": {"name", "weights"}}`` (+ ``"seed"`` when sampling). With ``"stream": true`` the answer
is newline-delimited JSON sent as the tokens are produced: ``{"text": piece, "done": false}`` lines, then one
``{"text": rest, "done": true, ...counts...}`` line; the pieces concatenate to the non-streamed text.

All accepted requests of a batch decode together (:func:`handlers.generation.decoding.generate`): one prefill over
the left-padded prompts, then one cached step per token; a finished request leaves the batch, and each request samples
with its own seeded generator, so its tokens do not depend on its batch-mates. Streamed pieces go out as TorchServe
intermediate responses addressed to the streaming requests only (:mod:`handlers.generation.streaming`). The model
folder: :mod:`handlers.generation.model`; its token limits (``auto`` from the model's positions):
:mod:`handlers.generation.limits`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, Option
from handlers.core.errors import RequestError, ServerError
from handlers.core.http import RequestView, json_body
from handlers.generation.decoding import FINISH_ERROR, generate
from handlers.generation.limits import AUTO, AutoOrInt
from handlers.generation.model import LoadedGenerator, load_generator
from handlers.generation.requests import (
    AcceptedGeneration,
    GenerationBatch,
    parse_generation_request,
    start_generations,
)
from handlers.generation.streaming import STREAM_CONTENT_TYPE, ndjson, send_chunks

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
    }
    loaded: LoadedGenerator

    def __init__(self) -> None:
        super().__init__()
        self.stream_sink = send_chunks  # how intermediate chunks leave; unit tests record them instead

    # ----------------------------------------------------------------------------------------------- load time
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
        }

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body: Any, request: RequestView) -> AcceptedGeneration:
        """Validate one request (see handlers.generation.requests)."""
        if body is None:
            raise RequestError("body must be a JSON object with a 'prompt' field, got null")
        tokenize = self.loaded.tokenizer.encode
        return AcceptedGeneration(
            request.idx, parse_generation_request(json_body(body, request), self.loaded.limits, tokenize)
        )

    # ----------------------------------------------------------------------------------------------- per batch
    def preprocess(self, payloads: list[AcceptedGeneration]) -> GenerationBatch:
        return start_generations(payloads, self.loaded.tokenizer)

    def inference(self, batch: GenerationBatch, scope: BatchScope) -> GenerationBatch:
        """Decode the batch; streaming requests get their new text pieces after every step."""
        generations = batch.generations
        started = time.perf_counter()
        first_token_at: list[float] = []

        def on_step(new_tokens: dict[int, int]) -> None:
            if not first_token_at:
                first_token_at.append(time.perf_counter())
            chunks = {}
            for index, token in new_tokens.items():
                generation = generations[index]
                generation.text.push(token)
                # A finished request's last pieces go in its final line, which closes its stream.
                if generation.request.stream and not generation.sequence.finished:
                    piece = "".join(generation.text.pieces[generation.pieces_sent :])
                    if piece:
                        chunks[generation.idx] = ndjson({"text": piece, "done": False})
                        generation.pieces_sent = len(generation.text.pieces)
            if chunks and scope.context is not None:
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
        return batch  # its generations now hold their tokens and text pieces

    def postprocess(self, batch: GenerationBatch, payloads: list[AcceptedGeneration]) -> list[Any]:
        results: list[Any] = []
        for generation in batch.generations:
            request, sequence = generation.request, generation.sequence
            if sequence.finish_reason == FINISH_ERROR:
                results.append(
                    ServerError(f"generation stopped after {len(sequence.token_ids)} token(s): {sequence.error}")
                )
                continue
            generation.text.finish()
            answer = {
                "finish_reason": sequence.finish_reason,
                "prompt_tokens": len(sequence.prompt_ids),
                "completion_tokens": len(sequence.token_ids),
                "model": self.loaded.info,
            }
            if request.seed_reported:
                answer["seed"] = request.settings.seed
            if request.stream:
                rest = "".join(generation.text.pieces[generation.pieces_sent :])
                results.append({"text": rest, "done": True, **answer})
            else:
                results.append({"text": generation.text.text, **answer})
        return results

    # ------------------------------------------------------------------------------ how answers are framed
    @staticmethod
    def streams(payload: AcceptedGeneration | None) -> bool:
        return payload is not None and payload.request.stream

    def serialize(self, payload: AcceptedGeneration | None, value: Any) -> str:
        """A streamed request's answer (or error) is its stream's last NDJSON line; the others are one JSON object."""
        return ndjson(value) if self.streams(payload) else super().serialize(payload, value)

    def error_value(self, payload: AcceptedGeneration | None, error: RequestError) -> dict[str, Any]:
        """As the base; a streamed answer's error also closes its stream (``done``), which may already be open."""
        body = super().error_value(payload, error)
        return {**body, "done": True} if self.streams(payload) else body

    def content_type(self, payload: AcceptedGeneration | None) -> str:
        return STREAM_CONTENT_TYPE if self.streams(payload) else super().content_type(payload)
