"""Structured outputs: ``response_format`` (JSON mode, JSON schema) enforced token by token by a grammar.

A request's ``response_format`` (OpenAI's shape, on chat, completions and the native API) is checked and compiled
when it is parsed (:func:`parse_response_format`): a schema that is too big or too deep, or that the grammar library
cannot compile, is refused there with a 400 naming why. Each sequence of an accepted request then gets its own
:class:`Constraint` (a copy of the compiled grammar's matcher), which the decoding step consults
(:func:`handlers.generation.decoding.append_tokens`): the row's logits are masked to the tokens the grammar allows
before its token is chosen (greedy or sampled, as asked), the grammar advances by the chosen token, the end-of-text
token is allowed only where the grammar accepts, and the sequence finishes ("stop") as soon as the grammar is
complete. Rows without a constraint pay nothing; one row's grammar never touches another's.

The grammar library is llguidance (chosen by measurement: docs/generation.md, "Structured outputs"). Its parser
limits (:func:`parser_limits`: lexer fuel per step and at build, grammar size, lexer states) bound the work any
schema can cost, and the checks before compiling (:data:`MAX_SCHEMA_CHARS`, :data:`MAX_SCHEMA_DEPTH`) keep a hostile
body from reaching it at all. The next step's mask is computed in a background thread right after a token is
consumed (llguidance releases the GIL while it computes), so it overlaps the next forward pass instead of adding to
it.

An answer that reaches ``max_tokens`` before its JSON closes ends with ``finish_reason`` "length" and the prefix it
has, as OpenAI answers: the text is a valid prefix of a conforming document, never a wrong one.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import llguidance
import numpy
import torch

from handlers.core.errors import shown
from handlers.generation.decoding import ConstraintFailed
from handlers.generation.requests import FieldError, Served

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

logger = logging.getLogger(__name__)

FIELD = "response_format"
MAX_SCHEMA_CHARS = 65_536  # the schema as compact JSON: far above any model a client writes by hand or by Pydantic
MAX_SCHEMA_DEPTH = 32  # nested objects/arrays in the schema document itself (Pydantic models nest a few levels)
MAX_NAME_CHARS = 64  # OpenAI's json_schema.name: ^[a-zA-Z0-9_-]{1,64}$
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Compact JSON: whitespace between tokens is not allowed, so a model cannot spend its max_tokens on blanks (the demo's
# random weights otherwise draw spaces and newlines as often as anything else); separators as json.dumps writes them.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
COMPILED_CACHE = 64  # compiled grammars kept per tokenizer (a client sends the same schema again and again)


def parser_limits() -> llguidance.LLParserLimits:
    """llguidance's own bounds on one grammar: its defaults, except the lexer's states (1-2 kB each, 250,000 by
    default, up to 500 MB for one request; 20,000 keeps a worst case near 40 MB). Fuel is work (~50k/ms at build,
    ~14k/ms per mask), so no schema costs more than ~20 ms to build or ~15 ms per token's mask before it fails."""
    return llguidance.LLParserLimits(
        max_items_in_row=2_000,
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_lexer_states=20_000,
        max_grammar_size=500_000,
        verbose_errors=False,  # a refusal names the problem, not the parser's internal state
    )


@dataclass(frozen=True)
class ResponseFormat:
    """A request's output format: ``kind`` "json_object" or "json_schema" (``schema``, ``name``)."""

    kind: str
    schema: dict[str, Any] | None = None
    name: str = ""

    @property
    def grammar_schema(self) -> dict[str, Any]:
        """The JSON schema the grammar enforces (JSON mode: any JSON object)."""
        return self.schema if self.schema is not None else {"type": "object"}


