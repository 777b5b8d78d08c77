"""A BERT encoder in plain torch, for the checkpoints the embedding handler serves (all-MiniLM-L6-v2 and its kind).

Why not ``transformers.BertModel``: importing it costs a worker about 7 s of its start (transformers 5 pulls in most of
its package at import), more than loading and checking the model itself, and the handler needs only the forward
pass: embeddings -> N x (self-attention, feed-forward) -> last hidden state. The parameter names are the checkpoint's
own (``embeddings.word_embeddings.weight``, ``encoder.layer.0.attention.self.query.weight``, ...), so
``model.safetensors`` loads with ``strict=True``: a missing or unexpected tensor fails the load instead of serving a
half-initialised model. The unit tests compare its output with transformers' BertModel on the same weights.

Supported: absolute position embeddings, the exact (erf) GELU and post-LayerNorm blocks, i.e. ``model_type: bert``
with ``hidden_act: gelu`` and ``position_embedding_type: absolute``; :func:`check_bert_config` refuses anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class BertShape:
    """The config.json values the architecture depends on."""

    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float


def check_bert_config(config: dict[str, Any]) -> BertShape:
    """Read config.json; refuse a variant this module does not implement (it would compute something else)."""
    unsupported = []
    if config.get("model_type", "bert") != "bert":
        unsupported.append(f"model_type {config.get('model_type')!r}")
    if config.get("hidden_act", "gelu") != "gelu":
        unsupported.append(f"hidden_act {config.get('hidden_act')!r}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        unsupported.append(f"position_embedding_type {config.get('position_embedding_type')!r}")
    if unsupported:
        raise ValueError(
            "config.json: this BERT encoder supports bert/gelu/absolute only, not " + ", ".join(unsupported)
        )
    shape = BertShape(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        layers=int(config["num_hidden_layers"]),
        heads=int(config["num_attention_heads"]),
        intermediate_size=int(config["intermediate_size"]),
        max_positions=int(config["max_position_embeddings"]),
        type_vocab_size=int(config.get("type_vocab_size", 2)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
    )
    if shape.hidden_size % shape.heads:
        raise ValueError(f"config.json: hidden_size {shape.hidden_size} is not a multiple of {shape.heads} heads")
    return shape


class Embeddings(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden_size)
        self.token_type_embeddings = nn.Embedding(shape.type_vocab_size, shape.hidden_size)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)  # the checkpoint's spelling

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Single-segment inputs: token type 0 everywhere, as the tokenizer produces for one text.
        summed = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions).unsqueeze(0)
            + self.token_type_embeddings.weight[0]
        )
        return self.LayerNorm(summed)


class SelfAttention(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.query = nn.Linear(shape.hidden_size, shape.hidden_size)
        self.key = nn.Linear(shape.hidden_size, shape.hidden_size)
        self.value = nn.Linear(shape.hidden_size, shape.hidden_size)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        rows, tokens, hidden = x.shape
        return x.view(rows, tokens, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        context = nn.functional.scaled_dot_product_attention(
            self.split_heads(self.query(hidden)),
            self.split_heads(self.key(hidden)),
            self.split_heads(self.value(hidden)),
            attn_mask=keep,
        )
        return context.transpose(1, 2).flatten(2)


class DenseNorm(nn.Module):
    """dense -> add the block's input -> LayerNorm (BERT's post-norm residual)."""

    def __init__(self, inputs: int, shape: BertShape) -> None:
        super().__init__()
        self.dense = nn.Linear(inputs, shape.hidden_size)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)  # the checkpoint's spelling

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.self = SelfAttention(shape)
        self.output = DenseNorm(shape.hidden_size, shape)

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden, keep), hidden)


class Intermediate(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.dense = nn.Linear(shape.hidden_size, shape.intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(hidden))


class Layer(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.attention = Attention(shape)
        self.intermediate = Intermediate(shape)
        self.output = DenseNorm(shape.intermediate_size, shape)

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        attended = self.attention(hidden, keep)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(shape) for _ in range(shape.layers))

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, keep)
        return hidden


class BertEncoder(nn.Module):
    """input_ids, attention_mask (int64, [rows, tokens]) -> last hidden state ([rows, tokens, hidden])."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.embeddings = Embeddings(shape)
        self.encoder = Encoder(shape)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # [rows, 1, 1, tokens]: every query may attend to the real tokens of its own row, never to padding.
        keep = attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(input_ids), keep)
