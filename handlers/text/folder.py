"""What a model folder says about itself: read once, checked once, the same way at package time and in the worker.

A text model is a Hugging Face folder (``config.json``, safetensors weights, a tokenizer), bare or inside a
sentence-transformers layout (``modules.json`` and one folder per module). Its kind (an embedding model, a classifier,
a sparse or a multi-vector encoder: handlers/text/kinds/) reads its own files; this module holds what every kind
shares: JSON files, weights, the refusal of code shipped with the folder, the model's positions and token limit,
:class:`TextModelFolder` and :class:`FolderError`, whose message names the file, the problem and the fix. The entry
point, ``inspect_folder``, lives with the kinds (handlers/text/kinds/__init__.py), which this module sits below.

Architectures are not listed anywhere: whatever ``config.json``'s ``model_type`` is, transformers loads it (offline,
from the folder) and the packaging step proves the served answers equal to the reference library's before anything
reaches the model store.

What transformers itself decides when it loads the folder (which class the model loads as, which inputs its tokenizer
produces, the tokenizer exactly as it builds it) is recorded at package time in ``text_model.json`` (see
handlers/text/tokenization.py and scripts/prepare_text_model.py), so that the worker serves the same thing without
importing sentence-transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlers.text.head import HeadModule, PoolingModule

WEIGHTS = "model.safetensors"
SHARDED_WEIGHTS = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
SERVED_FILE = "text_model.json"  # what the packaging step learnt from transformers (kind, body class, inputs)
SERVED_FORMAT = 1
MAX_PROMPT_CHARS = 1000  # a named prompt is the model's, but it is prepended to every text that names it
# Position embeddings numbered from the padding index + 1 (RoBERTa's scheme): two positions never hold a token.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "mpnet": 2, "longformer": 2, "data2vec-text": 2}
# A limit this large is transformers' "no limit" marker in tokenizer_config.json, not a model's window.
NO_LIMIT = 1_000_000


class FolderError(ValueError):
    """A model folder that cannot be served; the message names the file, the problem and the fix."""

    def __init__(self, file: str, problem: str, fix: str) -> None:
        super().__init__(f"{file}: {problem}. Fix: {fix}")
        self.file = file


@dataclass(frozen=True)
class TextModelFolder:
    """Everything the worker needs to know about a text model, as its folder (and text_model.json) says it."""

    kind: str  # a name in handlers/text/kinds KINDS
    model_type: str  # config.json model_type
    engine: str  # "bert" (the project's plain-torch encoder) | "transformers"
    body_class: str  # the transformers class the model loads as (AutoModel, AutoModelForMaskedLM, T5EncoderModel...)
    body_output: str  # what the head reads from its output: last_hidden_state | logits
    transformer_dir: str  # folder (relative to the model folder) holding config.json, weights and tokenizer
    max_tokens: int  # texts (and pairs) are truncated to this many tokens, special tokens included
    max_positions: int  # what the model's position embeddings allow
    lowercase: bool  # sentence_bert_config.json do_lower_case: the text is lower-cased before tokenizing
    output_size: int  # floats per row (per token for a multi-vector model): dimension, labels or vocabulary
    head: tuple[HeadModule, ...] = ()  # the sentence-transformers modules after the Transformer
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    task_lengths: dict[str, int] = field(default_factory=dict)  # multi-vector: tokens of a query / a document
    labels: tuple[str, ...] = ()  # classification
    problem_type: str = ""
    activation: str = ""  # what turns logits into the answer's scores: softmax | sigmoid | identity
    truncate_dim: int | None = None  # the folder's config_sentence_transformers.json truncate_dim: rows are cut to it
    matryoshka_dims: tuple[int, ...] = ()  # sizes the folder says its vectors may be cut to (matryoshka_dimensions)
    max_active_dims: int | None = None  # sparse: weights kept per row (the folder's max_active_dims), None = all
    skiplist_words: tuple[str, ...] = ()  # multi-vector: tokens dropped from scoring ...
    skiplist_tasks: tuple[str, ...] = ()  # ... for texts of these tasks
    skiplist_ids: frozenset[int] = frozenset()  # the skip-listed words' token ids (resolved with the tokenizer)
    remote_code: bool = False  # the folder's own modelling code runs (trust_remote_code, opted in at packaging)
    input_names: tuple[str, ...] = ("input_ids", "attention_mask")  # what the model is fed, as transformers feeds it
    pad_id: int = -1  # resolved from the tokenizer
    normalized: bool = False  # every served row (or token vector) has unit length

    @property
    def model_inputs(self) -> tuple[str, ...]:
        """The served module's forward arguments, in order (handlers/text/model.py TextModule)."""
        # The plain-torch BERT computes single texts only (segment 0): it takes no token_type_ids.
        plain = self.engine == "bert"
        extra = tuple(n for n in self.input_names if n not in ("input_ids", "attention_mask") and not plain)
        prompts = ("prompt_lengths",) if self.excludes_prompt else ()
        return ("input_ids", "attention_mask", *extra, *prompts)

    @property
    def excludes_prompt(self) -> bool:
        return any(isinstance(module, PoolingModule) and not module.include_prompt for module in self.head)


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


def pickled_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))


