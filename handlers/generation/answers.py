"""What a finished generation looks like to its client: one answer shape per API, one streaming mechanism.

Every accepted request carries the :class:`Answers` of the API it came through (chosen when it is parsed): the native
``{"prompt": ...}`` API (:class:`NativeAnswers`: one JSON object, or NDJSON lines when streamed) or OpenAI's
completions and chat completions (:mod:`handlers.generation.openai_api`: ``text_completion`` / ``chat.completion``
objects, or server-sent events). Decoding, stop sequences and the intermediate responses are the same for all of them
(``handlers/generator.py``, :mod:`handlers.generation.streaming`); only these methods differ:

- ``body(outcome)``: the JSON value of a non-streamed answer,
- ``piece(text)``: one intermediate stream chunk carrying new text,
- ``stream_end(outcome)``: the last chunk(s) of a stream (the text not sent yet, finish reason, counts),
- ``error_body(error)`` / ``stream_error(body)``: a refused or failed request's JSON value, and the chunk that closes
  a stream with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from handlers.core.errors import RequestError
from handlers.generation.streaming import STREAM_CONTENT_TYPE, ndjson


@dataclass(frozen=True)
class Outcome:
    """One finished generation, whatever API it is answered in."""

    text: str  # the whole answer (cut before a stop sequence)
    rest: str  # what its stream has not sent yet ('' when not streamed)
    finish_reason: str | None  # "length" or "stop" (None only for a sequence that never finished: a bug)
    prompt_tokens: int
    completion_tokens: int
    seed: int | None  # reported when sampling
    model: dict[str, str]  # {name, weights} (model_info.json)
    # Set when the answer came from the similarity cache: {"similarity", "age_s"} (docs/semantic-cache.md); every API's
    # answer (and a stream's last chunk) carries it as "cached".
    cached: dict[str, float] | None = None

    def marked(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` with the cache's mark when the answer came from the cache."""
        return value if self.cached is None else {**value, "cached": self.cached}


class Answers(Protocol):
    """How one API answers (see the module docstring); an instance may hold one request's ids and stream state."""

    stream_content_type: str
    # True: a stream that fails before its first chunk is answered as a plain JSON error with its own status (a client
    # of server-sent events reads the status first); False: its error is the stream's last line, as after chunks.
    plain_error_until_streamed: bool

    def body(self, outcome: Outcome) -> dict[str, Any]: ...

    def piece(self, text: str) -> str: ...

    def stream_end(self, outcome: Outcome) -> str: ...

    def error_body(self, error: RequestError) -> dict[str, Any]: ...

    def stream_error(self, body: dict[str, Any]) -> str: ...


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
