"""The accuracy gate's measure for text models: how close a candidate (a precision, a compiled backend) computes to
eager fp32 on the reference rows, as one number compared with ``handler.min_cosine`` (1.0 = identical).

Embeddings: the smallest row cosine similarity. Classifier logits are not compared by cosine (a one-output reranker's
cosine is only the sign's agreement): what a client reads is the probabilities, so the measure is 1 - the largest
absolute difference of any row's probabilities (softmax for single-label, sigmoid for multi-label and one-output
scorers; a regression output is compared as 1 - its largest absolute difference). The packaging step's gate
(scripts/build_backends.py) and the worker's (handlers/text/handler.py) both call :func:`similarity`.
"""

from __future__ import annotations

import torch

from handlers.core import runtime
from handlers.text.folder import TextModelFolder


def probabilities(logits: torch.Tensor, activation: str) -> torch.Tensor:
    """What a classifier answers from its logits (fp32): softmax over labels, a sigmoid per output, or the raw value."""
    logits = logits.to(torch.float32)
    if activation == "softmax":
        return torch.softmax(logits, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return logits


def reference_rows(kind: str, sentences: list[str]) -> list[str | tuple[str, str]]:
    """The gate's rows: the reference sentences, and for a classifier also pairs of them (NLI models and
    cross-encoders are served pairs, and a pair's second segment runs through other embeddings)."""
    if kind == "embedding":
        return list(sentences)
    pairs = [(sentences[i], sentences[(i + 1) % len(sentences)]) for i in range(0, len(sentences), 3)]
    return [*sentences, *pairs]


def similarity(info: TextModelFolder, expected: torch.Tensor, got: torch.Tensor) -> float:
    if info.kind == "embedding":
        return runtime.min_cosine_similarity(expected, got)
    difference = (probabilities(expected, info.activation) - probabilities(got, info.activation)).abs()
    if not torch.isfinite(difference).all():
        return 0.0
    return 1.0 - float(difference.max()) if difference.numel() else 1.0
