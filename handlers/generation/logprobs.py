"""Log probabilities of the generated tokens (OpenAI's ``logprobs`` / ``top_logprobs``), computed only for the rows
that asked, and their answer shapes.

Which distribution: the **model's own**, ``log_softmax`` of the fp32 next-token logits, before temperature, top-k and
top-p (vLLM's default, ``raw_logprobs``). The value of a token does not then depend on how it was drawn: a greedy
request and a sampled one report the same number for the same token after the same text, a test can recompute it
from the model alone, and a token top-p would have excluded still has a finite log probability to show among the
alternatives. (OpenAI reports the processed distribution; at temperature 1 and top_p 1 the two are the same.)

A row that asked pays one ``log_softmax`` over the vocabulary and one ``topk`` per step; a row that did not pays
nothing (:func:`handlers.generation.decoding.append_tokens` calls :func:`token_logprob` only for those rows).

Shapes (docs/generation.md): chat's ``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``
(:func:`chat_logprobs`), completions' legacy ``{tokens, token_logprobs, top_logprobs: [{token: logprob}],
text_offset}`` (:func:`completion_logprobs`), and the native API's ``[{token, token_id, logprob, top: [{token,
token_id, logprob}]}]`` (:func:`native_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs and the native API's logprobs, as OpenAI's chat limit
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI's legacy limit


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and its ``top`` most likely alternatives (token id, logprob), most
    likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token_id: int, top: int) -> TokenLogprob:
    """The log probability of ``token_id`` under one row's fp32 logits, and the ``top`` most likely tokens'."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(logprobs, min(top, logprobs.numel()))
        alternatives = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id, float(logprobs[token_id]), alternatives)


# ------------------------------------------------------------------------------------------------ token text
def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's character for each byte (GPT-2's table: printable bytes stand for themselves, the others are
    shifted to 256 + n), inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = 256 + shifted
            shifted += 1
    return {chr(character): byte for byte, character in characters.items()}


BYTE_LEVEL = _byte_level_table()


class TokenText:
    """A tokenizer's text and UTF-8 bytes for one token id, as OpenAI shows them (``token`` and ``bytes``).

    The text is the token decoded alone (special tokens included, so an end-of-text token shows as itself); a
    byte-level BPE token can be part of a character, whose text then shows U+FFFD while ``bytes`` holds the exact
    bytes (read from the byte-level alphabet), so a client joins the bytes of consecutive tokens into the text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _bytes(self, token_id: int) -> list[int]:
        if self.byte_level and token_id not in self.tokenizer.all_special_ids:
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(raw, str) and all(character in BYTE_LEVEL for character in raw):
                return [BYTE_LEVEL[character] for character in raw]
        return list(self.text(token_id).encode("utf-8"))


@lru_cache(maxsize=4)
def token_text(tokenizer: Any) -> TokenText:
    """The served tokenizer's TokenText (one per worker: its caches fill once)."""
    return TokenText(tokenizer)


# ------------------------------------------------------------------------------------------------ answer shapes
def chat_logprobs(logprobs: list[TokenLogprob], top: int, text: TokenText) -> dict[str, Any]:
    """Chat completions' ``choices[i].logprobs``: ``{"content": [...], "refusal": null}``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": text.text(token_id), "logprob": logprob, "bytes": text.bytes(token_id)}

    content = [
        {**entry(item.token_id, item.logprob), "top_logprobs": [entry(i, value) for i, value in item.top[:top]]}
        for item in logprobs
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(logprobs: list[TokenLogprob], top: int, text: TokenText, offset: int) -> dict[str, Any]:
    """Completions' legacy ``choices[i].logprobs``; ``offset``: the answer text's characters before these tokens
    (``text_offset`` counts each token's start in the answer's text, by the lengths of the tokens' own texts)."""
    tokens = [text.text(item.token_id) for item in logprobs]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [item.logprob for item in logprobs],
        # A dict per token (OpenAI's shape), likeliest first: of two alternatives that decode to the same text (two
        # halves of different characters both show U+FFFD) the likelier one is kept.
        "top_logprobs": [top_dict(item.top[:top], text) for item in logprobs],
        "text_offset": offsets,
    }


def top_dict(alternatives: tuple[tuple[int, float], ...], text: TokenText) -> dict[str, float]:
    shown: dict[str, float] = {}
    for token_id, logprob in alternatives:
        shown.setdefault(text.text(token_id), logprob)
    return shown


def native_logprobs(logprobs: list[TokenLogprob], text: TokenText) -> list[dict[str, Any]]:
    """The native API's ``logprobs``: ``[{"token", "token_id", "logprob", "top": [{"token", "token_id",
    "logprob"}]}]``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": text.text(token_id), "token_id": token_id, "logprob": logprob}

    return [{**entry(item.token_id, item.logprob), "top": [entry(i, v) for i, v in item.top]} for item in logprobs]
