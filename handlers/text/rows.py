"""What the text engine computes: rows. A row is one text, or a text pair (premise and hypothesis, query and document)
for a classifier, with the options that change what the model makes of it."""

from __future__ import annotations

from dataclasses import dataclass

Row = str | tuple[str, str]


@dataclass(frozen=True)
class RowOptions:
    """How one row is computed besides its text; part of its cache key.

    ``prompt_length``: tokens of the prompt at the row's start, which the pooling leaves out where the model says
    (sentence-transformers' ``include_prompt: false``); ``max_tokens``: a limit shorter than the model's own (a
    multi-vector model's query or document length), 0 = the model's own; ``task``: what a multi-vector model encodes
    the row as ("query" or "document"), which decides the tokens it scores with."""

    prompt_length: int = 0
    max_tokens: int = 0
    task: str = ""


DEFAULT_OPTIONS = RowOptions()
