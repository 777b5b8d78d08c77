"""Generation requests: what a body may say, validated into a prompt's token ids and its sampling settings.

Accepted body (JSON object; docs/generation.md)::

    {"prompt": str, "max_new_tokens": int?, "temperature": number?, "top_k": int?, "seed": int?, "stream": bool?}

``temperature`` 0 (the default) is greedy decoding; above 0 the logits are divided by it and a token is drawn,
restricted to the ``top_k`` most likely ones when ``top_k`` > 0. ``seed`` makes a draw reproducible (without one a
random seed is chosen and returned in the answer). Every limit comes from the ``handler:`` config. Anything else
(unknown fields, wrong types, out-of-range values, an empty or over-long prompt) is refused with a message.

The checks of each setting are functions of this module, named by the field as the client spells it, so OpenAI's
bodies (:mod:`handlers.generation.openai_api`: ``max_tokens``, ``top_p``, ``stop``, chat ``messages``) are mapped onto
the same :class:`GenerationRequest` with the same limits. A refusal about one field is a :class:`FieldError` (a
:class:`RequestError` that names the field, which OpenAI's error shape reports as ``param``).
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from typing import Any

from handlers.core.errors import RequestError, shown, surrogate_at
from handlers.generation.answers import Answers
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.semantic_cache.options import REQUEST_FIELD, CacheRequest, PromptLookup, parse_cache_request
from handlers.generation.streaming import AnswerText

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit value; keep it a signed one for every client
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # per stop sequence: longer ones are refused, not searched for in every step's text


class FieldError(RequestError):
    """A refusal about one field of the body; ``field`` is its name as the client spelled it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class GenerationLimits:
    max_prompt_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    max_temperature: float
    vocab_size: int  # top_k can not exceed it
    max_prompt_chars: int  # longer prompts cannot fit max_prompt_tokens; refused before tokenizing
    positions: int | None = None  # the model's longest sequence (None: its config names none)
    max_n: int = 1  # choices one request may ask for (handler.max_n)
    auto: tuple[str, ...] = ()  # the token limits resolved from the model's positions (handler.<key>: auto)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    settings: SamplingSettings
    stream: bool
    seed_reported: bool  # sampling: the seed used goes back in the answer
    answers: Answers  # the dialect it came through (its route's answer writer): how its answer and stream are framed
    stop: tuple[str, ...] = ()  # the answer ends before the first of these (finish_reason "stop")
    # False: a streamed request's pieces all go in its final answer (one NDJSON line), none ahead of it. A gRPC
    # unary Predictions call must not get intermediate pieces: TorchServe 0.12 then fails the worker for good.
    send_pieces: bool = True
    # What the similarity cache compares and what must match exactly (None: the parser gave nothing to look up).
    lookup: PromptLookup | None = None
    # Its compiled response_format (handlers.generation.structured.CompiledFormat): each of its sequences (each
    # choice) decodes under a grammar state of its own. None: free text.
    structured: Any = None
    # Choices: n rows decoding one prompt (prefilled once), choice i sampling with seed + i (handlers/generation/
    # choices.py); counted as n rows of the batch's room.
    n: int = 1

    @property
    def reserve(self) -> int:
        """Tokens of the running batch's room one choice may take: prompt + max_new_tokens."""
        return len(self.prompt_ids) + self.settings.max_new_tokens


@dataclass(frozen=True)
class Served:
    """What every dialect's parser needs to know about the served model (handlers/generation/routes.py)."""

    model_name: str  # TorchServe's model name (in the URL): what answers report as "model"
    model_info: dict[str, str]  # {name, weights}: its name is accepted as "model" too; both go in system_fingerprint
    limits: GenerationLimits
    tokenizer: Any

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.model_name, self.model_info["name"])))


@dataclass(frozen=True)
class AcceptedGeneration:
    """A validated request and where it sits in TorchServe's batch (where its chunks and its answer go)."""

    idx: int
    request: GenerationRequest
    # Where the similarity cache looks it up (a SemanticQuery), why it does not (a reason), or None (no cache).
    cache: Any = None


