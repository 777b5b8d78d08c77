"""OpenAI's completions and chat completions, mapped onto the generator's own requests and answers.

Served at ``/predictions/<model>/<version>/v1/completions`` and ``.../v1/chat/completions``, so that
``OpenAI(base_url="http://127.0.0.1:8080/predictions/generator/1.0/v1", api_key="unused")`` works unchanged
(docs/generation.md, section "OpenAI API"). A body is mapped onto :class:`GenerationRequest` with the checks of
:mod:`handlers.generation.requests` (the same limits as the native API, named by the OpenAI field):

- served: ``prompt`` (a string, or a list of one string) / ``messages`` (:mod:`handlers.generation.chat`),
  ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature`` (default 1; 0 to 2, as OpenAI), ``top_p``,
  ``seed``, ``stop``, ``n`` (1..``handler.max_n`` choices, :mod:`handlers.generation.choices`), ``stream``,
  ``stream_options.include_usage``, ``model`` (optional; when given it must name the served model, else 404
  ``model_not_found`` as OpenAI answers), ``logprobs`` (completions: 0..5 alternatives;
  chat: true/false with ``top_logprobs`` 0..20; :mod:`handlers.generation.options`, shapes in
  :mod:`handlers.generation.logprobs`), ``response_format`` (JSON mode and JSON schemas, on completions too as vLLM:
  :mod:`handlers.generation.structured`), chat's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
  (:mod:`handlers.generation.tools`);
- ignored, because they cannot change the answer: ``user`` (chat also ``metadata``, ``store``, ``service_tier``,
  ``safety_identifier``, ``prompt_cache_*``), ``stream_options.include_obfuscation``;
- refused with a 400 naming the field unless they have their neutral value: the fields in :data:`NEUTRAL` (echo,
  best_of, penalties, logit_bias, suffix, functions, ...): we cannot honour them, and ignoring them would answer
  something else than what was asked;
- anything else is an unknown field (400), as OpenAI answers. ``null`` means "not given" for every field but
  ``prompt`` and ``messages``.

Refusals are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``,
:meth:`RequestError.to_openai_body`); answers are ``text_completion`` / ``chat.completion`` objects, and streams are
server-sent events (``data: {chunk}``), the last content chunk carrying ``finish_reason``, then a usage chunk when
``stream_options.include_usage`` is true, then ``data: [DONE]``.

This dialect's rows of the generator's route table are :data:`COMPLETIONS` and :data:`CHAT`
(handlers/generation/routes.py): the parsers raise the shared checks' refusals, which take the rows' OpenAI shape.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from handlers.core.errors import OPENAI, RequestError, ShapedError, shown
from handlers.core.http import RequestView, json_body
from handlers.core.routes import Route
from handlers.generation import chat, options, structured, tools
from handlers.generation.answers import Outcome
from handlers.generation.decoding import SamplingSettings
from handlers.generation.logprobs import TokenLogprob, TokenText, chat_logprobs, completion_logprobs, token_text
from handlers.generation.requests import (
    FieldError,
    GenerationLimits,
    GenerationRequest,
    Served,
    cache_request,
    checked_seed,
    checked_stop,
    checked_stream,
    checked_temperature,
    checked_top_p,
    integer,
    max_new_tokens,
    number,
    prompt_lookup,
    prompt_text,
    prompt_tokens,
)
from handlers.generation.semantic_cache.options import REQUEST_FIELD
from handlers.generation.streaming import SSE_CONTENT_TYPE, SSE_DONE, sse

COMPLETIONS_ROUTE = "v1/completions"
CHAT_ROUTE = "v1/chat/completions"
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: sampling (the native API's default is greedy)
# OpenAI's bounds on temperature (its API refuses others, and a client written against it expects the same here);
# the native API keeps its own documented limit, handler.max_temperature.
OPENAI_TEMPERATURE = (0.0, 2.0)

# semantic_cache: the similarity cache's per-request option (docs/semantic-cache.md), sent in the client's extra_body.
SAMPLING_FIELDS = (
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    REQUEST_FIELD,
    structured.FIELD,  # JSON mode and schemas (handlers/generation/structured.py); vLLM takes it on completions too
)
COMPLETION_FIELDS = ("prompt", "logprobs", *SAMPLING_FIELDS)
CHAT_FIELDS = (
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    tools.FIELD,  # tools, tool_choice, parallel_tool_calls: handlers/generation/tools.py
    tools.CHOICE_FIELD,
    tools.PARALLEL_FIELD,
    *SAMPLING_FIELDS,
)
COMPLETION_IGNORED = ("user",)
CHAT_IGNORED = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
)


def number_is(expected: float) -> Callable[[Any], bool]:
    return lambda value: not isinstance(value, bool) and isinstance(value, (int, float)) and value == expected


def is_value(expected: Any) -> Callable[[Any], bool]:
    return lambda value: type(value) is type(expected) and value == expected


# Fields we cannot honour: accepted only with the value that changes nothing (shown in the refusal), else 400.
Neutral = dict[str, tuple[Callable[[Any], bool], str]]
NEVER: tuple[Callable[[Any], bool], str] = (lambda value: False, "null")
COMMON_NEUTRAL: Neutral = {
    "frequency_penalty": (number_is(0), "0"),
    "presence_penalty": (number_is(0), "0"),
    "logit_bias": (is_value({}), "{} or null"),
}
COMPLETION_NEUTRAL: Neutral = {
    **COMMON_NEUTRAL,
    "echo": (is_value(False), "false or null"),
    "best_of": (number_is(1), "1 or null"),
    "suffix": (is_value(""), '"" or null'),
}
CHAT_NEUTRAL: Neutral = {
    **COMMON_NEUTRAL,
    "functions": (is_value([]), "[] or null"),
    "function_call": (is_value("none"), '"none" or null'),
    "modalities": (is_value(["text"]), '["text"] or null'),
    "audio": NEVER,
    "prediction": NEVER,
    "reasoning_effort": NEVER,
    "verbosity": NEVER,
    "web_search_options": NEVER,
    "moderation": NEVER,
}
OTHER_ROUTE_HINTS = {
    "messages": f" (chat messages go to {CHAT_ROUTE})",
    "prompt": f" (a prompt goes to {COMPLETIONS_ROUTE})",
}
NEUTRAL = {**COMPLETION_NEUTRAL, **CHAT_NEUTRAL}  # every field refused unless neutral, for the docs and tests


# A refusal in OpenAI's error shape, with the field it is about as ``param``: the one shaped-error helper of every
# OpenAI-, Cohere- and TEI-compatible route (handlers/core/errors.py).
OpenAIError = ShapedError


# ------------------------------------------------------------------------------------------------------ parsing
def given(body: Any, required: str) -> dict[str, Any]:
    """The body's fields that were given: ``null`` means not given (OpenAI's optional fields are nullable), except
    for the required one (prompt or messages), whose null is refused by its own check."""
    if not isinstance(body, dict):
        raise OpenAIError(f"body must be a JSON object with a '{required}' field, got {type(body).__name__}")
    return {key: value for key, value in body.items() if value is not None or key == required}


def check_fields(body: dict[str, Any], served: tuple[str, ...], ignored: tuple[str, ...], neutral: Neutral) -> None:
    """Refuse unknown fields, and fields we cannot honour unless their value is neutral."""
    unknown = sorted(set(body) - set(served) - set(ignored) - set(neutral))
    if unknown:
        hint = OTHER_ROUTE_HINTS.get(unknown[0], "")
        message = f"unknown field(s) {unknown}{hint}; the fields served are {sorted(served)}"
        raise OpenAIError(message[:500], param=unknown[0])
    for key, (is_neutral, accepted) in neutral.items():
        if key in body and not is_neutral(body[key]):
            raise OpenAIError(
                f"'{key}' is {shown(body[key])}; this server cannot honour it (accepted: {accepted}, or leave it out)",
                param=key,
            )


def check_model(body: dict[str, Any], served: Served) -> str:
    """The model name the answer reports: the one asked for, which must be the served model (else 404, as OpenAI)."""
    if "model" not in body:
        return served.model_name
    model = body["model"]
    if model not in served.names:
        raise OpenAIError(
            f"the model {shown(model)} is not served here; this URL serves {list(served.names)}",
            code=404,
            param="model",
            error_type="ModelNotFound",
        )
    return str(model)


def check_n(body: dict[str, Any], limits: GenerationLimits) -> int:
    """Choices per request: 1..handler.max_n (whether their rows fit the batch's room is the handler's check)."""
    return integer(body, "n", 1, 1, limits.max_n, "handler.max_n")


def include_usage(body: dict[str, Any], stream: bool) -> bool:
    """stream_options: only with stream true (as OpenAI); include_usage adds a usage chunk before [DONE]."""
    if "stream_options" not in body:
        return False
    options = body["stream_options"]
    if not stream:
        raise FieldError("stream_options", "'stream_options' is only allowed when 'stream' is true")
    if not isinstance(options, dict):
        raise FieldError("stream_options", f"'stream_options' must be an object, got {type(options).__name__}")
    unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise FieldError("stream_options", f"unknown 'stream_options' field(s) {unknown}"[:300])
    for key in ("include_usage", "include_obfuscation"):
        if options.get(key) is not None and not isinstance(options[key], bool):
            raise FieldError("stream_options", f"'stream_options.{key}' must be true or false")
    return bool(options.get("include_usage"))


def sampling(
    body: dict[str, Any], served: Served, tokens_key: str, logprobs: int | None
) -> tuple[SamplingSettings, tuple[str, ...]]:
    limits = served.limits
    settings = SamplingSettings(
        max_new_tokens=max_new_tokens(body, tokens_key, limits),
        temperature=openai_temperature(body, limits),
        top_p=checked_top_p(body),
        seed=checked_seed(body)[0],
        logprobs=logprobs,
    )
    return settings, checked_stop(body)


def openai_temperature(body: dict[str, Any], limits: GenerationLimits) -> float:
    """``temperature`` within OpenAI's bounds, refused as OpenAI refuses it (``decimal_above_max_value`` /
    ``decimal_below_min_value``), then within the model's own ``handler.max_temperature`` where that is lower."""
    default = min(DEFAULT_TEMPERATURE, limits.max_temperature)
    value = number(body, "temperature", default)
    low, high = OPENAI_TEMPERATURE
    if value > high:
        raise OpenAIError(
            f"Invalid 'temperature': decimal above maximum value. Expected a value <= {high:g}, but got "
            f"{shown(value)} instead.",
            param="temperature",
            error_type="DecimalAboveMaxValue",
        )
    if not value >= low:  # also nan
        raise OpenAIError(
            f"Invalid 'temperature': decimal below minimum value. Expected a value >= {low:g}, but got "
            f"{shown(value)} instead.",
            param="temperature",
            error_type="DecimalBelowMinValue",
        )
    return checked_temperature(body, limits.max_temperature, default)


