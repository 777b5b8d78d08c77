"""One forward pass that carries the running rows' next tokens and a chunk of joining prompts together.

A decoding step feeds one token per running row; a joining prompt needs many. Padded into one ``[rows, columns]``
batch, every running row would pay the chunk's width, and in a pass of its own the chunk makes every running stream
wait for it. Here the pass is flattened instead: the model sees one sequence of ``R + k x c`` tokens (the ``R``
running rows' newest tokens, then the ``k`` joining rows' next ``c`` prompt columns), so the token-wise layers
(embeddings, projections, MLPs: the weights read once for both) are shared work, and attention is computed per part
by :func:`mixed_attention`: the running rows' queries against their own cache, as a decoding step does, and the
chunk's against the joining group's cache, causally. :class:`MixedLayer` appends each part's new keys and values to
its own cache. Each row therefore computes what it would in a pass of its own (to floating-point rounding of the
shared matrix products; tested: greedy tokens are the same).

The model's attention must follow transformers' attention interface (``ALL_ATTENTION_FUNCTIONS``) with ``sdpa``:
:func:`enable` switches such a model to :data:`MIXED`, which is plain ``sdpa`` in every pass that is not mixed, and
says False for any other model (the scheduler then alternates bounded chunks with decoding steps instead).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.generation import row_attention

MIXED = "serving_mixed"  # the attention implementation name registered with transformers
MIXED_PER_ROW = "serving_mixed_per_row"  # the same, a decoding step's attention over each row's own columns


@dataclass
class MixedPlan:
    """What one mixed pass holds: its parts' sizes and masks, and each layer's keys and values once appended."""

    decode_rows: int  # R: running rows, one token each, first in the flattened sequence
    chunk_rows: int  # k: joining rows
    chunk_columns: int  # c: prompt columns of each joining row in this pass
    decode_mask: torch.Tensor  # [R, 1, 1, running columns + 1] bool: which cache columns each running row sees
    chunk_mask: torch.Tensor  # [k, 1, c, joining columns + c] bool: padding and causality of the chunk
    # per layer: (running keys, running values, joining keys, joining values) after this pass's columns were added
    kv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@functools.cache
def register() -> None:
    """Register :data:`MIXED` and :data:`MIXED_PER_ROW` with transformers' attention and mask interfaces (once per
    process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, function in ((MIXED, mixed_attention), (MIXED_PER_ROW, mixed_per_row_attention)):
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)  # a pass that is not mixed gets sdpa's own mask


def enable(model: Any) -> bool:
    """Let ``model`` run mixed passes: its attention implementation becomes :data:`MIXED` (sdpa unless a pass is
    mixed). False, with the model left as it was, when its attention is not sdpa through transformers' interface."""
    if getattr(model.config, "_attn_implementation", None) in (MIXED, MIXED_PER_ROW):
        return True
    return switch(model, MIXED)


def switch(model: Any, name: str) -> bool:
    """Set a model whose attention is ``sdpa`` (or one of ours) to implementation ``name``; False, the model left
    as it was, for any other."""
    config = model.config
    if getattr(config, "_attn_implementation", None) == name:
        return True
    can_set = getattr(model, "_can_set_attn_implementation", None)
    ours = ("sdpa", MIXED, MIXED_PER_ROW)
    if getattr(config, "_attn_implementation", None) not in ours or can_set is None or not can_set():
        return False
    register()
    try:
        model.set_attn_implementation(name)
    except (ValueError, ImportError):
        return False
    return bool(config._attn_implementation == name)


def use_per_row(model: Any, per_row: bool) -> bool:
    """Switch ``model`` to :data:`MIXED_PER_ROW` (``per_row``) or back to :data:`MIXED` (plain ``sdpa`` outside
    mixed passes, as the model's own); False when its attention is not ``sdpa`` through transformers' interface."""
    return switch(model, MIXED_PER_ROW if per_row else MIXED)


def uses_per_row(model: Any) -> bool:
    return getattr(model.config, "_attn_implementation", None) == MIXED_PER_ROW


def mixed_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa, or, in a mixed pass (``mixed_plan`` among the forward's keyword arguments), sdpa per part."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return attend(sdpa_attention_forward, module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def mixed_per_row_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """:func:`mixed_attention` with decoding steps (and a mixed pass's running rows) over each row's own columns."""
    return attend(row_attention.attention, module, query, key, value, attention_mask, dropout, scaling, **kwargs)


