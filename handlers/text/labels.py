"""What a classifier's logits mean: the transformers problem types and the probabilities a client reads."""

from __future__ import annotations

import torch

SINGLE_LABEL, MULTI_LABEL, REGRESSION, SCORE = (
    "single_label_classification",
    "multi_label_classification",
    "regression",
    "score",
)


def probabilities(logits: torch.Tensor, activation: str) -> torch.Tensor:
    """What a classifier answers from its logits (fp32): softmax over labels, a sigmoid per output, or the raw value."""
    logits = logits.to(torch.float32)
    if activation == "softmax":
        return torch.softmax(logits, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(logits)
    return logits