def completion_prompt(body: dict[str, Any], limits: GenerationLimits) -> str:
    """``prompt``: a string, or a list of exactly one string; token ids and several prompts are refused."""
    if "prompt" not in body:
        raise FieldError("prompt", "missing field 'prompt'")
    prompt = body["prompt"]
    if isinstance(prompt, list):
        if any(isinstance(item, int) or isinstance(item, list) for item in prompt):
            raise FieldError("prompt", "'prompt' as token ids is not served; send the prompt as text")
        if len(prompt) != 1:
            raise FieldError("prompt", f"'prompt' has {len(prompt)} prompts; send one per request")
        return prompt_text(prompt[0], "'prompt[0]'", limits)
    return prompt_text(prompt, "'prompt'", limits)


def parse_completion(body: Any, served: Served) -> GenerationRequest:
    """``POST .../v1/completions``."""
    body = given(body, "prompt")
    check_fields(body, COMPLETION_FIELDS, COMPLETION_IGNORED, COMPLETION_NEUTRAL)
    model = check_model(body, served)
    prompt = completion_prompt(body, served.limits)
    settings, stop = sampling(body, served, "max_tokens", options.completion_logprobs(body))
    n = check_n(body, served.limits)
    stream = checked_stream(body)
    response_format = structured.checked_response_format(body, served)
    lookup = structured.uncached_lookup(prompt_lookup(body, prompt), response_format)
    answers = CompletionAnswers(
        f"cmpl-{secrets.token_hex(12)}",
        int(time.time()),
        model,
        fingerprint(served),
        include_usage(body, stream),
        settings.logprobs,
        token_text(served.tokenizer),
    )
    prompt_ids = prompt_tokens(served.tokenizer.encode(prompt), "'prompt'", served.limits)
    return GenerationRequest(
        prompt_ids,
        settings,
        stream,
        seed_reported=False,
        stop=stop,
        answers=answers,
        lookup=lookup,
        structured=response_format,
        n=n,
    )


