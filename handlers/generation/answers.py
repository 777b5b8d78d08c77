"""What a finished generation looks like to its client: one answer shape per API, one streaming mechanism.

Every accepted request carries the :class:`Answers` of the API it came through (its route's answer writer, made when
it is parsed: :mod:`handlers.generation.routes`): the native ``{"prompt": ...}`` API
(:class:`handlers.generation.native.NativeAnswers`: one JSON object, or NDJSON lines when streamed) or OpenAI's
completions and chat completions (:mod:`handlers.generation.openai_api`: ``text_completion`` / ``chat.completion``
objects, or server-sent events). Decoding, stop sequences and the intermediate responses are the same for all of them
(:mod:`handlers.generation.loop`, :mod:`handlers.generation.streaming`); only these methods differ:

- ``body(outcome)``: the JSON value of a non-streamed answer,
- ``piece(text, logprobs, index)``: one intermediate stream chunk carrying new text of choice ``index`` (and, when
  the request asked, the log probabilities of the tokens since the last chunk),
- ``stream_end(outcome)``: the last chunk(s) of a stream (the text not sent yet, finish reason, counts),
- ``error_body(error)`` / ``stream_error(body)``: a refused or failed request's JSON value, and the chunk that closes
  a stream with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from handlers.core.errors import RequestError
from handlers.generation.logprobs import TokenLogprob


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
    # The generated tokens' log probabilities when the request asked (handlers/generation/logprobs.py), and those its
    # stream has not sent yet (the last chunk's).
    logprobs: tuple[TokenLogprob, ...] | None = None
    rest_logprobs: tuple[TokenLogprob, ...] | None = None
    # n > 1: each choice's own outcome, in choice order (this one is choice 0's with completion_tokens of them all)
    choices: tuple[Outcome, ...] = ()

    def each(self) -> tuple[Outcome, ...]:
        """The outcome of every choice (one without n > 1)."""
        return self.choices or (self,)

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

    def piece(self, text: str, logprobs: tuple[TokenLogprob, ...] | None = None, index: int = 0) -> str: ...

    def stream_end(self, outcome: Outcome) -> str: ...

    def error_body(self, error: RequestError) -> dict[str, Any]: ...

    def stream_error(self, body: dict[str, Any]) -> str: ...