def parse_response_format(value: Any) -> ResponseFormat | None:
    """``response_format`` as OpenAI writes it: ``{"type": "text"}`` (None: free text), ``{"type": "json_object"}``
    or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FieldError(FIELD, f'\'{FIELD}\' must be an object such as {{"type": "json_object"}}, got {shown(value)}')
    kind = value.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if not isinstance(kind, str) or kind not in allowed:
        raise FieldError(FIELD, f"'{FIELD}.type' is {shown(kind)}; it must be one of {sorted(allowed)}")
    unknown = sorted(set(value) - allowed[kind])
    if unknown:
        raise FieldError(FIELD, f"unknown '{FIELD}' field(s) {unknown} for type {kind!r}"[:300])
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    return schema_format(value.get("json_schema"))


def schema_format(spec: Any) -> ResponseFormat:
    """``response_format.json_schema``: ``{"name", "schema", "strict"?, "description"?}``."""
    if not isinstance(spec, dict):
        raise FieldError(FIELD, f"'{FIELD}.json_schema' must be an object with 'name' and 'schema', got {shown(spec)}")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise FieldError(FIELD, f"unknown '{FIELD}.json_schema' field(s) {unknown}"[:300])
    name = spec.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise FieldError(
            FIELD,
            f"'{FIELD}.json_schema.name' is {shown(name)}; it must be 1 to {MAX_NAME_CHARS} letters, digits, _ or -",
        )
    for key, kinds, wanted in (("strict", (bool,), "true or false"), ("description", (str,), "a string")):
        if spec.get(key) is not None and not isinstance(spec[key], kinds):
            raise FieldError(FIELD, f"'{FIELD}.json_schema.{key}' must be {wanted}, got {shown(spec[key])}")
    if "schema" not in spec:
        raise FieldError(FIELD, f"missing field '{FIELD}.json_schema.schema' (the JSON schema the answer must follow)")
    schema = spec["schema"]
    if not isinstance(schema, dict):
        raise FieldError(FIELD, f"'{FIELD}.json_schema.schema' must be a JSON schema object, got {shown(schema)}")
    check_size(schema)
    return ResponseFormat("json_schema", schema, name)


def check_size(schema: dict[str, Any]) -> None:
    """Refuse a schema too big or too deeply nested to compile in bounded time (before the library sees it)."""
    if nesting(schema) > MAX_SCHEMA_DEPTH:
        raise FieldError(
            FIELD,
            f"'{FIELD}.json_schema.schema' nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep; "
            f"at most {MAX_SCHEMA_DEPTH} are allowed",
        )
    chars = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    if chars > MAX_SCHEMA_CHARS:
        raise FieldError(
            FIELD,
            f"'{FIELD}.json_schema.schema' has {chars} characters as JSON; at most {MAX_SCHEMA_CHARS} are allowed",
        )


def nesting(value: Any) -> int:
    """How deeply objects and arrays nest in a JSON value, counted up to one level past MAX_SCHEMA_DEPTH (iterative:
    a hostile depth never recurses in Python)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH:
            return deepest  # enough to refuse it
        pending.extend((child, depth + 1) for child in children)
    return deepest


# ------------------------------------------------------------------------------------------------------ grammars
class Grammars:
    """One tokenizer's grammar machinery: llguidance's view of its vocabulary (built once: about a second for a
    50k-token vocabulary) and the compiled grammars of recent schemas, which each new sequence copies."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise FieldError(FIELD, f"'{FIELD}' needs a fast (tokenizers) tokenizer; this model's has none")
        # The serialised tokenizer without padding or truncation (llguidance reads its vocabulary and merges).
        backend = backend.__class__.from_str(backend.to_str())
        backend.no_padding()
        backend.no_truncation()
        # The end-of-text token is not the grammar's business: Constraint.mask allows the model's own stop tokens
        # exactly where the grammar accepts, whatever the tokenizer calls its end.
        eos = tokenizer.eos_token_id
        self.tokenizer = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        self.vocab_size = vocab_size
        self.limits = parser_limits()
        self.compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self.lock = threading.Lock()

    def compile(self, response_format: ResponseFormat) -> CompiledFormat:
        """The format's grammar, compiled for this vocabulary (or a FieldError naming why it cannot be)."""
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                response_format.grammar_schema, overrides=JSON_OPTIONS
            )
        except ValueError as error:
            raise FieldError(FIELD, f"'{FIELD}' schema cannot be compiled: {error}"[:500]) from None
        return CompiledFormat(response_format, self.matcher(grammar, FIELD, "schema"), self.vocab_size)

    def matcher(self, grammar: str, field: str, what: str) -> Any:
        """A compiled llguidance grammar at its start (shared: never advanced itself), from the cache when the same
        grammar came recently; a FieldError naming ``field`` when the library refuses it (``what``: the thing in the
        request it was built from). response_format and tools (handlers/generation/tools.py) both compile here."""
        with self.lock:
            matcher = self.compiled.get(grammar)
            if matcher is not None:
                self.compiled.move_to_end(grammar)
                return matcher
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.limits)
        if matcher.is_error():
            raise FieldError(field, f"'{field}' {what} cannot be compiled: {matcher.get_error()}"[:500])
        with self.lock:
            self.compiled[grammar] = matcher
            while len(self.compiled) > COMPILED_CACHE:
                self.compiled.popitem(last=False)
        return matcher


_GRAMMARS: dict[int, tuple[Any, Grammars]] = {}  # by id(tokenizer): a worker serves one tokenizer
_GRAMMARS_LOCK = threading.Lock()


def grammars_for(tokenizer: Any, vocab_size: int) -> Grammars:
    """The tokenizer's :class:`Grammars`, built at its first constrained request."""
    with _GRAMMARS_LOCK:
        known = _GRAMMARS.get(id(tokenizer))
        if known is None or known[0] is not tokenizer or known[1].vocab_size != vocab_size:
            known = (tokenizer, Grammars(tokenizer, vocab_size))
            _GRAMMARS[id(tokenizer)] = known
        return known[1]


def prepare_in_background(served: Served) -> None:
    """Build the served tokenizer's grammar vocabulary in a background thread at worker start: it takes about a
    second for a real 50k-token vocabulary, and up to ~35 s of CPU for the 124 M measurement model's synthetic one
    (docs/generation.md), which the first constrained request would otherwise wait for inside its step. A request
    that comes sooner waits for it (grammars_for holds the lock while it builds)."""

    def build() -> None:
        try:
            grammars_for(served.tokenizer, served.limits.vocab_size)
        except Exception:  # the first constrained request gets the reason as its 400
            logger.info("no grammar vocabulary for this tokenizer: response_format will be refused", exc_info=True)

    threading.Thread(target=build, name="grammar-vocabulary", daemon=True).start()


