"""The native generation API at ``/predictions/<model>``: its body, its parser and its answer writer.

Accepted body (JSON object; docs/generation.md)::

    {"prompt": str, "max_new_tokens": int?, "temperature": number?, "top_k": int?, "seed": int?, "stream": bool?,
     "response_format": object?}

``response_format`` has OpenAI's shape and meaning (:mod:`handlers.generation.structured`). The checks of each
field are the shared ones of :mod:`handlers.generation.requests`. Answers are one JSON object, or NDJSON lines when
streamed (:class:`NativeAnswers`); refusals have the native error shape. gRPC's Predictions and StreamPredictions
calls reach this same route (TorchServe sends no ``url_path`` for them): over gRPC only whether pieces are sent ahead
of the answer differs, which the TorchServe adapter decides (handlers/generator.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from handlers.core.errors import RequestError
from handlers.core.http import RequestView, json_body
from handlers.core.routes import Route
from handlers.generation import structured
from handlers.generation.answers import Outcome
from handlers.generation.decoding import SamplingSettings
from handlers.generation.requests import (
    GenerationLimits,
    GenerationRequest,
    Served,
    checked_prompt,
    checked_seed,
    checked_stream,
    checked_temperature,
    integer,
    max_new_tokens,
    prompt_lookup,
    prompt_tokens,
)
from handlers.generation.semantic_cache.options import REQUEST_FIELD
from handlers.generation.streaming import STREAM_CONTENT_TYPE, ndjson

FIELDS = ("prompt", "max_new_tokens", "temperature", "top_k", "seed", "stream", REQUEST_FIELD, structured.FIELD)


class NativeAnswers:
    """``POST /predictions/generator``: ``{"text", "finish_reason", "prompt_tokens", "completion_tokens", "model"}``
    (+ ``"seed"`` when sampling); streamed as NDJSON ``{"text": piece, "done": false}`` lines and a last line with
    ``"done": true``, the rest of the text and the counts (docs/generation.md)."""

    stream_content_type = STREAM_CONTENT_TYPE
    plain_error_until_streamed = False

    def counts(self, outcome: Outcome) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "finish_reason": outcome.finish_reason,
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "model": outcome.model,
        }
        if outcome.seed is not None:
            answer["seed"] = outcome.seed
        return outcome.marked(answer)

    def body(self, outcome: Outcome) -> dict[str, Any]:
        return {"text": outcome.text, **self.counts(outcome)}

    def piece(self, text: str) -> str:
        return ndjson({"text": text, "done": False})

    def stream_end(self, outcome: Outcome) -> str:
        return ndjson({"text": outcome.rest, "done": True, **self.counts(outcome)})

    def error_body(self, error: RequestError) -> dict[str, Any]:
        return error.to_body()

    def stream_error(self, body: dict[str, Any]) -> str:
        return ndjson({**body, "done": True})


NATIVE_ANSWERS = NativeAnswers()


def parse_generation_request(
    body: Any, limits: GenerationLimits, tokenize: Callable[[str], list[int]]
) -> GenerationRequest:
    """Validate one (already JSON-decoded) body; ``tokenize`` turns the prompt into token ids."""
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with a 'prompt' field, got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; accepted fields are {list(FIELDS)}"[:500])
    prompt = checked_prompt(body, limits)

    new_tokens = max_new_tokens(body, "max_new_tokens", limits)
    temperature = checked_temperature(body, limits.max_temperature)
    top_k = integer(body, "top_k", 0, 0, limits.vocab_size)
    seed, _ = checked_seed(body)
    stream = checked_stream(body)
    lookup = prompt_lookup(body, prompt)

    prompt_ids = prompt_tokens(tokenize(prompt), "'prompt'", limits)
    settings = SamplingSettings(max_new_tokens=new_tokens, temperature=temperature, top_k=top_k, seed=seed)
    return GenerationRequest(
        prompt_ids=prompt_ids,
        settings=settings,
        stream=stream,
        seed_reported=not settings.greedy,
        answers=NATIVE_ANSWERS,
        lookup=lookup,
    )


def parse(body: Any, request: RequestView, served: Served) -> GenerationRequest:
    """The route's parser: one body as TorchServe handed it."""
    if body is None:
        raise RequestError("body must be a JSON object with a 'prompt' field, got null")
    body = json_body(body, request)
    generation = parse_generation_request(body, served.limits, served.tokenizer.encode)
    response_format = structured.checked_response_format(body, served)  # compiled for the served tokenizer
    if response_format is None:
        return generation
    lookup = structured.uncached_lookup(generation.lookup, response_format)
    return dataclasses.replace(generation, structured=response_format, lookup=lookup)


ROUTE = Route("", parse, NativeAnswers, api="native")
