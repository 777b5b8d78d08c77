"""Handler for ``minilm``: sentence embeddings from all-MiniLM-L6-v2 (384 floats, unit length).

Per batch TorchServe hands over: look each text up in the worker's LRU cache, tokenize the misses with ONE call of the
fast tokenizer, group them by token length and run one forward pass per group, then answer every request with exactly
its own rows, in order. Request shapes and validation: :mod:`handlers.embedding.requests`; batch assembly and
answers: :mod:`handlers.embedding.batch` (with ``cache`` and ``buckets``); the model (encoder + mean pooling + L2
normalisation) and its files: :mod:`handlers.embedding.encoder`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from handlers.core import memory, runtime
from handlers.core.base import BatchScope, Candidate, ServingHandler
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.http import RequestView
from handlers.core.metrics import HandlerMetrics
from handlers.embedding import backends
from handlers.embedding.batch import (
    ComputedBatch,
    EmbeddingBatch,
    answer_requests,
    assemble_batch,
    encode_padded,
    pad_rows,
)
from handlers.embedding.buckets import plan_forward_groups
from handlers.embedding.cache import CacheKey, EmbeddingCache, cache_key
from handlers.embedding.encoder import LoadedEncoder, load_embedding_model, read_json
from handlers.embedding.requests import EmbeddingRequest, parse_embedding_request
from handlers.embedding.shared_cache import (
    SHARED_CACHE_OPTION,
    Namespace,
    SharedCache,
    open_shared_cache,
    record_shared_cache,
)

logger = logging.getLogger(__name__)

Tokens = tuple[torch.Tensor, torch.Tensor]  # (input_ids, attention_mask), [rows, length]


class EmbeddingHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "backend": Option(
            str,
            "auto",
            ("auto", "eager", "jit", "aot", "openvino"),
            help="what runs the encoder: auto = the best prebuilt candidate in backends/manifest.json that this "
            "machine runs and that passes the accuracy gate, else eager; eager = the torch module; jit = "
            "torch.compile at load; aot = the archive's AOTInductor package; openvino = its OpenVINO IR",
        ),
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
        "cache_size": Option(int, 4096, minimum=0, help="embeddings kept in the worker's LRU cache; 0 disables it"),
        "shared_cache": SHARED_CACHE_OPTION,
        "length_buckets": Option(
            list, [16, 32, 64, 128, 256], help="token lengths rows are padded to; the last must be the model's limit"
        ),
        "max_forward_tokens": Option(int, 8192, minimum=256, help="padded tokens one forward pass may hold"),
        "release_memory_tokens": Option(
            int,
            512,
            minimum=0,
            help="after a batch of at least this many padded "
            "tokens, return freed heap memory to the OS (~2 ms); 0 = never",
        ),
        "reference_sentences": Option(str, "reference_sentences.json", help="accuracy-gate sentences in the archive"),
    }
    loaded: LoadedEncoder

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.cache = EmbeddingCache(self.config["cache_size"])
        # The shared tier's keys name everything that determines a vector, so no other model, version, backend or
        # precision can read this worker's entries (handlers/embedding/shared_cache.py).
        namespace = Namespace(
            self.model_name,
            self.model_version,
            self.backend,
            self.precision,
            self.loaded.max_tokens,
            self.loaded.dimension,
        )
        self.shared_cache: SharedCache | None = open_shared_cache(self.config["shared_cache"], namespace)

    def load_model(self, model_dir: str) -> LoadedEncoder:
        return load_embedding_model(model_dir, self.config)

    def reference_batch(self, loaded: LoadedEncoder) -> list[Tokens]:
        """The reference sentences as served: one padded group per length bucket.

        Padded to the longest sentence instead, one long sentence would make every row of the gate's forward passes
        (eager fp32 and each candidate) that long: ~6x the tokens, seconds of a worker's start-up on one thread."""
        sentences = read_json(self.model_dir, self.config["reference_sentences"])
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise ConfigError(
                f"handler.reference_sentences: {self.config['reference_sentences']} must be a list of strings"
            )
        encodings = loaded.tokenizer.encode_batch(sentences)
        groups = plan_forward_groups(
            [len(encoding.ids) for encoding in encodings], loaded.buckets, self.config["max_forward_tokens"]
        )
        return [pad_rows([encodings[row].ids for row in g.rows], g.pad_length, loaded.pad_id) for g in groups]

    def reference_output(self, model: Any, reference: list[Tokens]) -> torch.Tensor:
        return torch.cat([self.forward(model, group).to("cpu", torch.float32) for group in reference])

    def warmup_batches(self, loaded: LoadedEncoder) -> list[Tokens]:
        """What the serving backend needs run once before the first request, and no more (load time counts).

        jit: every bucket length with 1 row and with 2 rows (half padded): with dynamic shapes one graph serves every
        batch size >= 2 and every length; size 1 is specialised by the compiler, so both are run (the jit unit test
        proves a mixed load afterwards compiles nothing). aot / openvino: one row per bucket length (their first
        call at a new length prepares buffers for it). eager: one small pass warms the kernels.
        """
        token = loaded.pad_id + 1000
        if self.backend == "eager":
            return [pad_rows([[token] * loaded.buckets[0]], loaded.buckets[0], loaded.pad_id)]
        row_counts = (1, 2) if self.backend == "jit" else (1,)
        batches = []
        for length in loaded.buckets:
            for rows in row_counts:
                real = [length] + [max(2, length // 2)] * (rows - 1)
                batches.append(pad_rows([[token] * n for n in real], length, loaded.pad_id))
        return batches

    def forward(self, model: Any, batch: Tokens) -> torch.Tensor:
        input_ids, attention_mask = batch
        return model(input_ids.to(self.device), attention_mask.to(self.device))

    def encode_padded(self, texts: list[str]) -> Tokens:
        """Texts as one padded batch for :meth:`forward` (benchmarks time the bare forward pass with it)."""
        return encode_padded(self.loaded, texts)

    def backend_candidates(self, loaded: LoadedEncoder, precision: str) -> list[Candidate]:
        """auto: the archive's prebuilt candidates best first, then eager (at the wanted precision, then fp32)."""
        if self.config["backend"] != "auto":
            return super().backend_candidates(loaded, precision)
        manifest, problem = backends.read_manifest(self.model_dir)
        candidates = []
        if manifest is None:
            logger.info("backend auto: %s, so eager serves", problem)
            last_resort = f"last resort: {problem}"
        else:
            ranked = backends.ranked_candidates(manifest)
            for place, entry in enumerate(ranked, start=1):
                measured = f", {entry['ms_per_text']} ms/text at build" if "ms_per_text" in entry else ""
                why = f"rank {place} of {len(ranked)} in {backends.MANIFEST}{measured}"
                candidates.append(Candidate(entry["backend"], entry["precision"], why))
            for refused in manifest.get("refused") or []:
                logger.info("backend auto: refused when the archive was built: %s", refused)
            not_built = f" ({manifest['not_built']})" if manifest.get("not_built") else ""
            nothing_left = "every prebuilt candidate was refused" if ranked else f"{backends.MANIFEST} lists none"
            nothing_left += not_built
            last_resort = f"last resort: {nothing_left}"
        candidates.append(Candidate("eager", precision, last_resort))
        if precision != "fp32":
            candidates.append(Candidate("eager", "fp32", f"{last_resort}; {precision} refused"))
        return candidates

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: LoadedEncoder) -> Any:
        if self.config["backend"] == "auto" and backend != "eager":
            # A prebuilt candidate serves only where it is what was asked for and what this machine computes well.
            reason = backends.machine_can_run(precision, self.device)
            if reason:
                raise backends.BackendUnavailable(reason)
            requested = self.config["precision"]
            if requested != "auto" and precision != requested:
                raise backends.BackendUnavailable(f"handler.precision is {requested}")
        model = backends.load_backend(
            backend,
            precision,
            self.model_dir,
            fp32_model,
            self.threads,
            self.device,
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
            "max_tokens": self.loaded.max_tokens,
            "length_buckets": self.loaded.buckets,
            "eager_lengths": sorted(getattr(self.loaded.model, "eager_lengths", ())),
            "cache_size": self.config["cache_size"],
            "cached": len(self.cache),
            "shared_cache": self.shared_cache.describe() if self.shared_cache is not None else None,
            "dimension": self.loaded.dimension,
            "limits": {
                key: self.config[key]
                for key in ("max_inputs", "max_text_chars", "max_request_chars", "max_request_tokens")
            },
        }

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body: Any, request: RequestView) -> EmbeddingRequest:
        return parse_embedding_request(body, request.content_type, self.loaded.dimension, self.loaded.limits)

    def cache_key(self, text: str) -> CacheKey:
        return cache_key(text, self.model_version, self.precision, self.loaded.max_tokens)

    # ----------------------------------------------------------------------------------------------- per batch
    def preprocess(self, payloads: list[EmbeddingRequest]) -> EmbeddingBatch:
        return assemble_batch(
            payloads,
            self.loaded,
            self.cache,
            self.cache_key,
            self.config["max_request_tokens"],
            self.config["max_forward_tokens"],
            self.shared_cache,
        )

    def inference(self, batch: EmbeddingBatch, scope: BatchScope) -> ComputedBatch:
        """One forward pass per length group; rows land at their own positions."""
        embeddings = torch.empty(len(batch.compute_keys), self.loaded.dimension, dtype=torch.float32)
        for forward_pass in batch.passes:
            output = self.forward(self.loaded.model, (forward_pass.input_ids, forward_pass.attention_mask))
            embeddings[torch.tensor(forward_pass.rows, dtype=torch.long)] = output.to("cpu", torch.float32)
        return ComputedBatch(batch, embeddings)

    def postprocess(self, computed: ComputedBatch, payloads: list[EmbeddingRequest]) -> list[Any]:
        return answer_requests(computed, payloads, self.cache, self.model_name, self.shared_cache)

    def after_batch(self, batch: EmbeddingBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        stats = batch.stats
        if stats is None:
            return
        metrics.record("CacheHits", stats.hits)
        metrics.record("CacheMisses", stats.misses)
        if self.shared_cache is not None:
            record_shared_cache(self.shared_cache, metrics)
        metrics.record("PaddedTokens", stats.padded_tokens)
        metrics.record("RealTokens", stats.real_tokens)
        threshold = self.config["release_memory_tokens"]
        if threshold and stats.padded_tokens >= threshold:
            # Otherwise the allocator keeps what this batch's activations and tokenizer buffers freed, and the
            # worker's RSS ratchets up with every larger batch (see handlers/core/memory.py).
            memory.release_free_memory()
