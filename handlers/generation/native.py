"""The native generation API at ``/predictions/<model>``: its body, its parser and its answer writer.

Accepted body (JSON object; docs/generation.md)::

    {"prompt": str, "max_new_tokens": int?, "temperature": number?, "top_k": int?, "seed": int?, "stream": bool?,
     "logprobs": int?, "n": int?, "response_format": object?}

``n`` (1..handler.max_n) decodes that many choices of the prompt (:mod:`handlers.generation.choices`; the answer is
then ``{"choices": [...], ...counts}``). ``logprobs`` k (0..20) adds each generated token's log probability and its
k likeliest alternatives' to the answer (and to each streamed line, for the tokens it carries):
:mod:`handlers.generation.logprobs`.

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
from handlers.generation.logprobs import TokenLogprob, TokenText, native_logprobs, token_text
from handlers.generation.options import native_logprobs as native_logprobs_option
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

FIELDS = (
    "prompt",
    "max_new_tokens",
    "temperature",
    "top_k",
    "seed",
    "stream",
    "logprobs",
    "n",
    REQUEST_FIELD,
    structured.FIELD,
)


class NativeAnswers:
    """``POST /predictions/generator``: ``{"text", "finish_reason", "prompt_tokens", "completion_tokens", "model"}``
    (+ ``"seed"`` when sampling); streamed as NDJSON ``{"text": piece, "done": false}`` lines and a last line with
    ``"done": true``, the rest of the text and the counts (docs/generation.md). With ``n`` > 1 the texts are in
    ``"choices": [{"index", "text", "finish_reason", "completion_tokens"}]`` (the counts add them up), and each
    streamed line says which choice its text is of (``"index"``)."""

    stream_content_type = STREAM_CONTENT_TYPE
    plain_error_until_streamed = False

    def __init__(self, token_text: TokenText | None = None, n: int = 1) -> None:
        self.token_text = token_text  # set when the request asked for log probabilities
        self.n = n

    def logprobs(self, logprobs: tuple[TokenLogprob, ...] | None) -> dict[str, Any]:
        if logprobs is None or self.token_text is None:
            return {}
        return {"logprobs": native_logprobs(list(logprobs), self.token_text)}

    def counts(self, outcome: Outcome, per_choice: bool = False) -> dict[str, Any]:
        """The answer's counts (``per_choice``: n > 1, the finish reasons are the choices')."""
        answer: dict[str, Any] = {} if per_choice else {"finish_reason": outcome.finish_reason}
        answer |= {
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "model": outcome.model,
        }
        if outcome.seed is not None:
            answer["seed"] = outcome.seed
        return outcome.marked(answer)

    def choices(self, outcome: Outcome, streamed: bool) -> dict[str, Any]:
        """n > 1: every choice's text (a stream's rest), its own finish reason and token count."""
        return {
            "choices": [
                {
                    "index": index,
                    "text": choice.rest if streamed else choice.text,
                    **self.logprobs(choice.rest_logprobs if streamed else choice.logprobs),
                    "finish_reason": choice.finish_reason,
                    "completion_tokens": choice.completion_tokens,
                }
                for index, choice in enumerate(outcome.each())
            ]
        }

    def body(self, outcome: Outcome) -> dict[str, Any]:
        if self.n > 1:
            return {**self.choices(outcome, False), **self.counts(outcome, per_choice=True)}
        return {"text": outcome.text, **self.logprobs(outcome.logprobs), **self.counts(outcome)}

    def piece(self, text: str, logprobs: tuple[TokenLogprob, ...] | None = None, index: int = 0) -> str:
        choice = {"index": index} if self.n > 1 else {}
        return ndjson({**choice, "text": text, **self.logprobs(logprobs), "done": False})

    def stream_end(self, outcome: Outcome) -> str:
        if self.n > 1:
            return ndjson({**self.choices(outcome, True), "done": True, **self.counts(outcome, per_choice=True)})
        return ndjson(
            {"text": outcome.rest, **self.logprobs(outcome.rest_logprobs), "done": True, **self.counts(outcome)}
        )

    def error_body(self, error: RequestError) -> dict[str, Any]:
        return error.to_body()

    def stream_error(self, body: dict[str, Any]) -> str:
        return ndjson({**body, "done": True})


NATIVE_ANSWERS = NativeAnswers()


def parse_generation_request(
    body: Any, limits: GenerationLimits, tokenize: Callable[[str], list[int]], token_text: TokenText | None = None
) -> GenerationRequest:
    """Validate one (already JSON-decoded) body; ``tokenize`` turns the prompt into token ids; ``token_text`` shows
    tokens in log probabilities (None: their ids stand for them)."""
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
    logprobs = native_logprobs_option(body)
    n = integer(body, "n", 1, 1, limits.max_n, "handler.max_n")
    lookup = prompt_lookup(body, prompt)

    prompt_ids = prompt_tokens(tokenize(prompt), "'prompt'", limits)
    settings = SamplingSettings(
        max_new_tokens=new_tokens, temperature=temperature, top_k=top_k, seed=seed, logprobs=logprobs
    )
    return GenerationRequest(
        prompt_ids=prompt_ids,
        settings=settings,
        stream=stream,
        seed_reported=not settings.greedy,
        answers=NATIVE_ANSWERS if logprobs is None and n == 1 else NativeAnswers(token_text, n),
        lookup=lookup,
        n=n,
    )


def parse(body: Any, request: RequestView, served: Served) -> GenerationRequest:
    """The route's parser: one body as TorchServe handed it."""
    if body is None:
        raise RequestError("body must be a JSON object with a 'prompt' field, got null")
    body = json_body(body, request)
    generation = parse_generation_request(body, served.limits, served.tokenizer.encode, token_text(served.tokenizer))
    response_format = structured.checked_response_format(body, served)  # compiled for the served tokenizer
    if response_format is None:
        return generation
    lookup = structured.uncached_lookup(generation.lookup, response_format)
    return dataclasses.replace(generation, structured=response_format, lookup=lookup)


ROUTE = Route("", parse, NativeAnswers, api="native")
