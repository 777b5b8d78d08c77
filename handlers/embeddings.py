"""Handler for ``minilm``: sentence embeddings from all-MiniLM-L6-v2 (384 floats, unit length).

Per batch TorchServe hands over: look each text up in the worker's LRU cache, tokenize the misses with ONE call of the
fast tokenizer, group them by token length and run one forward pass per group, then answer every request with exactly
its own rows, in order. Request shapes and validation: :mod:`handlers.embedding.requests`; batch assembly and
answers: :mod:`handlers.embedding.batch` (with ``cache`` and ``buckets``); the model (encoder + mean pooling + L2
normalisation) and its files: :mod:`handlers.embedding.encoder`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from handlers.core import memory, runtime
from handlers.core.base import BatchScope, PrecisionChoice, ServingHandler
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option
from handlers.core.http import RequestView
from handlers.core.metrics import HandlerMetrics
from handlers.embedding.batch import (
    ComputedBatch,
    EmbeddingBatch,
    answer_requests,
    assemble_batch,
    encode_padded,
    pad_rows,
)
from handlers.embedding.cache import CacheKey, EmbeddingCache, cache_key
from handlers.embedding.encoder import LoadedEncoder, load_embedding_model, read_json
from handlers.embedding.requests import EmbeddingRequest, parse_embedding_request

logger = logging.getLogger(__name__)

Tokens = tuple[torch.Tensor, torch.Tensor]  # (input_ids, attention_mask), [rows, length]


class EmbeddingHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
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
        "aot_package": Option(str, "minilm.pt2", help="AOTInductor package in the archive, for compile: aot"),
    }
    loaded: LoadedEncoder

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.cache = EmbeddingCache(self.config["cache_size"])

    def load_model(self, model_dir: str) -> LoadedEncoder:
        return load_embedding_model(model_dir, self.config)

    def reference_batch(self, loaded: LoadedEncoder) -> Tokens:
        sentences = read_json(self.model_dir, self.config["reference_sentences"])
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise ConfigError(
                f"handler.reference_sentences: {self.config['reference_sentences']} must be a list of strings"
            )
        return encode_padded(loaded, sentences)

    def warmup_batches(self, loaded: LoadedEncoder) -> list[Tokens]:
        """Every bucket length with 1 row and with 2 rows (half padded), for compiled models.

        With dynamic shapes one graph serves every batch size >= 2 and every length; size 1 is specialised by
        the compiler, so both are run. The jit unit test proves a mixed load afterwards compiles nothing.
        """
        token = loaded.pad_id + 1000
        if self.config["compile"] == "none":  # eager has nothing to compile: one small pass warms the kernels
            return [pad_rows([[token] * loaded.buckets[0]], loaded.buckets[0], loaded.pad_id)]
        batches = []
        for length in loaded.buckets:
            for rows in (1, 2):
                real = [length] + [max(2, length // 2)] * (rows - 1)
                batches.append(pad_rows([[token] * n for n in real], length, loaded.pad_id))
        return batches

    def forward(self, model: Any, batch: Tokens) -> torch.Tensor:
        input_ids, attention_mask = batch
        return model(input_ids.to(self.device), attention_mask.to(self.device))

    def encode_padded(self, texts: list[str]) -> Tokens:
        """Texts as one padded batch for :meth:`forward` (benchmarks time the bare forward pass with it)."""
        return encode_padded(self.loaded, texts)

    def load_aot(self, choice: PrecisionChoice, loaded: LoadedEncoder, reference: Tokens) -> Any:
        """The prebuilt AOTInductor package: check it fits what this worker serves, load it, compare with eager."""
        package = self.config["aot_package"]
        path = os.path.join(self.model_dir, package)
        if not os.path.isfile(path):
            raise ConfigError(
                f"handler.compile: aot needs {package} in the archive; build it with "
                f"`python -m scripts.package minilm-aot`"
            )
        built = read_json(self.model_dir, package + ".json")
        problems = []
        if built["precision"] != choice.precision:
            problems.append(f"it was built for {built['precision']} but this worker serves {choice.precision}")
        if built["device"] != self.device.type:
            problems.append(f"it was built for {built['device']} but this worker runs on {self.device.type}")
        if built["max_tokens"] < loaded.buckets[-1]:
            problems.append(f"it takes at most {built['max_tokens']} tokens, the last bucket is {loaded.buckets[-1]}")
        most_rows = self.config["max_forward_tokens"] // loaded.buckets[0]
        if built["max_batch"] < most_rows:
            problems.append(f"it takes at most {built['max_batch']} rows, a forward pass may hold {most_rows}")
        if problems:
            raise ConfigError(f"handler.compile: {package} does not fit: " + "; ".join(problems))
        compiled = torch._inductor.aoti_load_package(path)
        similarity = runtime.min_cosine_similarity(
            self.forward(choice.model, reference), self.forward(compiled, reference)
        )
        if similarity < self.config["min_cosine"]:
            raise ConfigError(
                f"handler.compile: {package} reached min cosine {similarity:.6f} "
                f"to the eager model, below {self.config['min_cosine']}"
            )
        logger.info("loaded %s (built for %s); min cosine to eager %.6f", path, built["precision"], similarity)
        return compiled

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "max_tokens": self.loaded.max_tokens,
            "length_buckets": self.loaded.buckets,
            "cache_size": self.config["cache_size"],
            "cached": len(self.cache),
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
        )

    def inference(self, batch: EmbeddingBatch, scope: BatchScope) -> ComputedBatch:
        """One forward pass per length group; rows land at their own positions."""
        embeddings = torch.empty(len(batch.compute_keys), self.loaded.dimension, dtype=torch.float32)
        for forward_pass in batch.passes:
            output = self.forward(self.loaded.model, (forward_pass.input_ids, forward_pass.attention_mask))
            embeddings[torch.tensor(forward_pass.rows, dtype=torch.long)] = output.to("cpu", torch.float32)
        return ComputedBatch(batch, embeddings)

    def postprocess(self, computed: ComputedBatch, payloads: list[EmbeddingRequest]) -> list[Any]:
        return answer_requests(computed, payloads, self.cache, self.model_name)

    def after_batch(self, batch: EmbeddingBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        stats = batch.stats
        if stats is None:
            return
        metrics.record("CacheHits", stats.hits)
        metrics.record("CacheMisses", stats.misses)
        metrics.record("PaddedTokens", stats.padded_tokens)
        metrics.record("RealTokens", stats.real_tokens)
        threshold = self.config["release_memory_tokens"]
        if threshold and stats.padded_tokens >= threshold:
            # Otherwise the allocator keeps what this batch's activations and tokenizer buffers freed, and the
            # worker's RSS ratchets up with every larger batch (see handlers/core/memory.py).
            memory.release_free_memory()
