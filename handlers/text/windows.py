"""Long inputs by windows: a text longer than the model's token limit embedded as overlapping windows, pooled into
one vector (opt-in: ``handler.long_inputs`` per model, ``"long_input"`` per request; docs/embeddings.md "Long
inputs").

A window is a piece of the text, cut at token (and, where it can, word) boundaries so that it fits the model's limit
with its special tokens and prompt; each window is an ordinary row of the text-model path (the same cache, buckets
and forward groups: handlers/text/batch.py knows nothing of windows). The answer pools a text's windows: the mean of
their vectors weighted by each window's token count, re-normalised to unit length where the model's own module chain
normalises its vectors (so the pooled vector is what every other answer of that model is: a unit vector). A text
that fits is one window, its row answered exactly as without windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from handlers.core.errors import RequestError, shown, too_large
from handlers.text.tokenization import ServedTokenizer

LONG_INPUT_MODES = ("truncate", "windows")
LONG_INPUT_FIELD = "long_input"  # the request field; handler.long_inputs is the model's default


@dataclass(frozen=True)
class WindowSettings:
    """The model's long-input defaults (``handler:`` config): the mode a request without ``long_input`` gets, the
    share of a window repeated from the one before it, and how many windows one text may take."""

    default: str = "truncate"
    overlap: float = 0.25
    max_windows: int = 16

    def mode(self, body: dict[str, Any]) -> str:
        """The request's ``long_input`` (absent or null: the model's default), or a 400 naming the field."""
        value = body.get(LONG_INPUT_FIELD)
        if value is None:
            return self.default
        if value not in LONG_INPUT_MODES:
            raise RequestError(
                f"'{LONG_INPUT_FIELD}' {shown(value)} is not supported; use one of "
                f"{', '.join(map(repr, LONG_INPUT_MODES))}"
            )
        return str(value)


class WindowedRequest(Protocol):
    """An embedding request whose texts can be split (handlers/text/dialects/native.py, openai.py): its rows, their
    names and options, and, once split, how many windows each text became."""

    texts: list[str]
    names: list[str]
    truncate: bool
    options: Any
    windows: list[int] | None


def special_tokens(tokenizer: ServedTokenizer) -> int:
    """Tokens the tokenizer adds around a text ([CLS] and [SEP] for BERT)."""
    return len(tokenizer.encode("a").ids) - len(tokenizer.untruncated().encode("a", add_special_tokens=False).ids)


def window_spans(tokens: int, size: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) token spans of ``size`` tokens every ``stride`` tokens; the last one ends at the text's end."""
    spans = []
    start = 0
    while True:
        end = min(start + size, tokens)
        spans.append((start, end))
        if end == tokens:
            return spans
        start += stride


def windows_needed(tokens: int, size: int, stride: int) -> int:
    return 1 if tokens <= size else 1 + math.ceil((tokens - size) / stride)


def snap_to_words(span: tuple[int, int], word_ids: Sequence[int | None]) -> tuple[int, int]:
    """The span shrunk to whole words: a piece that starts or ends inside a word would tokenize that word's piece
    differently (BERT's "##ing" becomes "ing"). A word longer than the span keeps the span as it is."""
    start, end = span
    snapped_start = start
    while (
        0 < snapped_start < end
        and word_ids[snapped_start] is not None
        and (word_ids[snapped_start] == word_ids[snapped_start - 1])
    ):
        snapped_start += 1
    snapped_end = end
    while (
        snapped_start < snapped_end < len(word_ids)
        and word_ids[snapped_end] is not None
        and (word_ids[snapped_end] == word_ids[snapped_end - 1])
    ):
        snapped_end -= 1
    if snapped_start >= snapped_end:
        return span
    return snapped_start, snapped_end


def split_texts(
    request: WindowedRequest,
    tokenizer: ServedTokenizer,
    settings: WindowSettings,
    prefix: str = "",
    prefix_tokens: int = 0,
) -> None:
    """Replace the request's texts by their windows (a text that fits stays one row) and record the windows per text.

    ``prefix``: what the request put in front of every text (its prompt, as prepared), repeated in front of each
    window and left out of the split; ``prefix_tokens``: its token count. A text needing more than
    ``settings.max_windows`` windows is a 413 naming that limit."""
    size = tokenizer.max_tokens - special_tokens(tokenizer) - prefix_tokens
    if size < 2:
        raise RequestError(f"'{LONG_INPUT_FIELD}' 'windows': the prompt leaves no room for a window")
    stride = max(1, size - int(size * settings.overlap))
    bodies = [text[len(prefix) :] for text in request.texts]
    encodings = tokenizer.untruncated().encode_batch(bodies, add_special_tokens=False)
    options = list(request.options) if request.options is not None else None
    texts: list[str] = []
    names: list[str] = []
    row_options: list[Any] = []
    counts: list[int] = []
    for number, (body, name, encoding) in enumerate(zip(bodies, request.names, encodings, strict=True)):
        needed = windows_needed(len(encoding.ids), size, stride)
        if needed > settings.max_windows:
            raise too_large(
                f"{name} has {len(encoding.ids)} tokens: {needed} windows of {size} tokens; "
                f"handler.max_windows is {settings.max_windows}"
            )
        if needed == 1:
            pieces = [body]
        else:
            spans = [snap_to_words(span, encoding.word_ids) for span in window_spans(len(encoding.ids), size, stride)]
            pieces = [body[encoding.offsets[start][0] : encoding.offsets[end - 1][1]] for start, end in spans]
        texts += [prefix + piece for piece in pieces]
        names += [name] if needed == 1 else [f"{name} (window {w + 1} of {needed})" for w in range(needed)]
        if options is not None:
            row_options += [options[number]] * needed
        counts.append(needed)
    request.texts, request.names, request.windows = texts, names, counts
    request.options = row_options if options is not None else None
    request.truncate = True  # a window that retokenizes a token longer is cut; the next window overlaps it


class WindowRow(Protocol):
    """A computed row as pooling needs it (a cache entry is one)."""

    @property
    def value(self) -> torch.Tensor: ...

    @property
    def tokens(self) -> int: ...

    @property
    def truncated(self) -> bool: ...


@dataclass(frozen=True)
class PooledRow:
    """One text's answer row made from its windows: tokens = the tokens of all its windows (what was computed)."""

    value: torch.Tensor
    tokens: int
    truncated: bool = False


def pool_windows(rows: Sequence[WindowRow], counts: Sequence[int], normalize: bool) -> list[WindowRow]:
    """Each text's windows as one row: the token-weighted mean of their vectors (unit length where ``normalize``).
    A text of one window is its row as computed, so its answer is exactly the one without windows."""
    pooled: list[WindowRow] = []
    position = 0
    for count in counts:
        group = rows[position : position + count]
        position += count
        if count == 1:
            pooled.append(group[0])
            continue
        weights = torch.tensor([row.tokens for row in group], dtype=torch.float32)
        vectors = torch.stack([row.value.detach().to("cpu", torch.float32) for row in group])
        vector = (weights[:, None] * vectors).sum(dim=0) / weights.sum()
        if normalize:
            vector = vector / vector.norm().clamp_min(1e-12)
        pooled.append(PooledRow(vector, sum(row.tokens for row in group)))
    if position != len(rows):
        raise ValueError(f"{len(rows)} rows for {position} windows")
    return pooled
