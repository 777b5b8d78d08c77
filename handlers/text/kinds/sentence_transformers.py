"""What the kinds saved by sentence-transformers (embedding, sparse and multi-vector models) read alike: modules.json,
the Transformer module's folder and settings, the named prompts, the token limit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from handlers.text.folder import (
    FolderError,
    TextModelFolder,
    TransformerFiles,
    optional_json,
    read_prompts,
    read_transformer_files,
    token_limit,
)
from handlers.text.kinds.base import TextKind
from handlers.text.modules import TRANSFORMER_TASKS, HeadModule, TransformerModule, read_chain

MODEL_CONFIG = "config_sentence_transformers.json"


@dataclass(frozen=True)
class SavedModel:
    """A sentence-transformers folder as read: its Transformer, the modules after it, the model's files."""

    transformer: TransformerModule
    head: tuple[HeadModule, ...]
    files: TransformerFiles
    max_tokens: int
    max_positions: int
    prompts: dict[str, str]
    default_prompt_name: str | None
    model_config: dict[str, Any]


def hidden_width(config: dict[str, Any]) -> int | None:
    """The token states' width, under whichever name the architecture's config uses."""
    for key in ("hidden_size", "d_model", "dim", "n_embd", "embed_dim"):
        value = config.get(key)
        if type(value) is int and value > 0:
            return value
    return None


def plain_bert(config: dict[str, Any], task: str) -> bool:
    """The project's plain-torch encoder computes exactly this config's token states (handlers/text/bert.py)."""
    from handlers.text.bert import check_bert_config

    if config.get("model_type") != "bert" or task != "feature-extraction" or config.get("auto_map"):
        return False
    try:
        check_bert_config(config)
    except (ValueError, KeyError, TypeError):
        return False
    return True


class SentenceTransformersKind(TextKind):
    """A kind saved by sentence-transformers; a subclass checks its module chain and says what it outputs."""

    model_types: ClassVar[tuple[str, ...]]  # config_sentence_transformers.json model_type values of this kind
    task: ClassVar[str] = "feature-extraction"  # the Transformer task this kind's models use

    def read_saved(self, folder: Path, trust_remote_code: bool) -> SavedModel:
        transformer, head = read_chain(folder)
        where = f"{transformer.path}/" if transformer.path else ""
        if transformer.task != self.task:
            raise FolderError(
                f"{where}sentence_bert_config.json",
                f"transformer_task {transformer.task!r} is not what a {self.name} model runs ({self.task!r})",
                f"package the folder as the kind it is (handlers/text/kinds: its {MODEL_CONFIG} model_type)",
            )
        files = read_transformer_files(folder, transformer.path, trust_remote_code)
        max_tokens, max_positions = token_limit(
            transformer.max_seq_length,
            files.tokenizer_config,
            files.max_positions,
            f"{where}sentence_bert_config.json",
            where,
        )
        for task_name, length in transformer.task_lengths.items():
            if length > max_positions:
                raise FolderError(
                    f"{where}sentence_bert_config.json",
                    f"{task_name}_length {length} exceeds the model's {max_positions} positions",
                    f"set it to at most {max_positions}",
                )
        prompts, default_prompt = read_prompts(folder)
        return SavedModel(
            transformer,
            head,
            files,
            max_tokens,
            max_positions,
            prompts,
            default_prompt,
            optional_json(folder, MODEL_CONFIG),
        )

    def folder_info(self, saved: SavedModel, output_size: int, **kind_fields: Any) -> TextModelFolder:
        body_class, body_output = TRANSFORMER_TASKS[saved.transformer.task]
        config = saved.files.config
        return TextModelFolder(
            kind=self.name,
            model_type=saved.files.model_type,
            engine="bert" if plain_bert(config, saved.transformer.task) else "transformers",
            body_class=body_class,
            body_output=body_output,
            transformer_dir=saved.transformer.path,
            max_tokens=saved.max_tokens,
            max_positions=saved.max_positions,
            lowercase=saved.transformer.lowercase,
            output_size=output_size,
            head=saved.head,
            prompts=saved.prompts,
            default_prompt_name=saved.default_prompt_name,
            task_lengths=dict(saved.transformer.task_lengths),
            remote_code=saved.files.remote_code,
            **kind_fields,
        )

    def refuse_chain(self, saved: SavedModel, served: str) -> FolderError:
        names = ["Transformer", *(type(module).__name__.removesuffix("Module") for module in saved.head)]
        return FolderError(
            "modules.json",
            f"modules {names} are not computed as a {self.name} model (served: {served})",
            "serve a model with those modules; skipping or reordering one would change every answer",
        )

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        return {
            **super().describe(info),
            "modules": [type(module).__name__.removesuffix("Module") for module in info.head],
            "prompts": dict(info.prompts),
            "default_prompt_name": info.default_prompt_name,
        }
