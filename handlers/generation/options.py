"""The per-request options that ask for more than one text: log probabilities (each API spells them its own way) and
``n`` choices, checked into what :class:`handlers.generation.decoding.SamplingSettings` and
:class:`handlers.generation.requests.GenerationRequest` carry.

- chat completions: ``logprobs`` (true/false) and ``top_logprobs`` (0..20, only with ``logprobs`` true, as OpenAI);
- completions: ``logprobs`` (0..5 alternatives: OpenAI's legacy limit);
- the native API: ``logprobs`` (0..20 alternatives).

Each refusal names its field (:class:`FieldError`, OpenAI's ``param``).
"""

from __future__ import annotations

from typing import Any

from handlers.core.errors import shown
from handlers.generation.logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from handlers.generation.requests import FieldError, integer


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's ``logprobs`` / ``top_logprobs`` -> the alternatives per token (None: no log probabilities)."""
    wanted = body.get("logprobs", False)
    if not isinstance(wanted, bool):
        raise FieldError("logprobs", f"'logprobs' must be true or false, got {type(wanted).__name__} {shown(wanted)}")
    if "top_logprobs" in body and not wanted:
        raise FieldError("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    if not wanted:
        return None
    return integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


def completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions' ``logprobs`` (the alternatives per token; absent or null: none)."""
    if "logprobs" not in body:
        return None
    return integer(body, "logprobs", 0, 0, MAX_COMPLETION_LOGPROBS)


def native_logprobs(body: dict[str, Any]) -> int | None:
    """The native API's ``logprobs`` (the alternatives per token; absent: none)."""
    if "logprobs" not in body:
        return None
    return integer(body, "logprobs", 0, 0, MAX_TOP_LOGPROBS)