def refuse_pickle(file: str) -> FolderError:
    return FolderError(
        file,
        "holds pickled weights, which are refused: loading a pickle can run arbitrary code",
        "convert them to safetensors where you trust the file, e.g. "
        "AutoModel.from_pretrained(folder).save_pretrained(folder, safe_serialization=True), or for a "
        "sentence-transformers module folder safetensors.torch.save_file(torch.load(file), 'model.safetensors')",
    )


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
    pickled = pickled_files(folder)
    if pickled:
        raise refuse_pickle(f"{where}{pickled[0]}")
    raise FolderError(
        f"{where}{WEIGHTS}",
        "is missing: the folder has no weights",
        "save the trained model with save_pretrained (safetensors) into this folder",
    )


def check_module_weights(folder: Path, where: str) -> None:
    """A sentence-transformers module folder's own weights (a Dense, a LayerNorm): model.safetensors only."""
    if (folder / WEIGHTS).is_file():
        return
    pickled = pickled_files(folder)
    if pickled:
        raise refuse_pickle(f"{where}{pickled[0]}")
    raise FolderError(f"{where}{WEIGHTS}", "is missing: the module has no weights", "save the model again")


def check_remote_code(config: dict[str, Any], where: str, trusted: bool) -> bool:
    """Whether the folder's own modelling code runs. A folder whose config.json maps classes to its own Python files
    (``auto_map``) is refused unless the packager opted in: that code would run in every worker."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return False
    if not trusted:
        entries = auto_map if isinstance(auto_map, dict) else {"auto_map": auto_map}
        shown = ", ".join(f"{key} -> {value}" for key, value in list(entries.items())[:3])
        raise FolderError(
            f"{where}config.json",
            f"auto_map ({shown}) names Python code shipped with the folder, which transformers would run to load "
            "the model (trust_remote_code)",
            "serve a model transformers implements itself, or, where you have read and trust that code, package "
            "with --var trust_remote_code=true (the code runs in every worker; the archive records it)",
        )
    return True


def positions(config: dict[str, Any], model_type: str, where: str) -> int | None:
    """Tokens the model's position embeddings hold, where config.json says (None for relative positions)."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if key not in config:
            continue
        value = config[key]
        if type(value) is not int or value <= POSITION_OFFSET.get(model_type, 0) + 1:
            raise FolderError(f"{where}config.json", f"{key} {value!r} is not a usable integer", "save it again")
        return value - POSITION_OFFSET.get(model_type, 0)
    return None


def token_limit(
    declared: Any, tokenizer_config: dict[str, Any], max_positions: int | None, file: str, where: str
) -> tuple[int, int]:
    """(the model's own token limit, its positions): what its folder declares, else the tokenizer's, capped by the
    positions; a model with relative positions (T5) needs one of the first two."""
    if declared is not None:
        if type(declared) is not int or declared < 2:
            raise FolderError(file, f"max_seq_length {declared!r} is not an integer >= 2", "set a positive integer")
        if max_positions is not None and declared > max_positions:
            raise FolderError(
                file,
                f"max_seq_length {declared} exceeds the model's {max_positions} positions",
                f"set max_seq_length to at most {max_positions}",
            )
        return declared, max_positions or declared
    from_tokenizer = tokenizer_config.get("model_max_length")
    if type(from_tokenizer) is int and 2 <= from_tokenizer < NO_LIMIT:
        if max_positions is None or from_tokenizer < max_positions:
            return from_tokenizer, max_positions or from_tokenizer
    if max_positions is None:
        raise FolderError(
            f"{where}tokenizer_config.json",
            "states no model_max_length, and config.json no max_position_embeddings",
            "set model_max_length in tokenizer_config.json (or max_seq_length in sentence_bert_config.json)",
        )
    return max_positions, max_positions


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


@dataclass(frozen=True)
class TransformerFiles:
    """What every kind reads from the Hugging Face model folder (the Transformer module's folder)."""

    config: dict[str, Any]
    model_type: str
    tokenizer_config: dict[str, Any]
    max_positions: int | None
    remote_code: bool
    where: str  # "" or "<dir>/", for messages


def read_transformer_files(folder: Path, transformer_dir: str, trust_remote_code: bool) -> TransformerFiles:
    base = folder / transformer_dir
    where = f"{transformer_dir}/" if transformer_dir else ""
    config = required_json(base, "config.json", where, "save the model with save_pretrained (it writes config.json)")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise FolderError(f"{where}config.json", "names no model_type", "save the config with save_pretrained")
    model_type = config["model_type"]
    remote = check_remote_code(config, where, trust_remote_code)
    check_weights(base, where)
    return TransformerFiles(
        config=config,
        model_type=model_type,
        tokenizer_config=optional_json(base, "tokenizer_config.json"),
        max_positions=positions(config, model_type, where),
        remote_code=remote,
        where=where,
    )


def read_served(folder: Path) -> dict[str, Any]:
    """text_model.json of a staged folder (what the packaging step learnt from transformers), or {}."""
    served = optional_json(folder, SERVED_FILE)
    if served and served.get("format") != SERVED_FORMAT:
        raise FolderError(
            SERVED_FILE, f"is format {served.get('format')!r}, not {SERVED_FORMAT}", "package the model again"
        )
    return served
