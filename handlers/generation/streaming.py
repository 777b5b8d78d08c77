"""Text pieces as tokens arrive, stop sequences, and sending pieces as TorchServe intermediate responses (HTTP chunks).

:class:`IncrementalText` turns a growing list of token ids into text pieces. Decoding one token alone is wrong for
most tokenizers (a byte-level BPE token can be half of a UTF-8 character; SentencePiece and WordPiece choose spaces
from the neighbouring tokens), so each step decodes a short window of recent tokens and emits only what it adds to
the window's previous text, holding back a piece that ends in an incomplete character.

:class:`AnswerText` is one answer's text on top of it: cut before the first stop sequence (OpenAI's ``stop``), and
what a stream may send yet (the end of the text that could still become a stop sequence is held back). The
non-streamed answer is the same text, so a client that concatenates the streamed pieces gets exactly the non-streamed
text.

:func:`send_chunks` sends one intermediate response that carries a piece for some requests of the batch only (the
streaming ones). TorchServe's frontend keeps a request's HTTP response open while its chunks carry
``ts_stream_next: true``; the handler's normal return value then closes every streamed response with its last chunk.
How a piece is framed on the wire (an NDJSON line, a server-sent event) is the request's API's choice
(:mod:`handlers.generation.answers`); :func:`ndjson` and :func:`sse` are the two framings.

Per-step scheduling (``continuousBatching``) answers each TorchServe call with the streams' new text. When one call
runs several decoding steps (``handler.decode_call_ms``), each step's pieces but the last go out as they come, as
intermediate responses marked :data:`STEP_PIECES`: only the project's patched frontend (``scripts/frontend_fixes``)
reads those as pieces of a call still running; TorchServe 0.12 as released would take the first one for the call's
answer. :func:`frontend_takes_step_pieces` says whether the installed frontend is the patched one; without it the
steps' text goes out together with the call's answer.
"""

from __future__ import annotations

from typing import Any

from handlers.core.http import to_json

# Tokens of context decoded before the newest ones: enough for the tokenizer to place spaces the way it would in the
# whole text (TGI and vLLM use the same small window).
CONTEXT_TOKENS = 5
INCOMPLETE_CHARACTER = "\ufffd"  # what a decoder yields for a cut UTF-8 sequence


class IncrementalText:
    """Text pieces of a generation, given its token ids one at a time."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # window start: context decoded only to know where the new text begins
        self.read_offset = len(self.token_ids)  # tokens up to here have been emitted as text
        self.pieces: list[str] = []

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes ('' while a character or word is incomplete)."""
        self.token_ids.append(token_id)
        known = self.decode(self.token_ids[self.prefix_offset : self.read_offset])
        extended = self.decode(self.token_ids[self.prefix_offset :])
        if len(extended) <= len(known) or extended.endswith(INCOMPLETE_CHARACTER) or not extended.startswith(known):
            return ""
        piece = extended[len(known) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.pieces.append(piece)
        return piece

    def finish(self) -> str:
        """The text still held back when generation ends (an incomplete character goes out as the decoder shows it)."""
        known = self.decode(self.token_ids[self.prefix_offset : self.read_offset])
        extended = self.decode(self.token_ids[self.prefix_offset :])
        piece = extended[len(known) :] if extended.startswith(known) else ""
        self.read_offset = len(self.token_ids)
        self.pieces.append(piece)
        return piece

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class AnswerText:
    """One answer's text as its tokens arrive: cut before the first of its stop sequences, streamed in pieces.

    ``text`` is the answer so far; once a stop sequence appears, ``stopped`` is set and ``text`` ends just before it
    (the stop sequence itself is not part of the answer). :meth:`take` returns what a stream may send now: new text,
    less the end that could still grow into a stop sequence (at most the longest stop sequence minus one character)."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: tuple[str, ...] = ()) -> None:
        self.incremental = IncrementalText(tokenizer, prompt_ids)
        self.stop = tuple(s for s in stop if s)
        self.longest_stop = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.stopped = False
        self.sent = 0  # characters of text already streamed

    def push(self, token_id: int) -> None:
        """Add one generated token (nothing changes once a stop sequence was found)."""
        if not self.stopped:
            self.extend(self.incremental.push(token_id))

    def finish(self) -> None:
        """Generation ended: add the text the decoder still held back (an incomplete character, as it shows it)."""
        if not self.stopped:
            self.extend(self.incremental.finish())

    def extend(self, piece: str) -> None:
        if not piece:
            return
        # A stop sequence not found before must end inside the new piece: search only where it could start.
        start = max(0, len(self.text) - self.longest_stop + 1)
        self.text += piece
        found = [at for at in (self.text.find(s, start) for s in self.stop) if at >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True

    def held_back(self) -> int:
        """How many final characters could still be the start of a stop sequence (0 once stopped or without stops)."""
        if self.stopped:
            return 0
        for length in range(min(self.longest_stop - 1, len(self.text) - self.sent), 0, -1):
            end = self.text[-length:]
            if any(s.startswith(end) for s in self.stop):
                return length
        return 0

    def take(self) -> str:
        """The text a stream may send now (possibly ''); it counts as sent."""
        end = len(self.text) - self.held_back()
        piece = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return piece

    def rest(self) -> str:
        """Everything not streamed yet (the last chunk's text, after :meth:`finish`)."""
        piece = self.text[self.sent :]
        self.sent = len(self.text)
        return piece


def ndjson(obj: Any) -> str:
    """One line of newline-delimited JSON (strict, compact: the base's serializer): chunk boundaries on the wire
    need not match lines, newlines do."""
    return to_json(obj) + "\n"


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as strict, compact JSON (no newline inside: one data line)."""
    return f"data: {to_json(obj)}\n\n"


STREAM_CONTENT_TYPE = "application/x-ndjson"
SSE_CONTENT_TYPE = "text/event-stream"
SSE_DONE = "data: [DONE]\n\n"  # OpenAI's end of a stream


STEP_PIECES = "serving-fixes: step pieces"  # scripts/frontend_fixes/FrontendFixes.java's STEP_PIECES
INTERMEDIATE = "Intermediate response"  # TorchServe's own: whole-batch streaming
STEP_PIECES_FIX = "sendResponse -> sendResponse"  # the patched frontend's marker lists this fix


def send_chunks(context: Any, chunks: dict[int, str], message: str = INTERMEDIATE) -> None:
    """Send {batch index: text} as one intermediate response to those requests only; the others get nothing yet.

    Each request's content type (NDJSON or server-sent events) is set on the context before (the handler does).
    ``message``: :data:`STEP_PIECES` for a per-step call's pieces sent before its answer."""
    from ts.handler_utils.utils import send_intermediate_predict_response

    request_ids = {idx: context.request_ids[idx] for idx in chunks}
    send_intermediate_predict_response(chunks, request_ids, message, 200, context)


def frontend_takes_step_pieces() -> bool:
    """Whether the installed TorchServe frontend carries the project's fix that reads :data:`STEP_PIECES` messages
    (its jar's fixes marker lists it: ``make install`` patches it)."""
    from handlers.core.frontend_jar import installed_fixes

    return any(fix.endswith(STEP_PIECES_FIX) for fix in installed_fixes())
