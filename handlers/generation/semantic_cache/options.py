"""What the similarity cache may be told: the model's ``handler.semantic_cache`` section and a request's
``semantic_cache`` field, both validated here (hostile values refused with the field and the allowed range).

Model (model-config.yaml)::

    semantic_cache:
      enabled: auto        # auto = on when the archive holds an embedding model (packaged with --var embedder=...)
      embedder: embedder   # that model's folder in the archive
      threshold: 0.95      # cosine similarity a stored prompt needs to answer a new one
      capacity: 10000      # entries per worker (least recently used evicted)
      max_bytes: 67108864  # bytes per worker: vectors + answers
      ttl_s: 86400         # an answer is served for this long after it was generated
      exact_terms: true    # numbers, number words and negations must be the same in both prompts
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
    "threshold": 0.95,
    "capacity": 10000,
    "max_bytes": 64 << 20,
    "ttl_s": 86400,
    "exact_terms": True,
    "embedder_handler": {},
    "shared": {},
}
# key -> (type, minimum, maximum, what it is for)
NUMBERS: Bounds = {
    "threshold": (float, 0.5, 1.0, "cosine similarity a stored prompt needs to answer a new one"),
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
    embedder = settings["embedder"]
    if not isinstance(embedder, str) or not embedder or embedder.startswith("/") or ".." in embedder.split("/"):
        option.refuse(key, f"embedder: {embedder!r} must name a folder inside the archive")
    check_bounds(option, key, settings, NUMBERS)
    if not isinstance(settings["exact_terms"], bool):
        option.refuse(key, f"exact_terms: expected true or false, got {settings['exact_terms']!r}")
    if not isinstance(settings["embedder_handler"], dict):
        option.refuse(key, "embedder_handler: expected the embedding model's handler options as a mapping")
    from handlers.text.handler import TEXT_MODEL_OPTIONS

    try:  # the embedding handler's own schema: a typo is refused here, when packaging, not in a worker
        validate(settings["embedder_handler"], TEXT_MODEL_OPTIONS)
    except ConfigError as error:
        option.refuse(key, f"embedder_handler: {error}")
    shared = settings["shared"]
    if not isinstance(shared, dict):
        option.refuse(key, "shared: expected a mapping like handler.shared_cache of an embedding model")
    settings["shared"] = check_settings(option, f"{key}.shared", {"max_value_bytes": SHARED_VALUE_BYTES, **shared})
    return settings


SEMANTIC_CACHE_OPTION = Option(
    dict,
    DEFAULTS,
    help="answers for prompts similar to one already answered (docs/semantic-cache.md): fields enabled "
    "(auto|true|false), embedder, threshold, capacity, max_bytes, ttl_s, embedder_handler, shared {url, ...}",
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
