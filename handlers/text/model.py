"""A text model as one torch module, built from its folder: token ids in, one fp32 row per text out.

``input_ids, attention_mask[, token_type_ids]`` (int64, ``[rows, tokens]``) -> ``[rows, output_size]`` fp32:

- embedding: encoder -> pooling (the folder's modes, concatenated in sentence-transformers' order) -> L2
  normalisation where the folder has a Normalize module;
- classification: the sequence-classification model's logits (the answer step turns them into probabilities).

Pooling and normalisation live inside ``forward`` so that every execution path (eager, ``torch.compile``, the
AOTInductor package, OpenVINO, the accuracy gate) computes exactly what is served. The encoder is the project's
plain-torch BERT (handlers/text/bert.py: no transformers import, a worker starts ~7 s sooner) where it computes
the same thing, else transformers' own model for the architecture. Files are read from the folder only: JSON configs,
safetensors weights (never a pickle), tokenizer.json; never the network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from handlers.text.folder import TOKENIZER_FILE, TextModelFolder, inspect_folder, read_json, resolve_pad_id


def pool(modes: tuple[str, ...], hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' pooling of right-padded rows, computed in fp32; modes are concatenated in order."""
    hidden = hidden.to(torch.float32)
    mask = attention_mask.unsqueeze(-1).to(torch.float32)
    pieces = []
    for mode in modes:
        if mode == "cls":
            pieces.append(hidden[:, 0])
        elif mode == "max":
            pieces.append(hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            counts = mask.sum(dim=1).clamp(min=1e-9)
            pieces.append((hidden * mask).sum(dim=1) / (counts if mode == "mean" else counts.sqrt()))
        elif mode == "weightedmean":
            weights = mask * torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=torch.float32).view(
                1, -1, 1
            )
            pieces.append((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
            index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
            pieces.append(torch.gather(hidden, 1, index).squeeze(1))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


def mean_pool_normalize(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens, then unit length (all-MiniLM-L6-v2's head)."""
    return nn.functional.normalize(pool(("mean",), hidden, attention_mask), p=2.0, dim=-1)


class SentenceEncoder(nn.Module):
    """An embedding model: encoder -> pooling [-> normalize]."""

    def __init__(self, transformer: nn.Module, pooling: tuple[str, ...], normalize: bool, hf: bool) -> None:
        super().__init__()
        self.transformer = transformer
        self.pooling = pooling
        self.normalize = normalize
        self.hf = hf  # transformers' model (returns an output object) or the plain encoder (returns the tensor)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.hf:
            hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        else:
            hidden = self.transformer(input_ids, attention_mask)
        pooled = pool(self.pooling, hidden, attention_mask)
        return nn.functional.normalize(pooled, p=2.0, dim=-1) if self.normalize else pooled


class SequenceClassifier(nn.Module):
    """A sequence-classification model: its logits in fp32 (token_type_ids for models that segment text pairs)."""

    def __init__(self, model: nn.Module, token_types: bool) -> None:
        super().__init__()
        self.model = model
        self.token_types = token_types

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        extra = {"token_type_ids": token_type_ids} if self.token_types else {}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits.to(torch.float32)


def hf_load_options() -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the folder; never ask the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    # Its load report ("UNEXPECTED: pooler...", progress bars) would be a dozen lines per worker start.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return {"local_files_only": True, "use_safetensors": True, "dtype": torch.float32}


def load_plain_bert(base: Path) -> nn.Module:
    from safetensors.torch import load_file

    from handlers.text.bert import BertEncoder, check_bert_config

    transformer = BertEncoder(check_bert_config(read_json(base, "config.json")))
    weights = load_file(str(base / "model.safetensors")) if (base / "model.safetensors").is_file() else {}
    if not weights:  # sharded: merge the shards the index lists
        index = read_json(base, "model.safetensors.index.json")
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(load_file(str(base / shard)))
    # A checkpoint saved from a task model prefixes its keys with the architecture's name.
    weights = {key.removeprefix("bert."): value for key, value in weights.items()}
    # The checkpoint also holds the unused pooler head and a position-id buffer the model recreates itself.
    weights = {
        key: value
        for key, value in weights.items()
        if not key.startswith("pooler.") and key not in ("embeddings.position_ids", "embeddings.token_type_ids")
    }
    transformer.load_state_dict(weights, strict=True)
    return transformer


def build_module(model_dir: str | os.PathLike[str], info: TextModelFolder) -> nn.Module:
    """The fp32 model of ``info``'s kind in eval mode, from the folder's weights."""
    base = Path(model_dir) / info.transformer_dir
    if info.kind == "classification":
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(str(base), **hf_load_options())
        return SequenceClassifier(model, info.token_types).eval()
    if info.engine == "bert":
        return SentenceEncoder(load_plain_bert(base), info.pooling, info.normalize, hf=False).eval()
    from transformers import AutoModel

    # The pooler head is not part of a sentence embedding (sentence-transformers loads it and never runs it).
    pooler = {"add_pooling_layer": False} if info.model_type in ("bert", "roberta", "xlm-roberta") else {}
    model = AutoModel.from_pretrained(str(base), **pooler, **hf_load_options())
    return SentenceEncoder(model, info.pooling, info.normalize, hf=True).eval()


def load_tokenizer(model_dir: str | os.PathLike[str], info: TextModelFolder) -> Any:
    """The fast tokenizer from tokenizer.json, truncating at the model's limit and never padding (we pad per bucket).

    Pairs are truncated longest-first, as transformers' tokenizers do by default."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / info.transformer_dir / TOKENIZER_FILE))
    tokenizer.no_padding()  # a saved tokenizer may pad every text to a fixed length
    tokenizer.enable_truncation(max_length=info.max_tokens, strategy="longest_first")
    return tokenizer


@dataclass
class ModelFiles:
    """A text model as its folder describes it, with its tokenizer (the fp32 module is built separately)."""

    info: TextModelFolder
    tokenizer: Any


def read_model_files(model_dir: str | os.PathLike[str], kind: str) -> ModelFiles:
    """Inspect the folder (refusing what cannot be served) and load its tokenizer with the padding id resolved."""
    info = inspect_folder(model_dir, kind)
    tokenizer = load_tokenizer(model_dir, info)
    return ModelFiles(resolve_pad_id(Path(model_dir), info, tokenizer), tokenizer)


def load_sentence_encoder(model_dir: str | os.PathLike[str], kind: str = "embedding") -> nn.Module:
    """The fp32 model of the folder in eval mode (the gate's reference, the backends' source)."""
    return build_module(model_dir, inspect_folder(model_dir, kind))