def checked_response_format(body: dict[str, Any], served: Served) -> CompiledFormat | None:
    """A body's ``response_format`` checked and compiled for the served model (None: free text); a refusal is a
    FieldError naming the field (OpenAI's ``param``)."""
    response_format = parse_response_format(body.get(FIELD))
    if response_format is None:
        return None
    return grammars_for(served.tokenizer, served.limits.vocab_size).compile(response_format)


def uncached_lookup(lookup: Any, compiled: CompiledFormat | None) -> Any:
    """A request's similarity-cache lookup, switched off when its output is constrained (a stored free-text answer
    to the same prompt would not follow the format; formats are not part of what the cache compares)."""
    if compiled is None or lookup is None:
        return lookup
    return replace(lookup, text=None, skip=FIELD)


# ------------------------------------------------------------------------------------------------------ decoding
# One thread computes the constrained rows' next masks while the forward pass runs (llguidance drops the GIL).
_MASKS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
BACKGROUND_MASKS = True  # False: each mask is computed when its row's token is chosen (scripts/bench_structured.py)


@dataclass(frozen=True)
class CompiledFormat:
    """A request's compiled format: every sequence decoding for it starts from a copy of ``matcher``."""

    response_format: ResponseFormat | None  # None: a grammar of tool calls (handlers/generation/tools.py)
    matcher: Any  # llguidance.LLMatcher at the grammar's start (never advanced itself)
    vocab_size: int
    field: str = FIELD  # the request field a runtime grammar failure names ("tools" for tool calls)

    def start(self) -> Constraint:
        return Constraint(self.matcher.deep_copy(), self.vocab_size, self.field)


class Constraint:
    """One sequence's grammar state (:class:`handlers.generation.decoding.TokenConstraint`)."""

    def __init__(self, matcher: Any, vocab_size: int, field: str = FIELD) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.field = field
        self.pending: Future[torch.Tensor] | None = None
        self.prefetch()  # the first mask overlaps the prompt's prefill

    def allowed_tokens(self) -> torch.Tensor:
        """The tokens the grammar allows next, as a bool tensor over the vocabulary."""
        words = (self.vocab_size + 31) // 32
        bits = numpy.zeros(words, dtype=numpy.uint32)
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, words * 4)
        # One bit per token, least significant first within each little-endian 32-bit word: one numpy call unpacks
        # them (a few microseconds for 50k tokens; the same with torch shifts took several small ops).
        allowed = numpy.unpackbits(bits.view(numpy.uint8), bitorder="little")[: self.vocab_size]
        return torch.from_numpy(allowed.view(numpy.bool_))

    def prefetch(self) -> None:
        self.pending = _MASKS.submit(self.allowed_tokens) if BACKGROUND_MASKS else None

    def mask(self, logits: torch.Tensor, stop_token_ids: Iterable[int]) -> torch.Tensor:
        """``logits`` (one row) with every token the grammar does not allow at -inf; the model's stop tokens are
        allowed exactly where the grammar accepts the text as it is."""
        pending, self.pending = self.pending, None
        allowed = pending.result() if pending is not None else self.allowed_tokens()
        if self.matcher.is_error():
            raise grammar_failure("the output grammar failed", self.matcher.get_error(), self.field)
        accepting = self.matcher.is_accepting()
        for token in stop_token_ids:
            if token < allowed.numel():
                allowed[token] = accepting
        if allowed.numel() < logits.numel():  # the model's logits cover more ids than the grammar's vocabulary
            allowed = torch.cat([allowed, allowed.new_zeros(logits.numel() - allowed.numel())])
        if not bool(allowed.any()):
            raise ConstraintFailed("the output grammar allows no token here")
        return logits.masked_fill(~allowed, float("-inf"))

    def advance(self, token: int, more: bool) -> bool:
        """Consume the chosen token; ``more``: the sequence may take another (its next mask is computed now, beside
        the next forward pass). Returns True when the grammar is complete (nothing but its end may follow)."""
        if not self.matcher.consume_token(token):
            raise grammar_failure(f"the output grammar refused token {token}", self.matcher.get_error(), self.field)
        if self.matcher.is_stopped():
            return True
        if more:
            self.prefetch()
        return False


# llguidance's parser stops a grammar that outgrows its limits while decoding ("... has 4007 items; max is 2000"):
# the schema's doing, found only once the text reached that point, so the request's error, not the server's.
PARSER_LIMIT = re.compile(r"\bmax is \d+")


def grammar_failure(what: str, detail: str, field: str = FIELD) -> ConstraintFailed:
    if PARSER_LIMIT.search(detail or ""):
        message = f"{field}: the schema is too complex for the output grammar at this point ({detail})"
        return ConstraintFailed(message[:300], status=400)
    return ConstraintFailed(f"{what}: {detail}"[:300])
