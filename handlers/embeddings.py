"""Handler for ``minilm``: sentence embeddings from all-MiniLM-L6-v2 (384 floats, unit length).

Per batch TorchServe hands over: look each text up in the worker's LRU cache, tokenize the misses with ONE call of the
fast tokenizer, group them by token length (handlers/length_buckets.py) and run one forward pass per group, then
answer every request with exactly its own rows, in order. Request shapes and validation: handlers/embedding_requests.py.
The model (encoder + mean pooling + L2 normalisation): handlers/sentence_encoder.py.
"""

import hashlib
import logging
import os
import torch

from handlers import memory, runtime
from handlers.base import ServingHandler
from handlers.config import COMMON_OPTIONS, ConfigError, Option
from handlers.embedding_batch import EmbeddingBatch
from handlers.embedding_cache import CachedEmbedding, EmbeddingCache
from handlers.embedding_requests import EmbeddingLimits, format_response, parse_embedding_request
from handlers.errors import RequestError, too_large
from handlers.length_buckets import check_buckets, padded_tokens, plan_forward_groups
from handlers.sentence_encoder import (check_pooling, load_sentence_encoder, load_tokenizer, max_sequence_tokens,
                                       read_json)

logger = logging.getLogger(__name__)


class EmbeddingHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "max_inputs": Option(int, 64, minimum=1, maximum=4096, help="texts one request may carry ('input' list)"),
        # Cost bounds per request (the README's Reliability section has the measured worst case at these values).
        "max_text_chars": Option(int, 20000, minimum=1, help="characters one text may have; checked before "
                                 "tokenizing, which reads the whole text even when it is truncated"),
        "max_request_chars": Option(int, 50000, minimum=1, help="characters of all texts of one request"),
        "max_request_tokens": Option(int, 1024, minimum=1, help="tokens of one request after truncation "
                                     "(usage.prompt_tokens); bounds its forward passes"),
        "cache_size": Option(int, 4096, minimum=0, help="embeddings kept in the worker's LRU cache; 0 disables it"),
        "length_buckets": Option(list, [16, 32, 64, 128, 256],
                                 help="token lengths rows are padded to; the last must be the model's limit"),
        "max_forward_tokens": Option(int, 8192, minimum=256, help="padded tokens one forward pass may hold"),
        "release_memory_tokens": Option(int, 512, minimum=0, help="after a batch of at least this many padded "
                                        "tokens, return freed heap memory to the OS (~2 ms); 0 = never"),
        "reference_sentences": Option(str, "reference_sentences.json", help="accuracy-gate sentences in the archive"),
        "aot_package": Option(str, "minilm.pt2", help="AOTInductor package in the archive, for compile: aot"),
    }

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the archive; never ask the hub
        self.dimension = check_pooling(model_dir)
        self.max_tokens = max_sequence_tokens(model_dir)
        try:
            self.buckets = check_buckets(self.config["length_buckets"], self.max_tokens)
        except ValueError as error:
            raise ConfigError(f"handler.length_buckets: {error}") from None
        if self.config["max_forward_tokens"] < self.max_tokens:
            raise ConfigError(f"handler.max_forward_tokens must hold one {self.max_tokens}-token row")
        if self.config["max_request_chars"] < self.config["max_text_chars"]:
            raise ConfigError(f"handler.max_request_chars ({self.config['max_request_chars']}) is below "
                              f"handler.max_text_chars ({self.config['max_text_chars']}): no request could carry "
                              f"the longest text allowed")
        self.limits = EmbeddingLimits(self.config["max_inputs"], self.config["max_text_chars"],
                                      self.config["max_request_chars"])
        self.tokenizer = load_tokenizer(model_dir, self.max_tokens)
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0
        self.cache = EmbeddingCache(self.config["cache_size"])
        return load_sentence_encoder(model_dir)

    def encode_padded(self, texts, pad_length=None):
        """Tokenize texts in one call and pad them to one length (for the gate and warm-up inputs)."""
        encodings = self.tokenizer.encode_batch(texts)
        pad_length = pad_length or max(len(e.ids) for e in encodings)
        return self.pad_rows([e.ids for e in encodings], pad_length)

    def pad_rows(self, id_lists, pad_length):
        ids = [row + [self.pad_id] * (pad_length - len(row)) for row in id_lists]
        mask = [[1] * len(row) + [0] * (pad_length - len(row)) for row in id_lists]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def reference_batch(self):
        sentences = read_json(self.model_dir, self.config["reference_sentences"])
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise ConfigError(f"handler.reference_sentences: {self.config['reference_sentences']} must be a list "
                              f"of strings")
        return self.encode_padded(sentences)

    def warmup_batches(self):
        """Every bucket length with 1 row and with 2 rows (half padded), for compiled models.

        With dynamic shapes one graph serves every batch size >= 2 and every length; size 1 is specialised by
        the compiler, so both are run. The jit unit test proves a mixed load afterwards compiles nothing.
        """
        if self.config["compile"] == "none":  # eager has nothing to compile: one small pass warms the kernels
            return [self.pad_rows([[self.pad_id + 1000] * self.buckets[0]], self.buckets[0])]
        batches = []
        for length in self.buckets:
            for rows in (1, 2):
                real = [length] + [max(2, length // 2)] * (rows - 1)
                id_lists = [[self.pad_id + 1000] * n for n in real]
                batches.append(self.pad_rows(id_lists, length))
        return batches

    def forward(self, model, batch):
        input_ids, attention_mask = batch
        return model(input_ids.to(self.device), attention_mask.to(self.device))

    def load_aot(self, model_dir):
        """The prebuilt AOTInductor package: check it fits what this worker serves, load it, compare with eager."""
        path = os.path.join(model_dir, self.config["aot_package"])
        if not os.path.isfile(path):
            raise ConfigError(f"handler.compile: aot needs {self.config['aot_package']} in the archive; build it with "
                              f"`python -m scripts.package minilm-aot`")
        built = read_json(model_dir, self.config["aot_package"] + ".json")
        problems = []
        if built["precision"] != self.precision:
            problems.append(f"it was built for {built['precision']} but this worker serves {self.precision}")
        if built["device"] != self.device.type:
            problems.append(f"it was built for {built['device']} but this worker runs on {self.device.type}")
        if built["max_tokens"] < self.buckets[-1]:
            problems.append(f"it takes at most {built['max_tokens']} tokens, the last bucket is {self.buckets[-1]}")
        most_rows = self.config["max_forward_tokens"] // self.buckets[0]
        if built["max_batch"] < most_rows:
            problems.append(f"it takes at most {built['max_batch']} rows, a forward pass may hold {most_rows}")
        if problems:
            raise ConfigError(f"handler.compile: {self.config['aot_package']} does not fit: " + "; ".join(problems))
        compiled = torch._inductor.aoti_load_package(path)
        reference = self.reference_batch()
        similarity = runtime.min_cosine_similarity(self.forward(self.model, reference),
                                                   self.forward(compiled, reference))
        if similarity < self.config["min_cosine"]:
            raise ConfigError(f"handler.compile: {self.config['aot_package']} reached min cosine {similarity:.6f} "
                              f"to the eager model, below {self.config['min_cosine']}")
        logger.info("loaded %s (built for %s); min cosine to eager %.6f", path, built["precision"], similarity)
        return compiled

    def describe(self):
        return {**super().describe(), "max_tokens": self.max_tokens, "length_buckets": self.buckets,
                "cache_size": self.config["cache_size"], "cached": len(self.cache), "dimension": self.dimension,
                "limits": {key: self.config[key] for key in ("max_inputs", "max_text_chars", "max_request_chars",
                                                             "max_request_tokens")}}

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body, request):
        return parse_embedding_request(body, request.content_type, self.dimension, self.limits)

    def cache_key(self, text):
        # A digest, not the text: a full cache of max_text_chars texts would hold up to 4 bytes x 20,000 characters
        # x 4096 entries of keys (Python stores astral characters in 4 bytes each).
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        return (digest, self.model_version, self.precision, self.max_tokens)

    # ----------------------------------------------------------------------------------------------- per batch
    def run_batch(self, payloads, metrics):
        self.batch_stats = None
        results = super().run_batch(payloads, metrics)
        stats = self.batch_stats
        if stats is not None:
            metrics.record("BatchRows", stats["rows"])
            metrics.record("CacheHits", stats["hits"])
            metrics.record("CacheMisses", stats["misses"])
            if stats["real_tokens"]:
                metrics.record("PaddingRatio", stats["padded_tokens"] / stats["real_tokens"])
            threshold = self.config["release_memory_tokens"]
            if threshold and stats["padded_tokens"] >= threshold:
                # Otherwise the allocator keeps what this batch's activations and tokenizer buffers freed, and the
                # worker's RSS ratchets up with every larger batch (see handlers/memory.py).
                memory.release_free_memory()
        return results

    def preprocess(self, payloads):
        """Cache lookups, one tokenizer call for the misses, truncation checks, then padded length groups."""
        batch = EmbeddingBatch(keys=[], known={}, errors=[None] * len(payloads))
        miss_index = {}  # key -> position among the misses (a text repeated in the batch is computed once)
        misses, miss_keys = [], []
        for payload in payloads:
            keys = [self.cache_key(text) for text in payload.texts]
            batch.keys.append(keys)
            for key, text in zip(keys, payload.texts):
                if key in batch.known or key in miss_index:
                    continue
                cached = self.cache.get(key)
                if cached is not None:
                    batch.known[key] = cached
                else:
                    miss_index[key] = len(misses)
                    misses.append(text)
                    miss_keys.append(key)
        encodings = self.tokenizer.encode_batch(misses) if misses else []

        needed = set()
        max_request_tokens = self.config["max_request_tokens"]
        for number, (payload, keys) in enumerate(zip(payloads, batch.keys)):
            tokens = 0
            for key, name in zip(keys, payload.names):
                if key in batch.known:
                    truncated, tokens = batch.known[key].truncated, tokens + batch.known[key].tokens
                else:
                    encoding = encodings[miss_index[key]]
                    truncated, tokens = bool(encoding.overflowing), tokens + len(encoding.ids)
                if truncated and not payload.truncate:
                    batch.errors[number] = RequestError(
                        f"{name} is longer than the model's limit of {self.max_tokens} tokens and 'truncate' is false")
                    break
            # Counted whether or not the rows are cached, so that acceptance never depends on the cache's state.
            if batch.errors[number] is None and tokens > max_request_tokens:
                batch.errors[number] = too_large(f"the request has {tokens} tokens after truncation; "
                                                 f"handler.max_request_tokens is {max_request_tokens}")
            if batch.errors[number] is None:
                needed.update(miss_index[key] for key in keys if key in miss_index)

        order = sorted(needed)  # misses some accepted request needs, in arrival order
        batch.compute_keys = [miss_keys[m] for m in order]
        batch.compute_tokens = [len(encodings[m].ids) for m in order]
        batch.compute_truncated = [bool(encodings[m].overflowing) for m in order]
        groups = plan_forward_groups(batch.compute_tokens, self.buckets, self.config["max_forward_tokens"])
        for group in groups:
            # Tensors are made here, outside inference mode, exactly like warm-up's (a compiled graph guards on it).
            input_ids, attention_mask = self.pad_rows([encodings[order[row]].ids for row in group.rows],
                                                      group.pad_length)
            batch.passes.append((group.rows, input_ids, attention_mask))

        self.batch_stats = {
            "rows": sum(len(keys) for keys, error in zip(batch.keys, batch.errors) if error is None),
            "hits": len(batch.known), "misses": len(order),
            "padded_tokens": padded_tokens(groups), "real_tokens": sum(batch.compute_tokens),
        }
        return batch

    def inference(self, batch):
        """One forward pass per length group; rows land at their own positions."""
        embeddings = torch.empty(len(batch.compute_keys), self.dimension, dtype=torch.float32)
        for rows, input_ids, attention_mask in batch.passes:
            output = self.forward(self.model, (input_ids, attention_mask))
            embeddings[torch.tensor(rows, dtype=torch.long)] = output.to("cpu", torch.float32)
        batch.embeddings = embeddings
        return batch

    def postprocess(self, batch, payloads):
        """Store the computed rows in the cache, then answer each request with its own rows in its own order."""
        for row, key in enumerate(batch.compute_keys):
            entry = CachedEmbedding(batch.embeddings[row].clone(), batch.compute_tokens[row],
                                    batch.compute_truncated[row])
            batch.known[key] = entry
            self.cache.put(key, entry)
        results = []
        for payload, keys, error in zip(payloads, batch.keys, batch.errors):
            if error is not None:
                results.append(error)
            else:
                results.append(format_response(payload, [batch.known[key] for key in keys], self.model_name))
        return results
