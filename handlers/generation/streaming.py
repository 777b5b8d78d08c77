"""Text pieces as tokens arrive, and sending them as TorchServe intermediate responses (HTTP chunks).

:class:`IncrementalText` turns a growing list of token ids into text pieces. Decoding one token alone is wrong for
most tokenizers (a byte-level BPE token can be half of a UTF-8 character; SentencePiece and WordPiece choose spaces
from the neighbouring tokens), so each step decodes a short window of recent tokens and emits only what it adds to
the window's previous text, holding back a piece that ends in an incomplete character. The non-streamed answer is
built from the same pieces, so a client that concatenates the streamed pieces gets exactly the non-streamed text.

:func:`send_chunks` sends one intermediate response that carries a piece for some requests of the batch only (the
streaming ones). TorchServe's frontend keeps a request's HTTP response open while its chunks carry
``ts_stream_next: true``; the handler's normal return value then closes every streamed response with its last chunk.
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


def ndjson(obj: Any) -> str:
    """One line of newline-delimited JSON (strict, compact: the base's serializer): chunk boundaries on the wire
    need not match lines, newlines do."""
    return to_json(obj) + "\n"


STREAM_CONTENT_TYPE = "application/x-ndjson"


def send_chunks(context: Any, chunks: dict[int, str]) -> None:
    """Send {batch index: text} as one intermediate response to those requests only; the others get nothing yet."""
    from ts.handler_utils.utils import send_intermediate_predict_response

    request_ids = {idx: context.request_ids[idx] for idx in chunks}
    for idx in chunks:
        context.set_response_content_type(idx, STREAM_CONTENT_TYPE)
    send_intermediate_predict_response(chunks, request_ids, "Intermediate response", 200, context)
