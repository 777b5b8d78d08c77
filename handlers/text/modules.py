"""sentence-transformers' module chain, as a model folder saves it, computed by the project's own torch steps.

``modules.json`` lists the modules a sentence-transformers model runs in order: a ``Transformer`` first, then what turns
its token states into the answer. Each module has its own folder with a ``config.json`` (and ``model.safetensors``
where it has weights). :func:`read_chain` reads that list into typed specs, refusing a module the project does not
compute (naming it and its folder); :func:`build_steps` turns the specs into torch modules that run inside the served
model's ``forward``, so every backend (eager, compiled, OpenVINO) and the accuracy gate compute exactly the whole chain.

The steps pass ``(tokens, sentence)`` along: token states ``[rows, length, width]`` and, after pooling, one row per
text ``[rows, width]``. They compute what sentence-transformers' modules compute on right-padded rows (the served path
always pads on the right; the parity check at package time compares with sentence-transformers itself):

- ``Pooling``: the folder's modes (cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken) concatenated in
  sentence-transformers' order; with ``include_prompt: false`` the prompt's tokens are left out of the pooling.
- ``Dense``: a linear layer with its activation function (a ``torch.nn`` activation class, as saved), on the pooled
  row or on every token, with the optional residual connection.
- ``LayerNorm`` and ``Normalize`` (L2, on the row or on every token), where they stand in the chain.
- ``SpladePooling``: log(1 + relu(logits)) of a masked-language-model head, max- or sum-pooled over the tokens.
- ``MultiVectorMask``: which tokens a multi-vector model scores with (skip-listed words dropped for documents); it
  changes no vector, so it is read here and applied when the answer is formed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from handlers.text.folder import FolderError, check_module_weights, optional_json, required_json
from handlers.text.head import (
    DenseModule,
    HeadModule,
    LayerNormModule,
    MultiVectorMaskModule,
    NormalizeModule,
    PoolingModule,
    SpladeModule,
)

# sentence-transformers' pooling modes, in the order it concatenates them (sentence_transformer/modules/pooling.py).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Activation functions a Dense module may name: classes of these torch modules, built without arguments.
ACTIVATION_MODULES = ("torch.nn.modules.activation", "torch.nn.modules.linear")
SENTENCE, TOKENS = "sentence_embedding", "token_embeddings"  # what a module reads and writes (its input name)
# transformer_task -> (the transformers class family its model loads with, the output it reads)
TRANSFORMER_TASKS = {
    "feature-extraction": ("AutoModel", "last_hidden_state"),
    "fill-mask": ("AutoModelForMaskedLM", "logits"),
    "sequence-classification": ("AutoModelForSequenceClassification", "logits"),
}


@dataclass(frozen=True)
class TransformerModule:
    """The first module: the Hugging Face model, its folder, task and token limits."""

    path: str  # folder relative to the model folder ('' = the model folder itself)
    task: str  # feature-extraction | fill-mask | sequence-classification
    max_seq_length: int | None
    lowercase: bool
    task_lengths: dict[str, int] = field(default_factory=dict)  # multi-vector: query_length / document_length


def module_name(entry: Any) -> str:
    """'Transformer' for any spelling of a module type ('sentence_transformers.models.X', '...modules.x.X')."""
    kind = entry.get("type", "") if isinstance(entry, dict) else ""
    return str(kind).rsplit(".", 1)[-1]


def read_modules_list(folder: Path) -> list[dict[str, Any]]:
    modules = required_json(folder, "modules.json", "", "save the model with sentence-transformers' save()")
    if not isinstance(modules, list) or not modules or not all(isinstance(entry, dict) for entry in modules):
        raise FolderError("modules.json", "must be a non-empty list of modules", "save it with sentence-transformers")
    return modules


def read_chain(folder: Path) -> tuple[TransformerModule, tuple[HeadModule, ...]]:
    """The Transformer module and the modules after it, as ``modules.json`` orders them."""
    modules = read_modules_list(folder)
    first = module_name(modules[0])
    if first not in ("Transformer", "MLMTransformer"):
        raise FolderError(
            "modules.json",
            f"the first module is {first!r}, not a Transformer",
            "serve a sentence-transformers model whose first module is a Hugging Face Transformer (static "
            "embeddings and Router modules are not served)",
        )
    transformer = read_transformer(folder, modules[0], mlm=first == "MLMTransformer")
    head = tuple(read_head_module(folder, entry) for entry in modules[1:])
    return transformer, head


def module_path(entry: dict[str, Any]) -> str:
    path = str(entry.get("path") or "")
    if path.startswith(("/", "\\")) or ".." in Path(path).parts:
        raise FolderError("modules.json", f"module path {path!r} leaves the model folder", "use relative folders")
    return path


def read_transformer(folder: Path, entry: dict[str, Any], mlm: bool) -> TransformerModule:
    path = module_path(entry)
    where = f"{path}/" if path else ""
    config = optional_json(folder / path, "sentence_bert_config.json")
    task = str(config.get("transformer_task") or ("fill-mask" if mlm else "feature-extraction"))
    if task not in TRANSFORMER_TASKS:
        raise FolderError(
            f"{where}sentence_bert_config.json",
            f"transformer_task {task!r} is not served (served: {', '.join(TRANSFORMER_TASKS)})",
            "serve an encoder model (generative rerankers and multimodal models are not served)",
        )
    if config.get("query_expansion") is not None:
        raise FolderError(
            f"{where}sentence_bert_config.json",
            "query_expansion (ColBERT-style padding of queries with expansion tokens) is not computed by the served "
            "path",
            "serve the model without query_expansion (set it to null), or with sentence-transformers itself",
        )
    lengths = {}
    for task_name in ("query", "document"):
        value = config.get(f"{task_name}_length")
        if value is not None:
            if type(value) is not int or value < 2:
                raise FolderError(
                    f"{where}sentence_bert_config.json", f"{task_name}_length {value!r} is not an integer >= 2", "fix"
                )
            lengths[task_name] = value
    declared = config.get("max_seq_length")
    return TransformerModule(
        path=path,
        task=task,
        max_seq_length=declared if declared is not None else None,
        lowercase=bool(config.get("do_lower_case", False)),
        task_lengths=lengths,
    )


def read_head_module(folder: Path, entry: dict[str, Any]) -> HeadModule:
    name = module_name(entry)
    path = module_path(entry)
    reader = HEAD_READERS.get(name)
    if reader is None:
        raise FolderError(
            "modules.json",
            f"module {name!r} ({path or 'the model folder'}) is not computed by the served path (served after the "
            f"Transformer: {', '.join(HEAD_READERS)})",
            "serve a model with only those modules: skipping one would change every answer",
        )
    config = optional_json(folder / path, "config.json") if path else {}
    return reader(folder, path, config)


def read_pooling(folder: Path, path: str, config: dict[str, Any]) -> PoolingModule:
    file = f"{path}/config.json"
    if not config:
        config = required_json(folder / path, "config.json", f"{path}/", "save the model with sentence-transformers")
    fix = f"use one of {', '.join(POOLING_MODES)}"
    if "pooling_mode" in config:
        named = config["pooling_mode"]
        listed = [named] if isinstance(named, str) else named
        if not isinstance(listed, list) or not listed or any(mode not in POOLING_MODES for mode in listed):
            raise FolderError(file, f"pooling mode {named!r} is unknown", fix)
        modes = tuple(mode for mode in POOLING_MODES if mode in listed)
    else:
        unknown = sorted(
            key for key, value in config.items() if key.startswith("pooling_mode") and key not in LEGACY_POOLING_KEYS
        )
        if unknown:
            raise FolderError(file, f"pooling mode {unknown[0]!r} is unknown", fix)
        modes = tuple(mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key) is True) or ("mean",)
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if type(dimension) is not int or dimension < 1:
        raise FolderError(file, f"embedding dimension {dimension!r} is not a positive integer", "save it again")
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise FolderError(file, f"include_prompt {include_prompt!r} is not true or false", "save it again")
    return PoolingModule(path, modes, include_prompt, dimension)


def activation_class(name: Any, file: str) -> type[nn.Module]:
    """The torch.nn activation class a Dense module names; anything else is refused (no code is imported)."""
    module_path, _, class_name = str(name).rpartition(".")
    if module_path not in ACTIVATION_MODULES:
        raise FolderError(
            file,
            f"activation_function {name!r} is not a torch.nn activation",
            "save the Dense module with a torch.nn activation (e.g. torch.nn.modules.activation.Tanh)",
        )
    found = getattr(importlib.import_module(module_path), class_name, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise FolderError(file, f"activation_function {name!r} is not a torch.nn module class", "save it again")
    return found


def read_dense(folder: Path, path: str, config: dict[str, Any]) -> DenseModule:
    file = f"{path}/config.json"
    in_features, out_features = config.get("in_features"), config.get("out_features")
    if not (type(in_features) is int and in_features > 0 and type(out_features) is int and out_features > 0):
        raise FolderError(
            file, f"in_features/out_features {in_features}/{out_features} are not positive integers", "save it again"
        )
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    activation_class(activation, file)
    target = config.get("module_input_name", SENTENCE)
    if target not in (SENTENCE, TOKENS) or config.get("module_output_name", target) != target:
        raise FolderError(
            file,
            f"module_input_name/module_output_name {target!r}/{config.get('module_output_name')!r} are not served",
            f"serve a Dense that maps {SENTENCE} or {TOKENS} onto itself",
        )
    check_module_weights(folder / path, f"{path}/")
    return DenseModule(
        path,
        in_features,
        out_features,
        bool(config.get("bias", True)),
        str(activation),
        target,
        bool(config.get("use_residual", False)),
    )


def read_layer_norm(folder: Path, path: str, config: dict[str, Any]) -> LayerNormModule:
    dimension = config.get("dimension")
    if type(dimension) is not int or dimension < 1:
        raise FolderError(f"{path}/config.json", f"dimension {dimension!r} is not a positive integer", "save it again")
    check_module_weights(folder / path, f"{path}/")
    return LayerNormModule(path, dimension)


def read_normalize(folder: Path, path: str, config: dict[str, Any]) -> NormalizeModule:
    target = config.get("module_input_name", SENTENCE)
    if target not in (SENTENCE, TOKENS) or config.get("module_output_name", target) != target:
        raise FolderError(f"{path}/config.json", f"Normalize of {target!r} is not served", "normalize one of those")
    return NormalizeModule(path, target)


def read_splade(folder: Path, path: str, config: dict[str, Any]) -> SpladeModule:
    file = f"{path}/config.json"
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise FolderError(
            file, f"pooling_strategy {strategy!r} / activation_function {activation!r} are unknown", "save it again"
        )
    return SpladeModule(path, strategy, activation)


def read_multi_vector_mask(folder: Path, path: str, config: dict[str, Any]) -> MultiVectorMaskModule:
    file = f"{path}/config.json"
    if config.get("keep_only_token_ids") is not None:
        raise FolderError(file, "keep_only_token_ids (image-patch documents) is not served", "serve a text model")
    words = config.get("skiplist_words") or []
    tasks = config.get("skiplist_tasks", ["document"])
    tasks = [tasks] if isinstance(tasks, str) else tasks
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)) or not (
        isinstance(tasks, list) and all(isinstance(t, str) for t in tasks)
    ):
        raise FolderError(file, "skiplist_words and skiplist_tasks must be lists of strings", "save it again")
    return MultiVectorMaskModule(path, tuple(words), tuple(tasks))


HEAD_READERS: dict[str, Callable[[Path, str, dict[str, Any]], HeadModule]] = {
    "Pooling": read_pooling,
    "Dense": read_dense,
    "LayerNorm": read_layer_norm,
    "Normalize": read_normalize,
    "SpladePooling": read_splade,
    "MultiVectorMask": read_multi_vector_mask,
}


# --------------------------------------------------------------------------------------------------- torch steps
def masked_hidden(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return hidden.to(torch.float32), mask.unsqueeze(-1).to(torch.float32)


class Pooling(nn.Module):
    """sentence-transformers' pooling of right-padded rows, in fp32; modes concatenated in its order."""

    def __init__(self, modes: tuple[str, ...], include_prompt: bool) -> None:
        super().__init__()
        self.modes = modes
        self.include_prompt = include_prompt

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: torch.Tensor | None
    ) -> torch.Tensor:
        mask = attention_mask
        if not self.include_prompt and prompt_lengths is not None:
            positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
            mask = mask * (positions >= prompt_lengths.unsqueeze(1)).to(mask.dtype)
        hidden, weights = masked_hidden(tokens, mask)
        pieces = []
        for mode in self.modes:
            if mode == "cls":  # the first pooled token (after the prompt where it is left out)
                first = mask.to(torch.int32).argmax(dim=1)
                pieces.append(torch.gather(hidden, 1, first.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1))
            elif mode == "max":
                pieces.append(hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values)
            elif mode in ("mean", "mean_sqrt_len_tokens"):
                counts = weights.sum(dim=1).clamp(min=1e-9)
                pieces.append((hidden * weights).sum(dim=1) / (counts if mode == "mean" else counts.sqrt()))
            elif mode == "weightedmean":
                positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=torch.float32)
                weighted = weights * positions.view(1, -1, 1)
                pieces.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
            else:  # lasttoken: the last real token of a right-padded row
                last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
                index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
                pieces.append(torch.gather(hidden * weights, 1, index).squeeze(1))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


