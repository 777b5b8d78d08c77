"""A text model as one torch module, built from its folder: token ids in, fp32 rows out.

``input_ids, attention_mask[, token_type_ids][, prompt_lengths]`` (int64; the extra inputs are the model's own,
:attr:`TextModelFolder.model_inputs`) -> the answer's numbers in fp32: one row per text for an embedding, a
classifier's logits or a sparse model's vocabulary weights, one vector per token for a multi-vector model
(``[rows, length, width]``).

The body is the project's plain-torch BERT (handlers/text/bert.py: no transformers import, a worker starts ~7 s
sooner) where it computes the same thing, else the transformers class the packaging step recorded for the folder
(``text_model.json``: the class sentence-transformers or transformers itself loaded it as). The head is the folder's
sentence-transformers module chain (handlers/text/modules.py). Both live inside ``forward`` so that every execution
path (eager, ``torch.compile``, the AOTInductor package, OpenVINO, the accuracy gate) computes exactly what is served.
Files are read from the folder only: JSON configs, safetensors weights (never a pickle), the served tokenizer; never
the network. Code shipped with the folder runs only where the packager opted in (``trust_remote_code``).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from handlers.text.folder import TextModelFolder, read_json
from handlers.text.kinds import inspect_folder
from handlers.text.modules import Head
from handlers.text.tokenization import ServedTokenizer, load_served_tokenizer


class TextModule(nn.Module):
    """body (the transformer) -> head (pooling and the modules after it); a classifier has no head."""

    def __init__(self, body: nn.Module, info: TextModelFolder, head: Head | None) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.plain = info.engine == "bert"  # the plain encoder returns the tensor; transformers an output object
        self.body_output = info.body_output
        self.extra_inputs = info.model_inputs[2:]
        self.truncate_dim = info.truncate_dim  # the folder's truncate_dim cuts every row, as encode() does

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        named = dict(zip(self.extra_inputs, extra, strict=True))
        prompt_lengths = named.pop("prompt_lengths", None)
        if self.plain:
            states = self.body(input_ids, attention_mask)
        else:
            output = self.body(input_ids=input_ids, attention_mask=attention_mask, **named)
            states = getattr(output, self.body_output)
        if self.head is None:
            return states.to(torch.float32)
        out = self.head(states, attention_mask, prompt_lengths)
        return out[..., : self.truncate_dim] if self.truncate_dim else out


def hf_load_options(remote_code: bool = False) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the folder; never ask the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    # Its load report ("UNEXPECTED: pooler...", progress bars) would be a dozen lines per worker start.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return {"local_files_only": True, "use_safetensors": True, "dtype": torch.float32, "trust_remote_code": remote_code}


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


def transformers_class(name: str) -> Any:
    """A transformers model class by name (an Auto class, or the concrete class recorded at package time); only
    transformers' own model classes are accepted from an archive."""
    import transformers

    found = getattr(transformers, name, None)
    auto = name.startswith("AutoModel")
    if found is None or not (auto or (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel))):
        raise ValueError(f"text_model.json names {name!r}, which is not a transformers model class")
    return found


def load_body(base: Path, info: TextModelFolder) -> nn.Module:
    if info.engine == "bert":
        return load_plain_bert(base)
    model_class = transformers_class(info.body_class)
    options = hf_load_options(info.remote_code)
    # The pooler head is not part of the served answer (sentence-transformers loads it and never runs it).
    concrete = model_class if not info.body_class.startswith("Auto") else None
    if concrete is not None and "add_pooling_layer" in inspect.signature(concrete.__init__).parameters:
        options["add_pooling_layer"] = False
    return model_class.from_pretrained(str(base), **options)


def build_module(model_dir: str | os.PathLike[str], info: TextModelFolder) -> nn.Module:
    """The fp32 model of ``info``'s kind in eval mode, from the folder's weights."""
    folder = Path(model_dir)
    body = load_body(folder / info.transformer_dir, info)
    head = Head(folder, info.head) if info.head else None
    return TextModule(body, info, head).eval()


def body_arguments(body: nn.Module) -> set[str]:
    """The inputs a loaded transformers model's forward takes (what a tokenizer output may feed it)."""
    return set(inspect.signature(body.forward).parameters)


@dataclass
class ModelFiles:
    """A text model as its folder describes it, with its served tokenizer (the fp32 module is built separately)."""

    info: TextModelFolder
    tokenizer: ServedTokenizer


def read_model_files(model_dir: str | os.PathLike[str], kind: str | None = None) -> ModelFiles:
    """Inspect a staged folder (refusing what cannot be served) and load its served tokenizer."""
    from dataclasses import replace

    info = inspect_folder(model_dir, kind)
    tokenizer = load_served_tokenizer(model_dir, info)
    return ModelFiles(replace(info, pad_id=tokenizer.pad_id), tokenizer)


def load_sentence_encoder(model_dir: str | os.PathLike[str]) -> nn.Module:
    """The fp32 model of a staged folder in eval mode (benchmarks and tests build backends from it)."""
    return build_module(model_dir, read_model_files(model_dir).info)
