"""Generation requests: what a body may say, validated into a prompt's token ids and its sampling settings.

Accepted body (JSON object; docs/generation.md)::

    {"prompt": str, "max_new_tokens": int?, "temperature": number?, "top_k": int?, "seed": int?, "stream": bool?}

``temperature`` 0 (the default) is greedy decoding; above 0 the logits are divided by it and a token is drawn,
restricted to the ``top_k`` most likely ones when ``top_k`` > 0. ``seed`` makes a draw reproducible (without one a
random seed is chosen and returned in the answer). Every limit comes from the ``handler:`` config. Anything else
(unknown fields, wrong types, out-of-range values, an empty or over-long prompt) is refused with a message.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, shown
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.streaming import IncrementalText

FIELDS = ("prompt", "max_new_tokens", "temperature", "top_k", "seed", "stream")
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit value; keep it a signed one for every client


@dataclass(frozen=True)
class GenerationLimits:
    max_prompt_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    max_temperature: float
    vocab_size: int  # top_k can not exceed it
    max_prompt_chars: int  # longer prompts cannot fit max_prompt_tokens; refused before tokenizing
    positions: int | None = None  # the model's longest sequence (None: its config names none)
    auto: tuple[str, ...] = ()  # the token limits resolved from the model's positions (handler.<key>: auto)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    settings: SamplingSettings
    stream: bool
    seed_reported: bool  # sampling: the seed used goes back in the answer


@dataclass(frozen=True)
class AcceptedGeneration:
    """A validated request and where it sits in TorchServe's batch (where its chunks and its answer go)."""

    idx: int
    request: GenerationRequest


@dataclass
class Generation:
    """One accepted request of a batch while it decodes: its tokens, its text pieces, what has been streamed."""

    idx: int  # its index in TorchServe's batch
    request: GenerationRequest
    sequence: Sequence
    text: IncrementalText
    pieces_sent: int = 0  # how many of text.pieces have gone out as intermediate chunks


@dataclass(frozen=True)
class GenerationBatch:
    """What preprocess hands to inference, and inference (its generations decoded) to postprocess."""

    generations: list[Generation]

    @property
    def rows(self) -> int:
        return len(self.generations)


def start_generations(payloads: list[AcceptedGeneration], tokenizer: Any) -> GenerationBatch:
    """Each accepted request's decoding state, ready for :func:`handlers.generation.decoding.generate`."""
    return GenerationBatch(
        [
            Generation(
                idx=p.idx,
                request=p.request,
                sequence=Sequence(p.request.prompt_ids, p.request.settings),
                text=IncrementalText(tokenizer, p.request.prompt_ids),
            )
            for p in payloads
        ]
    )


def integer(body: dict[str, Any], key: str, default: int, minimum: int, maximum: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{key}' must be an integer, got {type(value).__name__} {shown(value)}")
    if not minimum <= value <= maximum:
        raise RequestError(f"'{key}' is {shown(value)}; it must be between {minimum} and {maximum}")
    return value


def checked_prompt(body: dict[str, Any], limits: GenerationLimits) -> str:
    """The prompt, refused before tokenizing when it is missing, empty, not text, or too long to fit."""
    if "prompt" not in body:
        raise RequestError("missing field 'prompt'")
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise RequestError(f"'prompt' must be a string, got {type(prompt).__name__}")
    if not prompt:
        raise RequestError("'prompt' is empty")
    if len(prompt) > limits.max_prompt_chars:
        raise RequestError(
            f"'prompt' has {len(prompt)} characters; it cannot fit the limit of {limits.max_prompt_tokens} tokens "
            "(handler.max_prompt_tokens)"
        )
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:  # JSON "\ud800" parses to a lone surrogate the tokenizer cannot take
        raise RequestError(f"'prompt' is not valid Unicode (unpaired surrogate at character {error.start})") from None
    return prompt


def checked_temperature(body: dict[str, Any], max_temperature: float) -> float:
    temperature = body.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise RequestError(f"'temperature' must be a number, got {type(temperature).__name__}")
    # A range check alone also refuses nan and inf, and compares huge integers without converting them to float.
    if not 0 <= temperature <= max_temperature:
        raise RequestError(
            f"'temperature' is {shown(temperature)}; it must be between 0 (greedy) and {max_temperature}"
        )
    return float(temperature)


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

    max_new_tokens = integer(body, "max_new_tokens", limits.default_max_new_tokens, 1, limits.max_new_tokens)
    temperature = checked_temperature(body, limits.max_temperature)
    top_k = integer(body, "top_k", 0, 0, limits.vocab_size)
    seed_given = "seed" in body
    seed = integer(body, "seed", 0, 0, MAX_SEED) if seed_given else secrets.randbelow(MAX_SEED + 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false, got {type(stream).__name__}")

    prompt_ids = tokenize(prompt)
    if not prompt_ids:
        raise RequestError("'prompt' has no tokens")
    if len(prompt_ids) > limits.max_prompt_tokens:
        raise RequestError(
            f"'prompt' has {len(prompt_ids)} tokens; at most {limits.max_prompt_tokens} are allowed "
            "(handler.max_prompt_tokens)"
        )
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=top_k, seed=seed)
    return GenerationRequest(prompt_ids=prompt_ids, settings=settings, stream=stream, seed_reported=not settings.greedy)
