"""The generator's token limits: ``max_prompt_tokens`` and ``max_new_tokens`` from the ``handler:`` config, or
``auto`` from the model folder's own position limit, checked the same way at package time and in the worker.

``auto`` (the shipped value) is ``min(256, positions // 2)`` each, where ``positions`` is ``n_positions`` or
``max_position_embeddings`` in the model folder's ``config.json``: 256 and 256 for a 1024-position model, 128 and 128
for a 256-position one. An explicit integer is taken as is and must fit: prompt + output <= positions. A model whose
config names no position limit gets 256 for ``auto`` and no check. ``default_max_new_tokens`` must not exceed the
resolved ``max_new_tokens``.

:func:`resolve_token_limits` raises :class:`LimitsError` (a :class:`ConfigError`) whose message names the model's
file and key, the config file, and the fix; scripts/prepare_generator.py prints it and refuses to package, the worker
refuses to load with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from handlers.core.config import ConfigError, Option

AUTO = "auto"
AUTO_CAP = 256  # auto never goes above this, whatever the model allows (memory and time per request)
POSITION_KEYS = ("n_positions", "max_position_embeddings")  # GPT-2 style first, then most other architectures
TOKEN_LIMIT_KEYS = ("max_prompt_tokens", "max_new_tokens")


class AutoOrInt(Option):
    """An integer option that also takes ``auto`` (resolved from the model folder at load)."""

    def check(self, key: str, value: Any) -> Any:
        if value == AUTO:
            return AUTO
        if isinstance(value, str):
            self.refuse(key, f"expected {AUTO} or an integer, got {value!r}")
        return super().check(key, value)

    def allowed(self) -> str:
        return f"{AUTO} | {super().allowed()}"


class LimitsError(ConfigError):
    """Token limits that do not fit the model; the message names the files, the keys and the fix."""


@dataclass(frozen=True)
class ModelPositions:
    """The model's longest sequence (prompt + output), where it was read, or None when its config names none."""

    count: int | None
    key: str  # n_positions or max_position_embeddings ("" when none)
    file: str  # e.g. lm/config.json, as shown in messages

    def __str__(self) -> str:
        return f"{self.file} {self.key} {self.count}" if self.count is not None else f"{self.file} (no position limit)"


@dataclass(frozen=True)
class TokenLimits:
    max_prompt_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    positions: int | None
    auto: tuple[str, ...]  # the keys that were auto


def positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_positions(folder: str | os.PathLike[str], label: str, model_config: Any = None) -> ModelPositions:
    """The position limit in ``folder``/config.json (``label`` names that file in messages); keys the file leaves out
    are looked up on ``model_config`` (a loaded transformers config, which has the architecture's defaults)."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as file:
        return positions_in(json.load(file), label, model_config)


def positions_in(written: Any, label: str, model_config: Any = None) -> ModelPositions:
    """The position limit in a parsed config.json (e.g. read from an archive), else on ``model_config``."""
    found = [(key, positive_int(written.get(key) if isinstance(written, dict) else None)) for key in POSITION_KEYS]
    if model_config is not None:
        found += [(key, positive_int(getattr(model_config, key, None))) for key in POSITION_KEYS]
    for key, count in found:
        if count is not None:
            return ModelPositions(count, key, label)
    return ModelPositions(None, "", label)


def auto_tokens(positions: int | None) -> int:
    """What ``auto`` means for each of max_prompt_tokens and max_new_tokens."""
    return AUTO_CAP if positions is None else min(AUTO_CAP, positions // 2)


def resolve_token_limits(config: Mapping[str, Any], positions: ModelPositions, config_file: str) -> TokenLimits:
    """The served limits for a validated ``handler:`` section; refused when they do not fit the model."""
    auto = auto_tokens(positions.count)
    auto_keys = tuple(key for key in TOKEN_LIMIT_KEYS if config[key] == AUTO)
    if auto_keys and auto < 1:
        raise LimitsError(
            f"{positions.file}: {positions.key} {positions.count} leaves no room for a prompt and an answer "
            f"(auto gives {auto} tokens); this model cannot be served"
        )
    prompt, new = (auto if key in auto_keys else int(config[key]) for key in TOKEN_LIMIT_KEYS)
    if positions.count is not None and prompt + new > positions.count:

        def shown(key: str, value: int) -> str:
            return f"handler.{key} {value}{' (auto)' if key in auto_keys else ''}"

        raise LimitsError(
            f"{positions.file}: {positions.key} {positions.count} is too small for "
            f"{shown('max_prompt_tokens', prompt)} + {shown('max_new_tokens', new)} in {config_file} "
            f"({prompt + new} exceeds the model's {positions.count} positions); set them to {AUTO} "
            f"(min({AUTO_CAP}, positions // 2) each: {auto} here) or lower them to add up to at most {positions.count}"
        )
    default = int(config["default_max_new_tokens"])
    if default > new:
        origin = f", {AUTO} for {positions}" if "max_new_tokens" in auto_keys else ""
        raise LimitsError(
            f"handler.default_max_new_tokens ({default}) is above handler.max_new_tokens ({new}{origin}) in "
            f"{config_file}; lower handler.default_max_new_tokens to at most {new}"
        )
    return TokenLimits(
        max_prompt_tokens=prompt,
        max_new_tokens=new,
        default_max_new_tokens=default,
        positions=positions.count,
        auto=auto_keys,
    )


def with_resolved_limits(config: Mapping[str, Any], positions: ModelPositions, config_file: str) -> dict[str, Any]:
    """A validated ``handler:`` section with ``auto`` replaced by the served integers (for tools that read an
    archive's config and need the numbers its worker serves)."""
    limits = resolve_token_limits(config, positions, config_file)
    return {**config, "max_prompt_tokens": limits.max_prompt_tokens, "max_new_tokens": limits.max_new_tokens}
