"""The embedding model as one module: a BERT encoder, mean pooling over real tokens, L2 normalisation.

Pooling and normalisation live inside ``forward`` so that every execution path (eager, ``torch.compile``, the
AOTInductor package, the accuracy gate) computes exactly what is served. This is what sentence-transformers does for
all-MiniLM-L6-v2 (modules.json: Transformer -> Pooling(mean) -> Normalize). Files are read from the unpacked archive
only: JSON configs and safetensors weights, never a pickle, never the network. :func:`load_embedding_model` returns
everything the handler loads, checked against its ``handler:`` config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from handlers.core.base import Loaded
from handlers.core.config import ConfigError
from handlers.embedding.bert import BertEncoder, check_bert_config
from handlers.embedding.buckets import check_buckets
from handlers.embedding.requests import EmbeddingLimits


def mean_pool_normalize(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average the token vectors of real tokens (mask 1), then scale to unit length; computed in fp32."""
    mask = attention_mask.unsqueeze(-1).to(torch.float32)
    summed = (hidden.to(torch.float32) * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return nn.functional.normalize(summed / counts, p=2.0, dim=-1)


class SentenceEncoder(nn.Module):
    """input_ids, attention_mask (int64, [batch, tokens]) -> unit-length sentence embeddings (fp32, [batch, dim])."""

    def __init__(self, transformer: BertEncoder) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return mean_pool_normalize(self.transformer(input_ids, attention_mask), attention_mask)


def read_json(model_dir: str | os.PathLike[str], name: str) -> Any:
    with open(os.path.join(model_dir, name), encoding="utf-8") as file:
        return json.load(file)


def check_pooling(model_dir: str | os.PathLike[str]) -> int:
    """Refuse a model whose sentence-transformers pooling is not plain mean pooling (we implement only that)."""
    pooling = read_json(model_dir, os.path.join("1_Pooling", "config.json"))
    modes = sorted(key for key, value in pooling.items() if key.startswith("pooling_mode") and value)
    if modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"1_Pooling/config.json: only mean pooling is supported, the model uses {modes}")
    return pooling["word_embedding_dimension"]


def max_sequence_tokens(model_dir: str | os.PathLike[str]) -> int:
    """The token limit sentence-transformers applies to this model (sentence_bert_config.json max_seq_length)."""
    return int(read_json(model_dir, "sentence_bert_config.json")["max_seq_length"])


def load_sentence_encoder(model_dir: str | os.PathLike[str]) -> SentenceEncoder:
    """The fp32 encoder in eval mode, built from config.json and model.safetensors of ``model_dir``."""
    from safetensors.torch import load_file

    check_pooling(model_dir)
    transformer = BertEncoder(check_bert_config(read_json(model_dir, "config.json")))
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    # The checkpoint also holds the unused pooler head and a position-id buffer the model recreates itself.
    weights = {
        key: value
        for key, value in weights.items()
        if not key.startswith("pooler.") and key != "embeddings.position_ids"
    }
    transformer.load_state_dict(weights, strict=True)
    return SentenceEncoder(transformer).eval()


def load_tokenizer(model_dir: str | os.PathLike[str], max_tokens: int) -> Any:
    """The fast tokenizer from tokenizer.json, truncating at ``max_tokens`` and never padding (we pad per bucket)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_padding()  # the file ships padding to 128, which would pad every text
    tokenizer.enable_truncation(max_length=max_tokens)  # the file ships 128; the model's limit is 256
    return tokenizer


@dataclass
class LoadedEncoder(Loaded):
    """The embedding model and what serving it needs, as loaded from the archive and checked against the config."""

    tokenizer: Any  # tokenizers.Tokenizer, truncating at max_tokens
    pad_id: int
    dimension: int  # floats per embedding
    max_tokens: int  # the model's token limit (texts are truncated to it)
    buckets: list[int]  # token lengths rows are padded to
    limits: EmbeddingLimits


def load_embedding_model(model_dir: str, config: dict[str, Any]) -> LoadedEncoder:
    """Load the encoder and its tokenizer; refuse a ``handler:`` config that cannot serve this model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the archive; never ask the hub
    dimension = check_pooling(model_dir)
    max_tokens = max_sequence_tokens(model_dir)
    try:
        buckets = check_buckets(config["length_buckets"], max_tokens)
    except ValueError as error:
        raise ConfigError(f"handler.length_buckets: {error}") from None
    if config["max_forward_tokens"] < max_tokens:
        raise ConfigError(f"handler.max_forward_tokens must hold one {max_tokens}-token row")
    if config["max_request_chars"] < config["max_text_chars"]:
        raise ConfigError(
            f"handler.max_request_chars ({config['max_request_chars']}) is below "
            f"handler.max_text_chars ({config['max_text_chars']}): no request could carry "
            f"the longest text allowed"
        )
    limits = EmbeddingLimits(config["max_inputs"], config["max_text_chars"], config["max_request_chars"])
    tokenizer = load_tokenizer(model_dir, max_tokens)
    return LoadedEncoder(
        model=load_sentence_encoder(model_dir),
        tokenizer=tokenizer,
        pad_id=tokenizer.token_to_id("[PAD]") or 0,
        dimension=dimension,
        max_tokens=max_tokens,
        buckets=buckets,
        limits=limits,
    )
