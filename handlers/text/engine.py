"""The text engine: every embedding model, classifier, reranker, sparse and multi-vector encoder computed in process,
with no TorchServe in it.

:meth:`TextEngine.load` loads a model folder (or an unpacked archive) as a worker does: the kind its
``text_model.json`` records, the model and tokenizer, the backend walk over the archive's compiled backends with
the accuracy gate, warm-up, the worker's LRU cache of rows and the shared tier where configured. Then rows (a text,
or a text pair) go through the one text-model path: look each up in the LRU and the shared tier, tokenize the misses
with ONE call of the fast tokenizer, group them by token length, one forward pass per group. :meth:`TextEngine.encode`
and :meth:`TextEngine.score` answer per row, a value or that row's own error; :meth:`TextEngine.run` takes requests
of several rows (what the TorchServe handler, handlers/text/handler.py, hands it) and a function that shapes each
request's answer from its rows. What differs between kinds is the kind's (handlers/text/kinds/): this module never
branches on a kind's name.

Model, limits and buckets come from the model's own folder (handlers/text/folder.py); the compiled backends, their
accuracy gate and ranking from the archive's backends/ (handlers/text/backends.py, scripts/build_backends.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from handlers.core import cores, memory, runtime
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.engine import Candidate, Engine, EngineSettings, Loaded
from handlers.core.errors import RequestError
from handlers.text import backends
from handlers.text.batch import (
    ComputedRows,
    Encoded,
    RowsRequest,
    TextBatch,
    answer_requests,
    assemble_batch,
    encode_padded,
    encode_rows,
    model_inputs,
)
from handlers.text.buckets import auto_buckets, check_buckets, plan_forward_groups
from handlers.text.cache import CachedRow, CacheKey, RowCache, cache_key
from handlers.text.folder import FolderError, TextModelFolder, read_json, read_served
from handlers.text.kinds import kind_named
from handlers.text.kinds.base import TextKind
from handlers.text.labels import probabilities
from handlers.text.model import build_module, read_model_files
from handlers.text.requests.common import TextLimits
from handlers.text.rows import DEFAULT_OPTIONS, Row, RowOptions
from handlers.text.shared_cache import SHARED_CACHE_OPTION, Namespace, SharedCache, open_shared_cache
from handlers.text.tokenization import ServedTokenizer
from handlers.text.windows import LONG_INPUT_MODES

logger = logging.getLogger(__name__)

Tokens = tuple[torch.Tensor, ...]  # the model's arguments (TextModelFolder.model_inputs), [rows, length]


def check_dimensions(option: Option, key: str, value: Any) -> Any:
    if isinstance(value, list) and all(type(size) is int and size >= 1 for size in value):
        return sorted(set(value))
    option.refuse(key, f"expected a list of positive integers (embedding sizes a request may ask for), got {value!r}")
    return value


def check_length_buckets(option: Option, key: str, value: Any) -> Any:
    if value == "auto" or isinstance(value, list):
        return value
    option.refuse(key, f"expected 'auto' or a list of token lengths, got {value!r}")
    return value


@dataclass
class LoadedTextModel(Loaded):
    """A text model and what serving it needs, as loaded from its folder and checked against the config."""

    info: TextModelFolder  # what the folder says: kind, head, labels, prompts, limits
    tokenizer: ServedTokenizer  # truncating at max_tokens
    dimension: int  # floats per row: output size of the kind (embedding width, labels, vocabulary, token width)
    max_tokens: int  # the model's token limit (texts are truncated to it)
    buckets: list[int]  # token lengths rows are padded to
    limits: TextLimits

    @property
    def pad_id(self) -> int:
        return self.info.pad_id


def load_text_model(model_dir: str, config: dict[str, Any], kind: TextKind) -> LoadedTextModel:
    """Load the model and its tokenizer; refuse a folder or a ``handler:`` config that cannot serve it."""
    try:
        files = read_model_files(model_dir, kind.name)
    except FolderError as error:
        raise ConfigError(f"model folder: {error}") from None
    info = kind.resolve(files.info, files.tokenizer)
    configured = config["length_buckets"]
    try:
        buckets = auto_buckets(info.max_tokens) if configured == "auto" else check_buckets(configured, info.max_tokens)
    except ValueError as error:
        raise ConfigError(f"handler.length_buckets: {error}") from None
    if config["max_forward_tokens"] < info.max_tokens:
        raise ConfigError(f"handler.max_forward_tokens must hold one {info.max_tokens}-token row")
    if config["long_inputs"] != "truncate" and not kind.pools_windows:
        raise ConfigError(
            f"handler.long_inputs: {config['long_inputs']!r} is for embedding models (one pooled vector per text); "
            f"a {kind.name} model truncates"
        )
    if config["max_request_chars"] < config["max_text_chars"]:
        raise ConfigError(
            f"handler.max_request_chars ({config['max_request_chars']}) is below "
            f"handler.max_text_chars ({config['max_text_chars']}): no request could carry "
            f"the longest text allowed"
        )
    return LoadedTextModel(
        model=build_module(model_dir, info),
        info=info,
        tokenizer=files.tokenizer,
        dimension=info.output_size,
        max_tokens=info.max_tokens,
        buckets=buckets,
        limits=TextLimits(config["max_inputs"], config["max_text_chars"], config["max_request_chars"]),
    )


TEXT_MODEL_OPTIONS: dict[str, Option] = {
    **COMMON_OPTIONS,
    "backend": backends.BACKEND_OPTION,
    "max_inputs": Option(int, 64, minimum=1, maximum=4096, help="texts one request may carry ('input' list)"),
    # Cost bounds per request (docs/reliability.md has the measured worst case at these values).
    "max_text_chars": Option(
        int,
        20000,
        minimum=1,
        help="characters one text may have; checked before "
        "tokenizing, which reads the whole text even when it is truncated",
    ),
    "max_request_chars": Option(int, 50000, minimum=1, help="characters of all texts of one request"),
    "max_request_tokens": Option(
        int,
        1024,
        minimum=1,
        help="tokens of one request after truncation (usage.prompt_tokens); bounds its forward passes",
    ),
    "cache_size": Option(int, 4096, minimum=0, help="rows kept in the worker's LRU cache; 0 disables it"),
    "shared_cache": SHARED_CACHE_OPTION,
    "length_buckets": Option(
        object,
        "auto",
        validator=check_length_buckets,
        help="token lengths rows are padded to; the last must be the model's limit; auto = 16, 32, 64, ... up to "
        "the model's own limit",
    ),
    "max_forward_tokens": Option(int, 8192, minimum=256, help="padded tokens one forward pass may hold"),
    # Long inputs by windows (handlers/text/windows.py, docs/embeddings.md "Long inputs"): embedding models only.
    "long_inputs": Option(
        str,
        "truncate",
        LONG_INPUT_MODES,
        help="what a text over the model's token limit gets when its request does not say ('long_input'): "
        "truncate = its first tokens; windows = overlapping windows pooled into one vector (embedding models)",
    ),
    "window_overlap": Option(
        float, 0.25, minimum=0.0, maximum=0.5, help="share of a window's tokens repeated from the window before it"
    ),
    "max_windows": Option(
        int, 16, minimum=1, maximum=256, help="windows one text may take; a text needing more is refused (413)"
    ),
    "release_memory_tokens": Option(
        int,
        512,
        minimum=0,
        help="after a batch of at least this many padded tokens, return freed heap memory to the OS (~2 ms); 0 = never",
    ),
    # Off by default: on a busy 2-core machine borrowing slowed short requests beside long ones (docs/performance.md).
    "borrow_idle_cores": Option(
        bool,
        False,
        help="under a server that exports a core lease (TS_CORE_LEASE_DIR, set by python -m scripts.server), a batch "
        "also computes on the cores no other worker is using at that moment (docs/performance.md); false = "
        "always this worker's own share (threads)",
    ),
    "borrow_min_tokens": Option(
        int,
        0,
        minimum=0,
        help="borrow idle cores only for a batch of at least this many padded tokens; below it the own share",
    ),
    "borrow_min_forward_ms": Option(
        int,
        0,
        minimum=0,
        help="keep borrowing only if one row at the longest length bucket takes at least this many ms on the "
        "worker's own share (timed at load, best of 2): a small model's forward pass is too short to pay for taking "
        "a core other workers' short requests need (docs/performance.md); 0 = always borrow",
    ),
    "reference_sentences": Option(str, "reference_sentences.json", help="accuracy-gate sentences in the archive"),
    "dimensions": Option(
        object,
        [],
        validator=check_dimensions,
        help="embedding models: the shorter sizes a request's 'dimensions' may ask for (a Matryoshka-trained model's "
        "sizes); each answer is the vector's first N values, re-normalised where the model normalises",
    ),
}


def kind_options(kind: TextKind) -> dict[str, Option]:
    """The text engine's options with the kind's own defaults (a classifier's gate bound differs)."""
    options = dict(TEXT_MODEL_OPTIONS)
    for key, default in kind.options_defaults().items():
        options[key] = replace(options[key], default=default)
    return options


def served_kind(model_dir: str, pinned: str | None = None, pinned_by: str = "") -> TextKind:
    """The kind a model folder holds (its text_model.json), which a ``pinned`` kind (an entry module's, named
    ``pinned_by`` in the refusal) must match."""
    try:
        recorded = read_served(Path(model_dir)).get("kind")
    except FolderError as error:
        raise ConfigError(f"model folder: {error}") from None
    name = recorded or pinned
    if name is None:
        raise ConfigError(
            "model folder: text_model.json is missing, so the model's kind is unknown; package the model with "
            "python -m scripts.package"
        )
    if pinned is not None and name != pinned:
        raise ConfigError(
            f"model folder: the archive holds a {name} model, which {pinned_by} does not serve "
            f"(it serves {pinned}); package it with its own template (docs/your-model.md)"
        )
    return kind_named(name)


@dataclass(frozen=True)
class EncodeOptions:
    """How :meth:`TextEngine.encode` computes its rows."""

    truncate: bool = True  # False: a row over the token limit is that row's error instead of being cut
    row: RowOptions = DEFAULT_OPTIONS  # prompt length, a shorter token limit, task: part of each row's cache key
    name: str = "text"  # what a row's error calls it


@dataclass(frozen=True)
class RowRequest:
    """One row as a request of the text-model path (handlers/text/batch.py ``RowsRequest``): refused on its own."""

    texts: tuple[Row]
    names: tuple[str]
    truncate: bool
    options: tuple[RowOptions]


@dataclass(frozen=True)
class Tokenized:
    """A row as the model sees it: its token ids after truncation, and whether it was cut."""

    ids: list[int]
    truncated: bool


class TextEngine(Engine):
    """A text model loaded for computing rows; :meth:`load` makes one from a folder."""

    loaded: LoadedTextModel

    def __init__(self, settings: EngineSettings, kind: TextKind) -> None:
        self.kind = kind
        super().__init__(settings, kind_options(kind))
        # The server's core lease, where it exports one and this model borrows (handlers/core/cores.py).
        borrows = self.config["borrow_idle_cores"] and self.device.type == "cpu"
        self.core_lease = cores.lease_from_environment() if borrows else None
        # The most threads a forward pass may run on: a backend with its thread count fixed at load (OpenVINO)
        # prepares a second compiled model for it.
        lease_cores = self.core_lease.cores if self.core_lease is not None else 0
        self.widest_threads = lease_cores if lease_cores > self.threads else None

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        kind: str | None = None,
        threads: int | None = None,
        name: str = "text-model",
        version: str = "1",
        gpu_id: int | str | None = None,
    ) -> TextEngine:
        """The model in ``model_dir`` loaded and warmed up: ``config`` is its ``handler:`` section (the folder's
        model-config.yaml is not read: say what differs from the defaults), ``kind`` the kind it must be (None:
        whatever its text_model.json says), ``threads`` torch threads (None: the config's)."""
        handler_config = dict(config or {})
        if threads is not None:
            handler_config["threads"] = threads
        settings = EngineSettings(str(model_dir), handler_config, name, version, gpu_id)
        engine = cls(settings, served_kind(settings.model_dir, kind, f"the {kind} engine"))
        engine.start()
        return engine

    def start(self) -> None:
        super().start()
        # Whether this model's forward passes are long enough to borrow cores for, timed here on this CPU.
        self.longest_row_ms: float | None = None
        if self.core_lease is not None and self.config["borrow_min_forward_ms"]:
            self.longest_row_ms = self.time_longest_row()
            if self.longest_row_ms < self.config["borrow_min_forward_ms"]:
                # An OpenVINO backend has already compiled its wider model (it is loaded before it can be timed): it
                # stays unused.
                self.core_lease = None
                self.widest_threads = None
        if self.widest_threads and self.config["warmup"]:
            # A widened forward pass may run another compiled model (OpenVINO's for more threads), whose first call
            # at each length would otherwise fall on a request.
            torch.set_num_threads(self.widest_threads)
            try:
                with torch.inference_mode():
                    for batch in self.warmup_batches(self.loaded):
                        self.forward(self.loaded.model, batch)
            finally:
                torch.set_num_threads(self.threads)
        self.cache = RowCache(self.config["cache_size"])
        info = self.loaded.info
        # The shared tier's keys name everything that determines a row, so no other model content, version, backend
        # or precision can read this engine's entries (handlers/text/shared_cache.py).
        namespace = Namespace(
            self.model_name,
            self.model_version,
            self.backend,
            self.precision,
            self.loaded.max_tokens,
            self.loaded.dimension,
            self.kind.value_layout,
            identity=self.identity,
        )
        self.shared_cache: SharedCache | None = open_shared_cache(
            self.config["shared_cache"], namespace, lambda value: self.kind.check_value(info, value)
        )

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir: str) -> LoadedTextModel:
        return load_text_model(model_dir, self.config, self.kind)

    def reference_rows(self, loaded: LoadedTextModel, sentences: list[str]) -> list[tuple[Row, RowOptions]]:
        """The gate's inputs: the kind's reference cases as the served path computes them."""
        cases = self.kind.reference_cases(loaded.info, sentences)
        return [self.kind.served_row(loaded.info, loaded.tokenizer, case) for case in cases]

    def reference_batch(self, loaded: LoadedTextModel) -> list[Tokens]:
        """The reference sentences as served: one padded group per length bucket.

        Padded to the longest sentence instead, one long sentence would make every row of the gate's forward passes
        (eager fp32 and each candidate) that long: ~6x the tokens, seconds of a worker's start-up on one thread."""
        sentences = read_json(Path(self.model_dir), self.config["reference_sentences"])
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise ConfigError(
                f"handler.reference_sentences: {self.config['reference_sentences']} must be a list of strings"
            )
        rows = self.reference_rows(loaded, sentences)
        options = [option for _, option in rows]
        encodings = encode_rows(loaded, [row for row, _ in rows], options)
        groups = plan_forward_groups(
            [len(encoding.ids) for encoding in encodings], loaded.buckets, self.config["max_forward_tokens"]
        )
        return [
            model_inputs(
                loaded.info, [encodings[row] for row in g.rows], [options[row] for row in g.rows], g.pad_length
            )
            for g in groups
        ]

    def reference_output(self, model: Any, reference: list[Tokens]) -> Any:
        """Per reference group: the model's output and the group's attention mask."""
        return [(self.forward(model, group).to("cpu", torch.float32), group[1]) for group in reference]

    def gate_similarity(self, loaded: LoadedTextModel, expected: Any, got: Any) -> float:
        """The kind's measure, the worst over the reference groups (with each group's attention mask: a multi-vector
        model's padded positions are not answers)."""
        return min(
            self.kind.similarity(loaded.info, want, have, mask)
            for (want, mask), (have, _) in zip(expected, got, strict=True)
        )

    def time_longest_row(self) -> float:
        """ms of one forward pass of one row at the longest length bucket on this worker's own threads, best of 2."""
        loaded = self.loaded
        length = max(loaded.buckets)
        token = warmup_token(loaded)
        batch = model_inputs(loaded.info, [Encoded([token] * length, [0] * length)], [DEFAULT_OPTIONS], length)
        best = float("inf")
        with torch.inference_mode():
            for _ in range(2):
                started = time.perf_counter()
                self.forward(loaded.model, batch)
                best = min(best, (time.perf_counter() - started) * 1000)
        return best

    def warmup_batches(self, loaded: LoadedTextModel) -> list[Tokens]:
        """What the serving backend needs run once before the first request, and no more (load time counts).

        jit: every bucket length with 1 row and with 2 rows (half padded): with dynamic shapes one graph serves every
        batch size >= 2 and every length; size 1 is specialised by the compiler, so both are run (the jit unit test
        proves a mixed load afterwards compiles nothing). aot / openvino: one row per bucket length (their first
        call at a new length prepares buffers for it). eager: one small pass warms the kernels.
        """
        token = warmup_token(loaded)

        def rows(real: list[int], length: int) -> Tokens:
            encodings = [Encoded([token] * n, [0] * n) for n in real]
            return model_inputs(loaded.info, encodings, [DEFAULT_OPTIONS] * len(real), length)

        if self.backend == "eager":
            return [rows([loaded.buckets[0]], loaded.buckets[0])]
        row_counts = (1, 2) if self.backend == "jit" else (1,)
        batches = []
        for length in loaded.buckets:
            for count in row_counts:
                batches.append(rows([length] + [max(2, length // 2)] * (count - 1), length))
        return batches

    def forward(self, model: Any, batch: Tokens) -> torch.Tensor:
        return model(*(tensor.to(self.device) for tensor in batch))

    def encode_padded(self, texts: list[Row]) -> Tokens:
        """Texts as one padded batch for :meth:`forward` (benchmarks time the bare forward pass with it)."""
        return encode_padded(self.loaded, texts)

    def backend_candidates(self, loaded: LoadedTextModel, precision: str) -> list[Candidate]:
        """auto: the archive's prebuilt candidates best first, then eager (at the wanted precision, then fp32)."""
        if self.config["backend"] != "auto":
            return super().backend_candidates(loaded, precision)
        return backends.auto_candidates(self.model_dir, precision)

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: LoadedTextModel) -> Any:
        if self.config["backend"] == "auto" and backend != "eager":
            backends.check_prebuilt(precision, self.device, self.config["precision"])
        model = backends.load_backend(
            backend,
            precision,
            self.model_dir,
            fp32_model,
            self.threads,
            self.device,
            widest_threads=self.widest_threads,
            max_rows=self.config["max_forward_tokens"] // loaded.buckets[0],
            max_tokens=loaded.buckets[-1],
        )
        if self.config["backend"] == "auto" and backend != "eager":
            # Lengths where the build's ranking found eager faster than this candidate go to eager (same precision).
            lengths = backends.eager_lengths(
                backends.manifest_entry(Path(self.model_dir), backend, precision)[1], loaded.buckets
            )
            if lengths:
                logger.info(
                    "backend %s %s: rows padded to %s tokens run eager (faster there at build)",
                    backend,
                    precision,
                    sorted(lengths),
                )
                return backends.LengthRouted(model, runtime.convert_model(fp32_model, precision), lengths)
        return model

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "model": self.kind.describe(self.loaded.info),
            "max_tokens": self.loaded.max_tokens,
            "length_buckets": self.loaded.buckets,
            # A forward pass holds at most this many padded tokens (rows x bucket length; handlers/text/buckets.py).
            "max_forward_tokens": self.config["max_forward_tokens"],
            "eager_lengths": sorted(getattr(self.loaded.model, "eager_lengths", ())),
            "cache_size": self.config["cache_size"],
            "cached": len(self.cache),
            "shared_cache": self.shared_cache.describe() if self.shared_cache is not None else None,
            "dimension": self.loaded.dimension,
            "borrow_idle_cores": {
                "enabled": self.config["borrow_idle_cores"],
                "lease_cores": self.core_lease.cores if self.core_lease is not None else None,
                "min_tokens": self.config["borrow_min_tokens"],
                "min_forward_ms": self.config["borrow_min_forward_ms"],
                "longest_row_ms": round(self.longest_row_ms, 1) if self.longest_row_ms is not None else None,
            },
        }

    # ----------------------------------------------------------------------------------------------- rows
    def cache_key(self, row: Row, options: RowOptions = DEFAULT_OPTIONS) -> CacheKey:
        return cache_key(
            row, self.model_version, self.precision, self.loaded.max_tokens, options, identity=self.identity
        )

    def prepare(self, requests: Sequence[RowsRequest], max_answer_bytes: int = 0) -> TextBatch:
        """Cache lookups, one tokenizer call for the misses, each request's limits (an answer over
        ``max_answer_bytes`` where the request can estimate it, 0 = no bound), padded length groups. Call it outside
        inference mode: the tensors are made as warm-up's were (a compiled graph guards on that)."""
        return assemble_batch(
            requests,
            self.loaded,
            self.cache,
            self.cache_key,
            self.config["max_request_tokens"],
            self.config["max_forward_tokens"],
            self.shared_cache,
            max_answer_bytes,
        )

    def compute(self, batch: TextBatch) -> ComputedRows:
        """One forward pass per length group (call it in inference mode); each row's value lands at its own position."""
        values: list[Any] = [None] * len(batch.compute_keys)
        info = self.loaded.info
        if not batch.passes:
            return ComputedRows(batch, values)
        padded = batch.stats.padded_tokens if batch.stats is not None else 0
        with self.forward_threads(padded) as threads:
            batch.forward_cores = threads
            for forward_pass in batch.passes:
                output = self.forward(self.loaded.model, forward_pass.inputs).to("cpu", torch.float32)
                for position, row in enumerate(forward_pass.rows):
                    values[row] = self.kind.row_value(
                        info, output, position, batch.compute_ids[row], batch.compute_options[row]
                    )
        return ComputedRows(batch, values)

    @contextmanager
    def forward_threads(self, padded_tokens: int) -> Iterator[int]:
        """The threads a batch's forward passes run on: this worker's own share, plus, under the server's core
        lease, every core no other worker holds (a batch below ``borrow_min_tokens`` keeps its share).

        The count is set as torch's intra-op threads for the batch and restored after it; an OpenVINO backend
        reads it to pick its compiled model (handlers/text/backends.py). Answers do not depend on it: on the
        measured CPUs the vectors at 1 and 2 threads were bitwise equal (docs/performance.md)."""
        lease = self.core_lease
        if lease is None:
            yield self.threads
            return
        widen = padded_tokens >= self.config["borrow_min_tokens"]
        with lease.hold(self.threads, widen) as held:
            # A share configured above the lease's cores keeps its threads: the lease only ever adds.
            threads = max(held, self.threads)
            if threads != self.threads:
                torch.set_num_threads(threads)
            try:
                yield threads
            finally:
                if threads != self.threads:
                    torch.set_num_threads(self.threads)

    def finish(
        self,
        computed: ComputedRows,
        requests: Sequence[RowsRequest],
        format_answer: Callable[[Any, list[CachedRow]], Any],
    ) -> list[Any]:
        """Each request's answer, ``format_answer(request, its rows)``, or its error; the computed rows are stored in
        the LRU and the shared tier."""
        return answer_requests(computed, requests, self.cache, format_answer, self.shared_cache)

    def release_memory(self, batch: TextBatch) -> None:
        """After a large batch, return what its activations and tokenizer buffers freed to the OS: otherwise the
        allocator keeps it and the process's RSS ratchets up with every larger batch (handlers/core/memory.py)."""
        threshold = self.config["release_memory_tokens"]
        if batch.stats is not None and threshold and batch.stats.padded_tokens >= threshold:
            memory.release_free_memory()

    def run(self, requests: Sequence[RowsRequest], format_answer: Callable[[Any, list[CachedRow]], Any]) -> list[Any]:
        """prepare -> compute -> finish for requests of rows: per request its answer or its own error."""
        batch = self.prepare(requests)
        with torch.inference_mode():
            computed = self.compute(batch)
        answers = self.finish(computed, requests, format_answer)
        self.release_memory(batch)
        return answers

    def encode(self, rows: Sequence[Row], options: EncodeOptions = EncodeOptions()) -> list[CachedRow | RequestError]:
        """Per row: what the model computes for it (its kind's value: a vector, a sparse row, token vectors, a
        classifier's logits) with its token count and whether it was truncated, or why that row alone cannot be
        computed. The rows are computed together, in one batch."""
        requests = [RowRequest((row,), (options.name,), options.truncate, (options.row,)) for row in rows]
        return self.run(requests, lambda _request, computed: computed[0])

    def score(self, rows: Sequence[Row], options: EncodeOptions = EncodeOptions()) -> list[CachedRow | RequestError]:
        """Per row of a classifier or cross-encoder (a text, or a (text, text) pair): its scores as the model answers
        them (each label's probability, or a reranker's relevance: the folder says which activation), or that row's
        error."""
        activation = self.loaded.info.activation
        return [
            row if isinstance(row, RequestError) else replace(row, value=probabilities(row.value, activation))
            for row in self.encode(rows, options)
        ]

    def tokenize(self, rows: Sequence[Row], max_tokens: int = 0) -> list[Tokenized]:
        """Each row's token ids as the model would see them (cut at ``max_tokens``, 0 = the model's limit)."""
        encodings = encode_rows(self.loaded, rows, [RowOptions(max_tokens=max_tokens)] * len(rows))
        return [Tokenized(list(e.ids), bool(e.overflowing)) for e in encodings]


def warmup_token(loaded: LoadedTextModel) -> int:
    """A token id every vocabulary has and that is not padding, for the load-time passes."""
    return loaded.pad_id + 3 if loaded.pad_id + 3 < 100 else 5
