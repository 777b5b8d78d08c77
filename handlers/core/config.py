"""The ``handler:`` section of a model-config.yaml, described as data and validated once at load.

Every handler declares a schema (a dict of key -> :class:`Option`); :func:`validate` fills defaults, checks types and
ranges, and refuses unknown keys with a message that names the key and says what it is for. The packaging step runs
the same validation, so a bad config fails at build time instead of in a worker. :func:`options_table` renders a
schema for the docs, so the documented keys are the validated ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A model-config.yaml value that cannot be served; the message names the key."""


@dataclass(frozen=True)
class Option:
    kind: type
    default: Any
    choices: Sequence[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    help: str = ""  # what the key is for: shown in refusals and in the docs' options table
    # For a structured value (a dict): called after the type check as validator(option, key, value), returns the
    # value to use (defaults filled in) or refuses it through option.refuse.
    validator: Callable[[Option, str, Any], Any] | None = None

    def check(self, key: str, value: Any) -> Any:
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (self.kind is int and isinstance(value, bool)) or not isinstance(value, self.kind):
            self.refuse(key, f"expected {self.kind.__name__}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            self.refuse(key, f"{value!r} is not one of {list(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            self.refuse(key, f"{value!r} is below the minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            self.refuse(key, f"{value!r} is above the maximum {self.maximum}")
        if self.validator is not None:
            value = self.validator(self, key, value)
        return value

    def refuse(self, key: str, problem: str) -> None:
        purpose = f" ({key}: {self.help})" if self.help else ""
        raise ConfigError(f"handler.{key}: {problem}{purpose}")

    def allowed(self) -> str:
        """The values this option accepts, in words."""
        if self.choices is not None:
            return " | ".join(str(choice) for choice in self.choices)
        low = "" if self.minimum is None else f">= {self.minimum:g}"
        high = "" if self.maximum is None else f"<= {self.maximum:g}"
        bounds = ", ".join(part for part in (low, high) if part)
        return f"{self.kind.__name__}{f' ({bounds})' if bounds else ''}"


# The numeric fields of a structured (dict) option: name -> (type, minimum, maximum, what it is for).
Bounds = Mapping[str, tuple[type, float, float, str]]


def with_defaults(option: Option, key: str, value: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A structured option's fields with its defaults filled in; unknown fields refused, naming the known ones."""
    unknown = sorted(set(value) - set(defaults))
    if unknown:
        option.refuse(key, f"unknown field(s) {unknown}; known fields are {sorted(defaults)}")
    return {**defaults, **value}


def check_bounds(option: Option, key: str, settings: dict[str, Any], bounds: Bounds) -> None:
    """Check (and, an int given for a float, convert) each bounded field of ``settings`` in place: booleans, other
    types, values out of range and non-finite floats are refused naming the field and what it is for."""
    for name, (kind, low, high, purpose) in bounds.items():
        field = settings[name]
        if kind is float and isinstance(field, int) and not isinstance(field, bool):
            field = settings[name] = float(field)
        if isinstance(field, bool) or not isinstance(field, kind):
            option.refuse(key, f"{name}: expected {kind.__name__}, got {field!r} ({purpose})")
        if not (low <= field <= high) or (kind is float and not math.isfinite(field)):
            option.refuse(key, f"{name}: {field!r} is outside [{low:g}, {high:g}] ({purpose})")


# Keys every handler understands; a handler adds its own on top.
COMMON_OPTIONS: dict[str, Option] = {
    "precision": Option(
        str,
        "auto",
        ("auto", "fp32", "bf16", "fp16", "int8"),
        help="auto = fp16 on CUDA, bf16 on a CPU with native bf16, else fp32",
    ),
    "backend": Option(
        str,
        "eager",
        ("eager", "jit"),
        help="what runs the model: eager = the torch module, jit = torch.compile at load (dynamic shapes, warmed up)",
    ),
    "min_cosine": Option(
        float,
        0.999,
        minimum=0.0,
        maximum=1.0,
        help="accuracy gate: reduced precision must reach this cosine similarity to fp32",
    ),
    "threads": Option(int, 0, minimum=0, help="torch intra-op threads per worker; 0 = cores / maxWorkers"),
    "warmup": Option(bool, True, help="run every served shape once at load, so no request pays for compilation"),
}


def validate(raw: Mapping[str, Any] | None, options: Mapping[str, Option]) -> dict[str, Any]:
    """Return a complete config dict: defaults filled in, every value checked, unknown keys refused."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(options))
    if unknown:
        raise ConfigError(f"handler: unknown key(s) {unknown}; known keys are {sorted(options)}")
    return {key: option.check(key, raw[key]) if key in raw else option.default for key, option in options.items()}


def options_table(options: Mapping[str, Option]) -> str:
    """A Markdown table of a handler's ``handler:`` keys: key, default, allowed values, what it is for."""
    lines = ["| key | default | allowed | what it is for |", "|---|---|---|---|"]
    for key, option in options.items():
        lines.append(f"| `{key}` | `{option.default!r}` | {option.allowed()} | {option.help} |")
    return "\n".join(lines) + "\n"
