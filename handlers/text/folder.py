"""What a model folder says about itself: read once, checked once, the same way at package time and in the worker.

A text model is a Hugging Face folder (``config.json``, safetensors weights, a tokenizer) of one of two kinds:

- ``embedding``: a sentence-transformers folder. ``modules.json`` lists Transformer -> Pooling [-> Normalize];
  ``1_Pooling/config.json`` names the pooling mode(s); ``sentence_bert_config.json`` the token limit and lower-casing;
  ``config_sentence_transformers.json`` the named prompts. The served vector is what ``SentenceTransformer.encode``
  returns for the same text.
- ``classification``: an ``AutoModelForSequenceClassification`` folder (``id2label``, ``problem_type``): a text
  classifier, an NLI model over text pairs, or a cross-encoder reranker (one output, scored with a sigmoid as
  sentence-transformers' ``CrossEncoder`` does).

:func:`inspect_folder` returns a :class:`TextModelFolder` or raises :class:`FolderError`, whose message names the
file, the problem and the fix. The packaging step calls it before anything is written to the model store, so a folder
the worker could not serve (pickled weights, an unknown pooling mode, an architecture we do not implement, a tokenizer
that does not load offline) is refused there, not in a worker's log.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("embedding", "classification")
# Architectures served, by config.json model_type. bert runs on the project's plain-torch encoder
# (handlers/text/bert.py) where it computes the same thing; everything else runs transformers' own model.
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
# RoBERTa-style position ids start after the padding index: two positions are never available to tokens.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2}
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
SINGLE_LABEL, MULTI_LABEL, REGRESSION, SCORE = (
    "single_label_classification",
    "multi_label_classification",
    "regression",
    "score",
)
WEIGHTS = "model.safetensors"
SHARDED_WEIGHTS = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
MAX_PROMPT_CHARS = 1000  # a named prompt is the model's, but it is prepended to every text that names it


class FolderError(ValueError):
    """A model folder that cannot be served; the message names the file, the problem and the fix."""

    def __init__(self, file: str, problem: str, fix: str) -> None:
        super().__init__(f"{file}: {problem}. Fix: {fix}")
        self.file = file


@dataclass(frozen=True)
class TextModelFolder:
    """Everything the worker needs to know about a text model, as its folder says it."""

    kind: str  # "embedding" | "classification"
    model_type: str  # config.json model_type
    engine: str  # "bert" (the project's plain-torch encoder) | "transformers"
    transformer_dir: str  # folder (relative to the model folder) holding config.json, weights and tokenizer
    max_tokens: int  # texts (and pairs) are truncated to this many tokens, special tokens included
    max_positions: int  # what the model's position embeddings allow
    pad_id: int
    token_types: bool  # the model takes token_type_ids (BERT over text pairs)
    lowercase: bool  # sentence_bert_config.json do_lower_case: the text is lower-cased before tokenizing
    output_size: int  # floats per row: the embedding dimension, or the number of labels
    # embedding
    pooling: tuple[str, ...] = ()
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # classification
    labels: tuple[str, ...] = ()
    problem_type: str = ""
    activation: str = ""  # what turns logits into the answer's scores: softmax | sigmoid | identity

    def describe(self) -> dict[str, Any]:
        common = {
            "kind": self.kind,
            "architecture": self.model_type,
            "engine": self.engine,
            "max_tokens": self.max_tokens,
        }
        if self.kind == "embedding":
            return {
                **common,
                "dimension": self.output_size,
                "pooling": list(self.pooling),
                "normalize": self.normalize,
                "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name,
            }
        return {
            **common,
            "labels": list(self.labels),
            "problem_type": self.problem_type,
            "activation": self.activation,
        }


def read_json(folder: Path, relative: str) -> Any:
    path = folder / relative
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as error:
        raise FolderError(
            relative, f"is not readable JSON ({error})", "restore the file the training run saved"
        ) from None


def inspect_folder(folder: str | os.PathLike[str], kind: str) -> TextModelFolder:
    """Read and check a model folder of ``kind``; raises FolderError naming the file and the fix."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FolderError(str(folder), "is not a folder", "pass the folder your training run saved the model to")
    transformer_dir = transformer_folder(folder) if kind == "embedding" else ""
    base = folder / transformer_dir
    where = f"{transformer_dir}/" if transformer_dir else ""
    config = required_json(base, "config.json", where, "save the model with save_pretrained (it writes config.json)")
    model_type = str(config.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise FolderError(
            f"{where}config.json",
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
            "serve a model of a supported architecture, or add one (docs/your-model.md, 'Architectures')",
        )
    check_weights(base, where)
    tokenizer_config = optional_json(base, "tokenizer_config.json")
    max_positions = positions(config, model_type, where)
    if kind == "embedding":
        return embedding_folder(folder, transformer_dir, config, model_type, max_positions, tokenizer_config)
    return classification_folder(folder, config, model_type, max_positions, tokenizer_config)


def transformer_folder(folder: Path) -> str:
    """The Transformer module's folder from modules.json; refuses modules we do not compute."""
    modules = required_json(folder, "modules.json", "", "save the model with sentence-transformers' save()")
    if not isinstance(modules, list) or not modules:
        raise FolderError("modules.json", "must be a non-empty list of modules", "save it with sentence-transformers")
    names = [module_name(entry) for entry in modules]
    allowed = ["Transformer", "Pooling", "Normalize"]
    unsupported = [name for name in names if name not in allowed]
    if unsupported or names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        raise FolderError(
            "modules.json",
            f"modules {names} are not supported (served: Transformer -> Pooling [-> Normalize])",
            "serve a model with only those modules (a Dense or other extra module would be skipped and change "
            "every vector)",
        )
    return str(modules[0].get("path", "") or "")


def module_name(entry: Any) -> str:
    """'Transformer' for any spelling of sentence-transformers' module type ('sentence_transformers.models.X')."""
    kind = entry.get("type", "") if isinstance(entry, dict) else ""
    return str(kind).rsplit(".", 1)[-1]


def required_json(folder: Path, name: str, where: str, fix: str) -> Any:
    try:
        return read_json(folder, name)
    except FileNotFoundError:
        raise FolderError(f"{where}{name}", "is missing", fix) from None


def optional_json(folder: Path, name: str) -> dict[str, Any]:
    try:
        value = read_json(folder, name)
    except FileNotFoundError:
        return {}
    return value if isinstance(value, dict) else {}


def check_weights(folder: Path, where: str) -> None:
    """safetensors weights (one file or an index of shards), never a pickle."""
    if (folder / WEIGHTS).is_file():
        return
    if (folder / SHARDED_WEIGHTS).is_file():
        index = required_json(folder, SHARDED_WEIGHTS, where, "save the model again with save_pretrained")
        shards = sorted(set((index.get("weight_map") or {}).values())) if isinstance(index, dict) else []
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if not shards or missing:
            raise FolderError(
                f"{where}{SHARDED_WEIGHTS}",
                f"lists shards that are not in the folder: {missing or 'none listed'}",
                "copy every model-*.safetensors shard next to it",
            )
        return
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    if pickled:
        raise FolderError(
            f"{where}{pickled[0]}",
            "holds pickled weights, which are refused: loading a pickle can run arbitrary code",
            "convert them to safetensors where you trust the file, e.g. "
            "AutoModel.from_pretrained(folder).save_pretrained(folder, safe_serialization=True)",
        )
    raise FolderError(
        f"{where}{WEIGHTS}",
        "is missing: the folder has no weights",
        "save the trained model with save_pretrained (safetensors) into this folder",
    )


def positions(config: dict[str, Any], model_type: str, where: str) -> int:
    try:
        return int(config["max_position_embeddings"]) - POSITION_OFFSET.get(model_type, 0)
    except (KeyError, TypeError, ValueError):
        raise FolderError(
            f"{where}config.json", "has no integer max_position_embeddings", "save the config with save_pretrained"
        ) from None


def token_limit(declared: Any, tokenizer_config: dict[str, Any], max_positions: int, file: str) -> int:
    """The model's own token limit: what its folder declares, else the tokenizer's, capped by its positions."""
    if declared is not None:
        if type(declared) is not int or declared < 2:
            raise FolderError(file, f"max_seq_length {declared!r} is not an integer >= 2", "set a positive integer")
        if declared > max_positions:
            raise FolderError(
                file,
                f"max_seq_length {declared} exceeds the model's {max_positions} positions",
                f"set max_seq_length to at most {max_positions}",
            )
        return declared
    from_tokenizer = tokenizer_config.get("model_max_length")
    if type(from_tokenizer) is int and 2 <= from_tokenizer < max_positions:
        return from_tokenizer
    return max_positions


def pad_token(tokenizer_config: dict[str, Any], special: dict[str, Any]) -> str | None:
    for source in (tokenizer_config, special):
        value = source.get("pad_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            return value
    return None


def embedding_folder(
    folder: Path,
    transformer_dir: str,
    config: dict[str, Any],
    model_type: str,
    max_positions: int,
    tokenizer_config: dict[str, Any],
) -> TextModelFolder:
    where = f"{transformer_dir}/" if transformer_dir else ""
    st_config = optional_json(folder / transformer_dir, "sentence_bert_config.json")
    max_tokens = token_limit(
        st_config.get("max_seq_length"), tokenizer_config, max_positions, f"{where}sentence_bert_config.json"
    )
    modules = read_json(folder, "modules.json")
    pooling_path = str(modules[1].get("path") or "1_Pooling")
    modes, dimension = pooling_modes(folder, pooling_path)
    hidden = int(config.get("hidden_size") or config.get("dim") or 0)
    if dimension != hidden:
        raise FolderError(
            f"{pooling_path}/config.json",
            f"embedding dimension {dimension} differs from the model's hidden size {hidden} (config.json)",
            "save the model and its pooling config from the same sentence-transformers model",
        )
    prompts, default_prompt = read_prompts(folder)
    return TextModelFolder(
        kind="embedding",
        model_type=model_type,
        engine="bert" if plain_bert(config) else "transformers",
        transformer_dir=transformer_dir,
        max_tokens=max_tokens,
        max_positions=max_positions,
        pad_id=-1,  # resolved from the tokenizer by resolve_pad_id
        token_types=False,  # one text per row: token type 0 everywhere, the models' default
        lowercase=bool(st_config.get("do_lower_case", False)),
        output_size=dimension * len(modes),
        pooling=modes,
        normalize=len(modules) == 3,
        prompts=prompts,
        default_prompt_name=default_prompt,
    )


def plain_bert(config: dict[str, Any]) -> bool:
    """The plain-torch encoder computes exactly this config (handlers/text/bert.py check_bert_config)."""
    from handlers.text.bert import check_bert_config

    if config.get("model_type") != "bert":
        return False
    try:
        check_bert_config(config)
    except (ValueError, KeyError, TypeError):
        return False
    return True


def pooling_modes(folder: Path, pooling_path: str) -> tuple[tuple[str, ...], int]:
    """(modes in concatenation order, the token embedding dimension) from the Pooling module's config.json."""
    file = f"{pooling_path}/config.json"
    config = required_json(
        folder / pooling_path, "config.json", f"{pooling_path}/", "save the model with sentence-transformers"
    )
    if not isinstance(config, dict):
        raise FolderError(file, "must be a JSON object", "save it with sentence-transformers")
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
    if config.get("include_prompt", True) is not True:
        raise FolderError(
            file,
            "include_prompt false (prompt tokens left out of the pooling) is not supported",
            "serve the model with include_prompt true, or without prompts",
        )
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if type(dimension) is not int or dimension < 1:
        raise FolderError(file, f"embedding dimension {dimension!r} is not a positive integer", "save it again")
    return modes, dimension


def read_prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    """Named prompts (config_sentence_transformers.json 'prompts') and the default prompt name."""
    file = "config_sentence_transformers.json"
    config = optional_json(folder, file)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(name, str) and isinstance(text, str) and len(text) <= MAX_PROMPT_CHARS
        for name, text in prompts.items()
    ):
        raise FolderError(
            file, f"'prompts' must map names to strings of at most {MAX_PROMPT_CHARS} characters", "fix the map"
        )
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise FolderError(
            file, f"default_prompt_name {default!r} is not one of the prompts {sorted(prompts)}", "name a prompt"
        )
    return dict(prompts), default


def classification_folder(
    folder: Path, config: dict[str, Any], model_type: str, max_positions: int, tokenizer_config: dict[str, Any]
) -> TextModelFolder:
    architectures = config.get("architectures") or []
    if not any(str(name).endswith("ForSequenceClassification") for name in architectures):
        raise FolderError(
            "config.json",
            f"architectures {architectures} has no *ForSequenceClassification head",
            "save the fine-tuned AutoModelForSequenceClassification (save_pretrained), not the base model",
        )
    id2label = config.get("id2label") or {}
    try:
        labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
    except (TypeError, ValueError):
        raise FolderError(
            "config.json", "id2label keys must be 0..n-1", "save the model with save_pretrained"
        ) from None
    if not labels or [int(key) for key in sorted(id2label, key=int)] != list(range(len(labels))):
        raise FolderError("config.json", "id2label must map 0..n-1 to label names", "set id2label before saving")
    # One output without a stated problem_type is a scorer (a cross-encoder): its activation says how it is read.
    problem_type = config.get("problem_type") or (SINGLE_LABEL if len(labels) > 1 else SCORE)
    if problem_type not in (SINGLE_LABEL, MULTI_LABEL, REGRESSION, SCORE):
        raise FolderError("config.json", f"problem_type {problem_type!r} is unknown", "use a transformers problem_type")
    activation = score_activation(folder, config, len(labels), problem_type)
    max_tokens = token_limit(None, tokenizer_config, max_positions, "tokenizer_config.json")
    return TextModelFolder(
        kind="classification",
        model_type=model_type,
        engine="transformers",
        transformer_dir="",
        max_tokens=max_tokens,
        max_positions=max_positions,
        pad_id=-1,
        token_types=model_type == "bert",  # the second text of a pair is segment 1 (distilbert/roberta have none)
        lowercase=False,
        output_size=len(labels),
        labels=labels,
        problem_type=problem_type,
        activation=activation,
    )


def score_activation(folder: Path, config: dict[str, Any], labels: int, problem_type: str) -> str:
    """softmax over labels for a single-label classifier, a sigmoid per label for multi-label, and for a one-output
    model (a cross-encoder reranker) what sentence-transformers' CrossEncoder applies: its saved activation_fn
    (config_sentence_transformers.json), by default a sigmoid; an explicit regression head answers its raw value."""
    if labels > 1:
        return "sigmoid" if problem_type == MULTI_LABEL else "softmax"
    if config.get("problem_type") == REGRESSION:
        return "identity"
    saved = optional_json(folder, "config_sentence_transformers.json").get("activation_fn")
    if saved is None:
        saved = (config.get("sentence_transformers") or {}).get("activation_fn")
    if saved is None or str(saved).endswith("Sigmoid"):
        return "sigmoid"
    if str(saved).endswith("Identity"):
        return "identity"
    raise FolderError(
        "config_sentence_transformers.json",
        f"activation_fn {saved!r} is not supported (Sigmoid or Identity)",
        "save the cross-encoder with the default activation",
    )


def resolve_pad_id(folder: Path, info: TextModelFolder, tokenizer: Any) -> TextModelFolder:
    """The padding token's id, from the tokenizer's own files (RoBERTa pads with 1, BERT with 0)."""
    from dataclasses import replace

    base = folder / info.transformer_dir
    token = pad_token(optional_json(base, "tokenizer_config.json"), optional_json(base, "special_tokens_map.json"))
    pad_id = tokenizer.token_to_id(token) if token is not None else None
    if pad_id is None:
        config_pad = optional_json(base, "config.json").get("pad_token_id")
        pad_id = config_pad if type(config_pad) is int else None
    if pad_id is None:
        raise FolderError(
            "tokenizer_config.json", "names no pad_token the tokenizer knows", "save the tokenizer with its pad token"
        )
    return replace(info, pad_id=int(pad_id))