class Dense(nn.Module):
    """A linear layer and its activation (parameter names as saved: ``linear.*``, ``residual.weight``); computed in
    its weights' precision, answered in fp32."""

    def __init__(self, spec: DenseModule) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = activation_class(spec.activation, f"{spec.path}/config.json")()
        self.use_residual = spec.residual
        self.project_residual = spec.residual and spec.in_features != spec.out_features
        if self.project_residual:
            self.residual = nn.Linear(spec.in_features, spec.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.linear.weight.dtype)
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if self.project_residual else x)
        return out.to(torch.float32)


class LayerNorm(nn.Module):
    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dimension)  # the saved parameter names: norm.weight, norm.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.to(self.norm.weight.dtype)).to(torch.float32)


class Normalize(nn.Module):
    """L2 normalisation of the last dimension, in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x.to(torch.float32), p=2.0, dim=-1)


class Splade(nn.Module):
    """SPLADE pooling of masked-LM logits [rows, length, vocabulary] -> [rows, vocabulary] weights (fp32).

    For max pooling the maximum is taken first: log1p and relu do not change which token is largest, so the
    [rows, length, vocabulary] tensor is never transformed (or widened to fp32) as a whole."""

    def __init__(self, strategy: str, activation: str) -> None:
        super().__init__()
        self.strategy = strategy
        self.double_log = activation == "log1p_relu"

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.log1p(torch.relu(x.to(torch.float32)))
        return torch.log1p(x) if self.double_log else x

    def forward(self, logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        masked = logits * attention_mask.unsqueeze(-1).to(logits.dtype)
        if self.strategy == "max":
            return self.activate(masked.max(dim=1).values)
        return self.activate(masked).sum(dim=1)


def load_module_weights(module: nn.Module, folder: Path) -> None:
    from safetensors.torch import load_file

    module.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)


class Head(nn.Module):
    """The chain after the Transformer: token states (or logits) in, the answer's rows (or tokens) out, in fp32."""

    def __init__(self, folder: Path, modules: tuple[HeadModule, ...]) -> None:
        super().__init__()
        self.specs = modules
        steps: list[nn.Module] = []
        for spec in modules:
            if isinstance(spec, PoolingModule):
                steps.append(Pooling(spec.modes, spec.include_prompt))
            elif isinstance(spec, DenseModule):
                dense = Dense(spec)
                load_module_weights(dense, folder / spec.path)
                steps.append(dense)
            elif isinstance(spec, LayerNormModule):
                norm = LayerNorm(spec.dimension)
                load_module_weights(norm, folder / spec.path)
                steps.append(norm)
            elif isinstance(spec, SpladeModule):
                steps.append(Splade(spec.strategy, spec.activation))
            elif isinstance(spec, NormalizeModule):
                steps.append(Normalize())
            else:  # MultiVectorMask: applied when answering
                steps.append(nn.Identity())
        self.steps = nn.ModuleList(steps)

    def forward(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: torch.Tensor | None
    ) -> torch.Tensor:
        sentence: torch.Tensor | None = None
        for spec, step in zip(self.specs, self.steps, strict=True):
            if isinstance(spec, PoolingModule):
                sentence = step(tokens, attention_mask, prompt_lengths)
            elif isinstance(spec, SpladeModule):
                sentence = step(tokens, attention_mask)
            elif isinstance(spec, (DenseModule, LayerNormModule, NormalizeModule)):
                # The kinds accept a chain only where a module on the pooled row follows the pooling.
                if spec_target(spec) == SENTENCE and sentence is not None:
                    sentence = step(sentence)
                else:
                    tokens = step(tokens)
        return sentence if sentence is not None else tokens.to(torch.float32)


def spec_target(spec: HeadModule) -> str:
    return spec.target if isinstance(spec, (DenseModule, NormalizeModule)) else SENTENCE