def chat_tokens_key(body: dict[str, Any]) -> str:
    """max_completion_tokens (OpenAI's current name) or max_tokens (deprecated for chat); both only if equal."""
    if "max_completion_tokens" in body and "max_tokens" in body:
        if body["max_completion_tokens"] != body["max_tokens"]:
            raise FieldError("max_tokens", "give one of 'max_completion_tokens' and 'max_tokens', not both")
    return "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"


def parse_chat(body: Any, served: Served) -> GenerationRequest:
    """``POST .../v1/chat/completions``."""
    body = given(body, "messages")
    check_fields(body, CHAT_FIELDS, CHAT_IGNORED, CHAT_NEUTRAL)
    model = check_model(body, served)
    if "messages" not in body:
        raise FieldError("messages", "missing field 'messages'")
    messages = chat.checked_messages(body["messages"], served.limits)
    settings, stop = sampling(body, served, chat_tokens_key(body), options.chat_logprobs(body))
    n = check_n(body, served.limits)
    stream = checked_stream(body)
    calling, output_format = tools.checked_tools(body, served, structured.checked_response_format(body, served))
    lookup = chat.chat_lookup(messages, "seed" in body, cache_request(body))
    if calling is not None:  # the cache compares messages, not tools: an answer without them is not this one's
        lookup = replace(lookup, text=None, skip=tools.FIELD)
    else:
        lookup = structured.uncached_lookup(lookup, output_format)
    answers = ChatAnswers(
        f"chatcmpl-{secrets.token_hex(12)}",
        int(time.time()),
        model,
        fingerprint(served),
        include_usage(body, stream),
        settings.logprobs,
        token_text(served.tokenizer),
        calls=calling is not None and calling.constrained,
    )
    specs = calling.specs if calling is not None else None
    prompt_ids = chat.chat_prompt_ids(messages, served.tokenizer, served.limits, specs)
    return GenerationRequest(
        prompt_ids,
        settings,
        stream,
        seed_reported=False,
        stop=stop,
        answers=answers,
        lookup=lookup,
        structured=output_format,
        n=n,
    )