AttentionFunction = Callable[..., tuple[torch.Tensor, None]]


def attend(
    decode: AttentionFunction,
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    scaling: float | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``decode`` (an attention function: sdpa or :func:`row_attention.attention`) outside a mixed pass and for a
    mixed pass's running rows; sdpa for its chunk."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan: MixedPlan | None = kwargs.pop("mixed_plan", None)
    if plan is None:
        return decode(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    running_keys, running_values, joining_keys, joining_values = plan.kv[module.layer_idx]
    rows, k, c = plan.decode_rows, plan.chunk_rows, plan.chunk_columns
    heads, head_dim = query.shape[1], query.shape[-1]
    parts = []
    if rows:
        decode_query = query[0, :, :rows].transpose(0, 1).unsqueeze(2)  # [R, heads, 1, head_dim]
        out, _ = decode(
            module, decode_query, running_keys, running_values, plan.decode_mask, dropout=dropout, scaling=scaling,
            is_causal=False,
        )  # fmt: skip
        parts.append(out.reshape(1, rows, heads, head_dim))
    chunk_query = query[0, :, rows:].reshape(heads, k, c, head_dim).transpose(0, 1)  # [k, heads, c, head_dim]
    out, _ = sdpa_attention_forward(
        module, chunk_query, joining_keys, joining_values, plan.chunk_mask, dropout=dropout, scaling=scaling,
        is_causal=False,
    )  # fmt: skip
    parts.append(out.reshape(1, k * c, heads, head_dim))
    return torch.cat(parts, dim=1), None


def mixed_cache(plan: MixedPlan, running: Any, joining: Any) -> Any:
    """The cache a mixed pass is given: per layer a :class:`MixedLayer` over the running and the joining caches."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = [
        mixed_layer()(plan, index, running_layer, joining_layer)
        for index, (running_layer, joining_layer) in enumerate(zip(running.layers, joining.layers, strict=True))
    ]
    return cache


@functools.cache
def mixed_layer() -> type:
    """The class of a mixed pass's cache layer (built on first use, as transformers is imported only then)."""
    from transformers.cache_utils import DynamicLayer

    class MixedLayer(DynamicLayer):
        """Splits a mixed pass's new keys and values ``[1, heads, R + k x c, head_dim]`` between the running rows'
        layer (one column each) and the joining rows' layer (``c`` columns each), and keeps both results for
        :func:`mixed_attention`."""

        def __init__(self, plan: MixedPlan, index: int, running: Any, joining: Any) -> None:
            super().__init__()
            self.plan, self.index, self.running, self.joining = plan, index, running, joining
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            plan = self.plan
            rows, k, c = plan.decode_rows, plan.chunk_rows, plan.chunk_columns
            heads, head_dim = key_states.shape[1], key_states.shape[-1]

            def split(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                decode = states[0, :, :rows].transpose(0, 1).unsqueeze(2)  # [R, heads, 1, head_dim]
                chunk = states[0, :, rows:].reshape(heads, k, c, head_dim).transpose(0, 1)  # [k, heads, c, head_dim]
                return decode, chunk

            decode_keys, chunk_keys = split(key_states)
            decode_values, chunk_values = split(value_states)
            running_keys, running_values = self.running.update(decode_keys, decode_values)
            joining_keys, joining_values = self.joining.update(chunk_keys, chunk_values)
            plan.kv[self.index] = (running_keys, running_values, joining_keys, joining_values)
            return key_states, value_states

        def get_seq_length(self) -> int:
            return 0

    return MixedLayer


def forward(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    plan: MixedPlan,
    keep: torch.Tensor,
    running_cache: Any,
    joining_cache: Any,
) -> torch.Tensor:
    """One mixed pass over the flattened ``input_ids`` ``[1, R + k x c]``; returns the fp32 CPU logits of the
    flattened positions ``keep`` (``[len(keep), vocab]``). The caches grow by this pass's columns."""
    tokens = input_ids.shape[1]
    # A 4-d mask is taken as given, so transformers builds none (mixed_attention uses the plan's own masks).
    placeholder = torch.ones((1, 1, tokens, 1), dtype=torch.bool, device=input_ids.device)
    output = model(
        input_ids=input_ids,
        attention_mask=placeholder,
        position_ids=position_ids,
        cache=mixed_cache(plan, running_cache, joining_cache),
        use_cache=True,
        logits_to_keep=keep,
        mixed_plan=plan,
    )
    return output.logits[0].float().cpu()