@dataclass
class Generation:
    """One accepted request of a batch while it decodes: its tokens, its text pieces, what has been streamed."""

    idx: int  # its index in TorchServe's batch
    request: GenerationRequest
    sequence: Sequence
    text: AnswerText  # its text so far, cut at a stop sequence, and how much of it has been streamed
    logprobs_sent: int = 0  # tokens whose log probabilities went out in stream chunks
    choice: int = 0  # its index among its request's n choices


@dataclass(frozen=True)
class GenerationBatch:
    """What preprocess hands to inference, and inference (its generations decoded) to postprocess.

    ``generations`` are the requests to decode; requests answered from the similarity cache are in ``answered`` (by
    their position among the batch's accepted requests) and decode nothing; ``remember`` holds, by position among
    ``generations``, where a new answer goes in that cache (its group and prompt vector)."""

    generations: list[Generation]
    answered: dict[int, Any] = field(default_factory=dict)
    remember: dict[int, tuple[bytes, Any]] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.generations)


def start_generations(payloads: list[AcceptedGeneration], tokenizer: Any) -> GenerationBatch:
    """Each accepted request's decoding state, ready for :func:`handlers.generation.running.generate`: one generation
    per choice, a request's n choices one after the other, choice i seeded with :func:`choice_seed`."""
    return GenerationBatch(
        [
            Generation(
                idx=p.idx,
                request=p.request,
                sequence=Sequence(
                    p.request.prompt_ids,
                    choice_settings(p.request.settings, choice),
                    # a grammar state per choice: the choices' documents advance apart
                    constraint=p.request.structured.start() if p.request.structured is not None else None,
                ),
                text=AnswerText(tokenizer, p.request.prompt_ids, p.request.stop),
                choice=choice,
            )
            for p in payloads
            for choice in range(p.request.n)
        ]
    )


def choice_seed(seed: int, choice: int) -> int:
    """The seed of a request's choice ``choice``: seed + choice (wrapping past MAX_SEED), so choice 0 draws what the
    same request with n = 1 draws, and a seeded request with n > 1 is reproducible choice by choice."""
    return (seed + choice) % (MAX_SEED + 1)


def choice_settings(settings: SamplingSettings, choice: int) -> SamplingSettings:
    return settings if choice == 0 else dataclasses.replace(settings, seed=choice_seed(settings.seed, choice))


def integer(
    body: dict[str, Any], key: str, default: int, minimum: int, maximum: int, limit_key: str | None = None
) -> int:
    """``body[key]`` (``default`` when absent): an integer in [minimum, maximum]; ``limit_key`` names the config key
    the maximum comes from in the refusal."""
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(key, f"'{key}' must be an integer, got {type(value).__name__} {shown(value)}")
    if not minimum <= value <= maximum:
        source = f" ({limit_key})" if limit_key else ""
        raise FieldError(key, f"'{key}' is {shown(value)}; it must be between {minimum} and {maximum}{source}")
    return value


def max_new_tokens(body: dict[str, Any], key: str, limits: GenerationLimits) -> int:
    """How many tokens to generate at most, from ``body[key]`` (max_new_tokens, OpenAI's max_tokens)."""
    return integer(body, key, limits.default_max_new_tokens, 1, limits.max_new_tokens, "handler.max_new_tokens")


def checked_seed(body: dict[str, Any]) -> tuple[int, bool]:
    """(the seed, whether the client gave it): a random one when absent."""
    if "seed" in body:
        return integer(body, "seed", 0, 0, MAX_SEED), True
    return secrets.randbelow(MAX_SEED + 1), False


def cache_request(body: dict[str, Any]) -> CacheRequest:
    """The body's ``semantic_cache`` field, refused with its name (handlers.generation.semantic_cache.options)."""
    try:
        return parse_cache_request(body)
    except RequestError as error:
        raise FieldError(REQUEST_FIELD, error.message) from None


def prompt_lookup(body: dict[str, Any], prompt: str) -> PromptLookup:
    """A prompt's lookup (native API and OpenAI completions: the prompt is tokenized alike in both)."""
    return PromptLookup(prompt, "", "prompt", "seed" in body, cache_request(body))


