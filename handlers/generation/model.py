"""The generator's model folder inside the archive: any Hugging Face causal LM (config, safetensors weights,
tokenizer), loaded with what serving it needs and checked against the ``handler:`` config.

The request limits come from the ``handler:`` config; ``max_prompt_tokens`` and ``max_new_tokens`` may be ``auto``,
resolved from the folder's ``config.json`` (:mod:`handlers.generation.limits`, the same check the packaging step
runs), so a model with fewer positions than the shipped limits assume is served with smaller limits, not refused.

The archive's ``model_info.json`` (optional) names the model and says where its weights come from (the demo's are
random); answers show the name and the weights' origin, ``describe`` also the source.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.base import Loaded
from handlers.core.config import ConfigError
from handlers.generation.decoding import stop_token_ids
from handlers.generation.limits import ModelPositions, read_positions, resolve_token_limits
from handlers.generation.requests import GenerationLimits


@dataclass
class LoadedGenerator(Loaded):
    tokenizer: Any  # the model's Hugging Face tokenizer
    info: dict[str, str]  # {name, weights}: shown in every answer
    source: Any  # where the weights came from (model_info.json's "source"): shown by describe only
    limits: GenerationLimits
    stop_token_ids: list[int]
    pad_token_id: int  # masked out wherever it is used


def load_generator(model_dir: str, config: dict[str, Any], model_name: str) -> LoadedGenerator:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    path = os.path.join(model_dir, config["model_subdir"])
    if not os.path.isdir(path):
        raise ConfigError(f"handler.model_subdir: {path} is not a folder in the archive")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True, dtype=torch.float32)
    info, source = read_model_info(model_dir, config["info_file"], model_name)
    stop_ids = stop_token_ids(getattr(model, "generation_config", None), tokenizer)
    pad = tokenizer.pad_token_id
    positions = read_positions(path, f"{config['model_subdir']}/config.json", model.config)
    return LoadedGenerator(
        model=model,
        tokenizer=tokenizer,
        info=info,
        source=source,
        limits=generation_limits(config, model.config, tokenizer, positions),
        stop_token_ids=stop_ids,
        pad_token_id=pad if pad is not None else (stop_ids or [0])[0],
    )


def read_model_info(model_dir: str, info_file: str, model_name: str) -> tuple[dict[str, str], Any]:
    """({name, weights} shown in every answer, where the weights came from: shown by describe only)."""
    written = {}
    path = os.path.join(model_dir, info_file)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            written = json.load(file)
    info = {"name": str(written.get("name") or model_name), "weights": str(written.get("weights") or "user-supplied")}
    return info, written.get("source")


def generation_limits(
    config: dict[str, Any], model_config: Any, tokenizer: Any, positions: ModelPositions
) -> GenerationLimits:
    """The request limits from the config (``auto`` resolved from the model's positions), refused when they do not
    fit the model."""
    tokens = resolve_token_limits(config, positions, "model-config.yaml")
    # A token stands for at most its longest vocabulary entry (+1 for a space a decoder may add), so a prompt
    # longer than this cannot fit the token limit: refuse it without tokenizing megabytes.
    longest_entry = max(len(entry) for entry in tokenizer.get_vocab())
    return GenerationLimits(
        max_prompt_tokens=tokens.max_prompt_tokens,
        max_new_tokens=tokens.max_new_tokens,
        default_max_new_tokens=tokens.default_max_new_tokens,
        max_temperature=config["max_temperature"],
        vocab_size=model_config.vocab_size,
        max_prompt_chars=(longest_entry + 1) * tokens.max_prompt_tokens,
        positions=tokens.positions,
        auto=tokens.auto,
        max_n=config["max_n"],
    )
