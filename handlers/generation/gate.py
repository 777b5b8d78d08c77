"""Fixed prompts decoded greedily at load: what the generator's load-time gates compare, one model form against
another (``handler.compile_decode``: :mod:`handlers.generation.compiled`; ``handler.precision``:
:mod:`handlers.generation.precision`).

The prompts are token ids (taken modulo the model's vocabulary, so any model can decode them), of different lengths
so that the batch has left padding; they are decoded together and the first one again alone (a lone row's step is
a different shape), with no stop token, so every row yields exactly :data:`GATE_TOKENS` tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.running import generate

GATE_PROMPTS = ([464, 2068, 7586, 21831], [15496, 995], [7454, 2402, 257, 640, 612, 373, 257, 1402, 2746])
GATE_TOKENS = 12


def gate_prompts(model: Any) -> list[list[int]]:
    """:data:`GATE_PROMPTS` in the model's vocabulary."""
    vocab = int(model.config.vocab_size)
    return [[token % vocab for token in prompt] for prompt in GATE_PROMPTS]


def greedy_sequences(model: Any, pad_token_id: int, logprobs: bool = False, paged: Any = None) -> list[Sequence]:
    """The gate prompts decoded greedily together, then the first alone: one finished Sequence each (with each
    chosen token's log probability under the model's fp32 logits when ``logprobs``). ``paged``: decoded by that
    :class:`handlers.generation.paged_openvino.PagedModel` instead of the model's eager passes."""
    settings = SamplingSettings(max_new_tokens=GATE_TOKENS, logprobs=0 if logprobs else None)
    prompts = gate_prompts(model)
    together = [Sequence(list(prompt), settings) for prompt in prompts]
    alone = [Sequence(list(prompts[0]), settings)]
    with torch.inference_mode():
        generate(model, together, (), pad_token_id, paged=paged)
        generate(model, alone, (), pad_token_id, paged=paged)
    return together + alone


def greedy_tokens(model: Any, pad_token_id: int, paged: Any = None) -> list[list[int]]:
    """The generated tokens of :func:`greedy_sequences`, one list per row."""
    return [sequence.token_ids for sequence in greedy_sequences(model, pad_token_id, paged=paged)]