def checked_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise FieldError("stream", f"'stream' must be true or false, got {type(stream).__name__}")
    return stream


def prompt_text(prompt: Any, name: str, limits: GenerationLimits) -> str:
    """A prompt (``name`` as shown in messages, e.g. "'prompt'"), refused before tokenizing when it is empty, not
    text, or too long to fit."""
    field = name.strip("'")
    if not isinstance(prompt, str):
        raise FieldError(field, f"{name} must be a string, got {type(prompt).__name__}")
    if not prompt:
        raise FieldError(field, f"{name} is empty")
    if len(prompt) > limits.max_prompt_chars:
        raise FieldError(
            field,
            f"{name} has {len(prompt)} characters; it cannot fit the limit of {limits.max_prompt_tokens} tokens "
            "(handler.max_prompt_tokens)",
        )
    surrogate = surrogate_at(prompt)
    if surrogate is not None:
        raise FieldError(field, f"{name} is not valid Unicode (unpaired surrogate at character {surrogate})")
    return prompt


def checked_prompt(body: dict[str, Any], limits: GenerationLimits) -> str:
    """The prompt, refused before tokenizing when it is missing, empty, not text, or too long to fit."""
    if "prompt" not in body:
        raise FieldError("prompt", "missing field 'prompt'")
    return prompt_text(body["prompt"], "'prompt'", limits)


def prompt_tokens(prompt_ids: list[int], name: str, limits: GenerationLimits) -> list[int]:
    """A tokenized prompt, refused when it has no tokens or more than handler.max_prompt_tokens."""
    field = name.strip("'")
    if not prompt_ids:
        raise FieldError(field, f"{name} has no tokens")
    if len(prompt_ids) > limits.max_prompt_tokens:
        raise FieldError(
            field,
            f"{name} has {len(prompt_ids)} tokens; at most {limits.max_prompt_tokens} are allowed "
            "(handler.max_prompt_tokens)",
        )
    return prompt_ids


def number(body: dict[str, Any], key: str, default: float) -> float | int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(key, f"'{key}' must be a number, got {type(value).__name__}")
    return value


def checked_temperature(body: dict[str, Any], max_temperature: float, default: float = 0.0) -> float:
    temperature = number(body, "temperature", default)
    # A range check alone also refuses nan and inf, and compares huge integers without converting them to float.
    if not 0 <= temperature <= max_temperature:
        raise FieldError(
            "temperature",
            f"'temperature' is {shown(temperature)}; it must be between 0 (greedy) and {max_temperature} "
            "(handler.max_temperature)",
        )
    return float(temperature)


def checked_top_p(body: dict[str, Any]) -> float:
    """Nucleus sampling's probability mass: 0 (the most likely token only) ... 1 (the whole distribution)."""
    top_p = number(body, "top_p", 1.0)
    if not 0 <= top_p <= 1:
        raise FieldError("top_p", f"'top_p' is {shown(top_p)}; it must be between 0 and 1")
    return float(top_p)


def checked_stop(body: dict[str, Any]) -> tuple[str, ...]:
    """Stop sequences: one string or a list of up to MAX_STOP_SEQUENCES, each 1..MAX_STOP_CHARS characters."""
    stop = body.get("stop", [])
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise FieldError("stop", f"'stop' must be a string or a list of strings, got {type(stop).__name__}")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise FieldError("stop", f"'stop' has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES} are allowed")
    for index, sequence in enumerate(stops):
        name = "'stop'" if isinstance(stop, str) else f"'stop[{index}]'"
        if not isinstance(sequence, str):
            raise FieldError("stop", f"{name} must be a string, got {type(sequence).__name__}")
        if not 1 <= len(sequence) <= MAX_STOP_CHARS:
            raise FieldError("stop", f"{name} has {len(sequence)} characters; it must have 1 to {MAX_STOP_CHARS}")
        if surrogate_at(sequence) is not None:
            raise FieldError("stop", f"{name} is not valid Unicode (unpaired surrogate)")
    return tuple(stops)
