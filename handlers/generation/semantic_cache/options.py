"""What the similarity cache may be told: the model's ``handler.semantic_cache`` section and a request's
``semantic_cache`` field, both validated here (hostile values refused with the field and the allowed range).

Model (model-config.yaml)::

    semantic_cache:
      enabled: auto        # auto = on when the archive holds an embedding model (packaged with --var embedder=...)
      embedder: embedder   # that model's folder in the archive
      threshold: 0.89      # cosine similarity a stored prompt needs to be a candidate (then verified)
      candidates: 4        # the most similar candidates verified per lookup
      lexical_check: true  # the model-free check (lexical.py): numbers, relations, order, opposites, target, ...
      verifier: verifier   # a cross-encoder's folder in the archive (--var verifier=...): used when packed
      verifier_threshold: 0.5  # its score a candidate needs (the positive label's probability)
      verifier_label: auto # which label means "same question" (auto: the one output, or duplicate/paraphrase/...)
      verifier_handler: {} # the verifier's own handler: options (backend, precision, ...)
      capacity: 10000      # entries per worker (least recently used evicted)
      max_bytes: 67108864  # bytes per worker: vectors + prompts + answers
      ttl_s: 86400         # an answer is served for this long after it was generated
      exact_terms: true    # numbers and negations are part of the group (a lookup meets only prompts that agree)
      embedder_handler: {} # the embedding model's own handler: options (backend, precision, ...)
      shared: {url: ""}    # the tier shared by workers and replicas (as handler.shared_cache of an embedding model)

Request (native body, or an OpenAI body's extra field)::

    "semantic_cache": false                                      # neither look up nor store
    "semantic_cache": {"min_similarity": 0.97, "partition": "t1"}  # stricter threshold; a partition of its own

``min_similarity`` may only be stricter than the model's threshold. ``partition`` separates tenants that share a
model, system prompt and settings: an answer stored under one partition is never served to another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.core.config import Bounds, ConfigError, Option, check_bounds, validate, with_defaults
from handlers.core.errors import RequestError, shown, surrogate_at
from handlers.text.shared_cache import check_settings

REQUEST_FIELD = "semantic_cache"
REQUEST_KEYS = ("min_similarity", "partition")
MAX_PARTITION_CHARS = 128
ENABLED_VALUES = ("auto", True, False)

DEFAULTS: dict[str, Any] = {
    "enabled": "auto",
    "embedder": "embedder",
    "threshold": 0.89,
    "candidates": 4,
    "lexical_check": True,
    "verifier": "verifier",
    "verifier_threshold": 0.5,
    "verifier_label": "auto",
    "verifier_handler": {},
    "capacity": 10000,
    "max_bytes": 64 << 20,
    "ttl_s": 86400,
    "exact_terms": True,
    "embedder_handler": {},
    "shared": {},
}
# key -> (type, minimum, maximum, what it is for)
NUMBERS: Bounds = {
    "threshold": (float, 0.5, 1.0, "cosine similarity a stored prompt needs to be a candidate"),
    "candidates": (int, 1, 32, "the most similar stored prompts verified per lookup"),
    "verifier_threshold": (float, -1e6, 1e6, "the verifier's score a candidate needs"),
    "capacity": (int, 1, 1_000_000, "entries one worker keeps"),
    "max_bytes": (int, 1 << 16, 1 << 34, "bytes one worker keeps (vectors and answers)"),
    "ttl_s": (int, 1, 30 * 86400, "seconds an answer is served after it was generated"),
}
# The shared tier's values hold an answer besides the vector: a larger bound than the embedding tier's.
SHARED_VALUE_BYTES = 65536


def check_semantic_cache(option: Option, key: str, value: Any) -> dict[str, Any]:
    settings = with_defaults(option, key, value, DEFAULTS)
    if settings["enabled"] not in ENABLED_VALUES:
        option.refuse(key, f"enabled: {settings['enabled']!r} is not one of auto, true, false")
    for name in ("embedder", "verifier"):
        folder = settings[name]
        inside = isinstance(folder, str) and not folder.startswith("/") and ".." not in folder.split("/")
        if not inside or (name == "embedder" and not folder):  # verifier: "" = none
            option.refuse(key, f"{name}: {folder!r} must name a folder inside the archive")
    check_bounds(option, key, settings, NUMBERS)
    for name in ("exact_terms", "lexical_check"):
        if not isinstance(settings[name], bool):
            option.refuse(key, f"{name}: expected true or false, got {settings[name]!r}")
    if not isinstance(settings["verifier_label"], str) or not settings["verifier_label"]:
        option.refuse(key, f"verifier_label: expected a label name or auto, got {settings['verifier_label']!r}")
    check_model_handlers(option, key, settings)
    shared = settings["shared"]
    if not isinstance(shared, dict):
        option.refuse(key, "shared: expected a mapping like handler.shared_cache of an embedding model")
    settings["shared"] = check_settings(option, f"{key}.shared", {"max_value_bytes": SHARED_VALUE_BYTES, **shared})
    return settings


def check_model_handlers(option: Option, key: str, settings: dict[str, Any]) -> None:
    """The embedder's and the verifier's handler options, each against its own handler's schema: a typo is refused
    here, when packaging, not in a worker."""
    from handlers.text.engine import TEXT_MODEL_OPTIONS

    for name, schema in (("embedder_handler", TEXT_MODEL_OPTIONS), ("verifier_handler", TEXT_MODEL_OPTIONS)):
        if not isinstance(settings[name], dict):
            option.refuse(key, f"{name}: expected the model's handler options as a mapping")
        try:
            validate(settings[name], schema)
        except ConfigError as error:
            option.refuse(key, f"{name}: {error}")


SEMANTIC_CACHE_OPTION = Option(
    dict,
    DEFAULTS,
    help="answers for prompts similar to one already answered, once verified (docs/semantic-cache.md): fields "
    "enabled (auto|true|false), embedder, threshold, candidates, lexical_check, verifier, verifier_threshold, "
    "verifier_label, verifier_handler, capacity, max_bytes, ttl_s, exact_terms, embedder_handler, shared {url, ...}",
    validator=check_semantic_cache,
)


@dataclass(frozen=True)
class CacheRequest:
    """What one request asked of the cache."""

    use: bool = True
    min_similarity: float | None = None
    partition: str = ""


def parse_cache_request(body: dict[str, Any]) -> CacheRequest:
    """The request's ``semantic_cache`` field (absent or null: the model's defaults)."""
    value = body.get(REQUEST_FIELD)
    if value is None or value is True:
        return CacheRequest()
    if value is False:
        return CacheRequest(use=False)
    if not isinstance(value, dict):
        raise RequestError(f"'{REQUEST_FIELD}' must be true, false or an object with {list(REQUEST_KEYS)}")
    unknown = sorted(set(value) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(f"unknown '{REQUEST_FIELD}' field(s) {unknown}; accepted: {list(REQUEST_KEYS)}"[:300])
    min_similarity = value.get("min_similarity")
    if min_similarity is not None:
        if isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float)):
            raise RequestError(f"'{REQUEST_FIELD}.min_similarity' must be a number, got {shown(min_similarity)}")
        if not 0 <= min_similarity <= 1:  # also refuses nan and inf
            raise RequestError(f"'{REQUEST_FIELD}.min_similarity' is {shown(min_similarity)}; it must be in [0, 1]")
        min_similarity = float(min_similarity)
    partition = value.get("partition", "")
    if not isinstance(partition, str) or len(partition) > MAX_PARTITION_CHARS:
        raise RequestError(f"'{REQUEST_FIELD}.partition' must be a string of at most {MAX_PARTITION_CHARS} characters")
    if surrogate_at(partition) is not None:
        raise RequestError(f"'{REQUEST_FIELD}.partition' is not valid Unicode (unpaired surrogate)")
    return CacheRequest(True, min_similarity, partition)


@dataclass(frozen=True)
class PromptLookup:
    """What the similarity cache needs of a parsed request, set by each API's parser."""

    text: str | None  # compared by meaning: the prompt, or a chat's last (user) message; None: not looked up
    context: str  # must match exactly: '' for a prompt, a chat's earlier messages (system prompt included) as JSON
    api: str  # "prompt" (native and OpenAI completions tokenize alike) or "chat" (the chat template applies)
    seed_given: bool  # a sampled request is looked up only with its own seed: the seed decides its answer
    option: CacheRequest
    skip: str = ""  # why text is None (a metric label)