def fingerprint(served: Served) -> str:
    """system_fingerprint: which model answers and where its weights come from (the demo's are random)."""
    return f"{served.model_info['name']}; weights: {served.model_info['weights']}"


# ------------------------------------------------------------------------------------------------------ answers
def usage(outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


@dataclass
class OpenAIAnswers:
    """What the two OpenAI shapes share: one request's id, creation time and model, SSE framing, error shape."""

    id: str
    created: int
    model: str
    system_fingerprint: str
    include_usage: bool = False
    top_logprobs: int | None = None  # None: the request did not ask for log probabilities
    token_text: TokenText | None = None  # the tokens' text and bytes in the logprobs shapes
    # A stream's state per choice: characters of token text sent (completions' text_offset), role sent (chat).
    text_offsets: dict[int, int] = field(default_factory=dict)
    role_sent: set[int] = field(default_factory=set)

    stream_content_type = SSE_CONTENT_TYPE
    plain_error_until_streamed = True
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
        }

    def choice(
        self,
        text: str,
        finish_reason: str | None,
        streamed: bool,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        index: int = 0,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def body(self, outcome: Outcome) -> dict[str, Any]:
        choices = [
            self.choice(choice.text, choice.finish_reason, False, choice.logprobs, index)
            for index, choice in enumerate(outcome.each())
        ]
        return outcome.marked({**self.envelope(self.object_name), "choices": choices, "usage": usage(outcome)})

    def chunk(self, choices: list[dict[str, Any]], outcome: Outcome | None = None) -> str:
        chunk = {**self.envelope(self.chunk_object_name), "choices": choices}
        if self.include_usage:  # as OpenAI: null in every chunk but the last, which has no choices
            chunk["usage"] = usage(outcome) if outcome is not None and not choices else None
        return sse(outcome.marked(chunk) if outcome is not None else chunk)

    def piece(self, text: str, logprobs: tuple[TokenLogprob, ...] | None = None, index: int = 0) -> str:
        return self.chunk([self.choice(text, None, True, logprobs, index)])

    def stream_end(self, outcome: Outcome) -> str:
        # One last chunk per choice (its text not sent yet and its finish reason), then usage, then [DONE].
        last = "".join(
            self.chunk([self.choice(choice.rest, choice.finish_reason, True, choice.rest_logprobs, index)], outcome)
            for index, choice in enumerate(outcome.each())
        )
        usage_chunk = self.chunk([], outcome) if self.include_usage else ""
        return last + usage_chunk + SSE_DONE

    def error_body(self, error: RequestError) -> dict[str, Any]:
        return error.to_openai_body()

    def stream_error(self, body: dict[str, Any]) -> str:
        # The openai client raises APIError on an event whose data has "error" (the status was 200 already).
        return sse(body) + SSE_DONE


class CompletionAnswers(OpenAIAnswers):
    """``text_completion`` objects, streamed as ``text_completion`` chunks."""

    def choice(
        self,
        text: str,
        finish_reason: str | None,
        streamed: bool,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        index: int = 0,
    ) -> dict[str, Any]:
        shown = None
        if logprobs is not None and self.top_logprobs is not None and self.token_text is not None:
            offset = self.text_offsets.get(index, 0) if streamed else 0
            shown = completion_logprobs(list(logprobs), self.top_logprobs, self.token_text, offset)
            if streamed:
                self.text_offsets[index] = offset + sum(len(token) for token in shown["tokens"])
        return {"text": text, "index": index, "logprobs": shown, "finish_reason": finish_reason}


@dataclass
class ChatAnswers(OpenAIAnswers):
    """``chat.completion`` objects, streamed as ``chat.completion.chunk`` deltas (each choice's first one carries the
    role). With ``calls`` (tools whose tool_choice constrains the answer) each choice's text is read back into
    ``tool_calls`` (:class:`handlers.generation.tools.ToolCallReader`; streamed: one ``delta.tool_calls`` entry per
    call once it is complete)."""

    calls: bool = False
    readers: dict[int, tools.ToolCallReader] = field(default_factory=dict)

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def choice(
        self,
        text: str,
        finish_reason: str | None,
        streamed: bool,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        index: int = 0,
    ) -> dict[str, Any]:
        shown = None
        if logprobs is not None and self.top_logprobs is not None and self.token_text is not None:
            shown = chat_logprobs(list(logprobs), self.top_logprobs, self.token_text)
        calls: list[dict[str, Any]] = []
        first_call = 0
        if self.calls:
            reader = self.readers.setdefault(index, tools.ToolCallReader()) if streamed else tools.ToolCallReader()
            first_call = reader.calls
            text, calls = reader.feed(text)
            if finish_reason is not None:
                text += reader.finish()
            if reader.calls and finish_reason == "stop":
                finish_reason = "tool_calls"  # as OpenAI: the answer ended with its calls
        if not streamed:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["content"], message["tool_calls"] = text or None, calls
            return {"index": index, "message": message, "logprobs": shown, "finish_reason": finish_reason}
        delta: dict[str, Any] = {} if index in self.role_sent else {"role": "assistant"}
        if text or index not in self.role_sent:
            delta["content"] = text if text or not self.calls else None
        if calls:
            delta["tool_calls"] = [{"index": first_call + number, **call} for number, call in enumerate(calls)]
        self.role_sent.add(index)
        return {"index": index, "delta": delta, "logprobs": shown, "finish_reason": finish_reason}


# ------------------------------------------------------------------------------------------------------ routes
def route_parser(parse: Callable[[Any, Served], GenerationRequest]) -> Callable[..., GenerationRequest]:
    """A route's parser: the body as TorchServe handed it (raw bytes or text are read as JSON here, so that invalid
    JSON is refused in OpenAI's shape too; a null body goes to ``parse``, which names what it expected)."""

    def parse_route(body: Any, request: RequestView, served: Served) -> GenerationRequest:
        return parse(None if body is None else json_body(body, request), served)

    return parse_route


COMPLETIONS = Route(
    COMPLETIONS_ROUTE, route_parser(parse_completion), CompletionAnswers, OPENAI, api="OpenAI completions"
)
CHAT = Route(CHAT_ROUTE, route_parser(parse_chat), ChatAnswers, OPENAI, api="OpenAI chat completions")
