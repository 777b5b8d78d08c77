"""The similarity cache of one generator worker: which requests may be answered from it, their groups, the lookups of
a batch, the answers it keeps, and its metrics.

A stored answer is served only where it is a correct answer for the new request: the embedding lookup proposes the
most similar stored prompts within the (recall) threshold, a verification step decides whether the new prompt asks
the same thing as one of them (the lexical check, lexical.py, and where the archive packs one, a cross-encoder,
verifier.py), and everything else that decides the answer must be equal. That is the request's **group**, a
hash of: the model's name, version and identity (its archive's content digest); the API's prompt form (a prompt, or
a chat with the template); a chat's earlier messages, system prompt included, exactly; max new tokens; temperature,
top_k, top_p; stop sequences; the request's partition; and for sampled requests the seed. A lookup compares vectors
within its own group only.

Not looked up (and not stored), each counted by reason: requests that opt out (``"semantic_cache": false``), sampled
requests without a seed (they asked for a fresh random draw), chats whose last message is not the user's, prompts
longer than the embedding model's window (the cut tail could change the meaning, and an answer is never served for
half a prompt), and a batch whose embedding failed. The cache never fails a request: any of its errors is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.errors import RequestError
from handlers.core.metrics import HandlerMetrics
from handlers.generation.decoding import SamplingSettings
from handlers.generation.semantic_cache import lexical
from handlers.generation.semantic_cache.embedder import Embedder, load_embedder
from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION, PromptLookup
from handlers.generation.semantic_cache.shared import SemanticTier, SharedEntry, embedder_fingerprint
from handlers.generation.semantic_cache.store import FINISH_REASONS, Candidate, Hit, SemanticStore, StoredAnswer
from handlers.generation.semantic_cache.verifier import Verifier, load_verifier
from handlers.text.shared_cache import effective_url, read_password, record_shared_cache, redacted

logger = logging.getLogger(__name__)

DUPLICATE_SIMILARITY = 0.9999  # an answer this close to a stored one of its group is not stored again


@dataclass(frozen=True)
class SemanticQuery:
    group: bytes
    text: str
    threshold: float


@dataclass(frozen=True)
class Probe:
    """A looked-up prompt that missed: its vector and wording, under which its new answer is stored."""

    vector: torch.Tensor
    prompt: str
    reading: lexical.Reading | None  # None with the lexical check off


@dataclass(frozen=True)
class Looked:
    """One query's outcome: a hit, or the Probe its new answer is stored under (``vector``), or why neither."""

    hit: Hit | None = None
    vector: Probe | None = None
    group: bytes = b""
    skip: str = ""


def exact_terms(text: str) -> str:
    """The prompt's numbers (digits and number words alike: "six" = "6") and how many negations it has. With
    handler.semantic_cache.exact_terms (the default) they are part of the group: a lookup only meets stored prompts
    that agree on them, so a near-miss that differs in a number never crowds out a candidate that does not."""
    reading = lexical.read(text)
    return f"{' '.join(reading.numbers)}|{reading.negations}"


def group_hash(fields: list[str]) -> bytes:
    # Length-prefixed: ("a:b", "c") and ("a", "b:c") must not hash alike.
    data = b"".join(len(f.encode()).to_bytes(4, "little") + f.encode() for f in fields)
    return hashlib.blake2b(data, digest_size=16).digest()


class SemanticCache:
    def __init__(
        self,
        settings: dict[str, Any],
        embedder: Embedder,
        model: dict[str, str],
        shared: SemanticTier | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.settings = settings
        self.threshold = settings["threshold"]
        self.embedder = embedder
        self.verifier = verifier
        # name (TorchServe's), version, identity (the archive's content digest: what the weights are, where info says
        # only "user-supplied"), info (name and weights shown in answers)
        self.model = model
        self.store = SemanticStore(embedder.dimension, settings["capacity"], settings["max_bytes"], settings["ttl_s"])
        self.shared = shared
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # candidates each check refused
        self.lookup_ms: list[float] = []
        if shared is not None:
            received = shared.read_backlog()
            self.keep(received)
            logger.info("semantic cache: %d entries from the shared tier at load", len(received))

    # ------------------------------------------------------------------------------------------------- per request
    def query(self, settings: SamplingSettings, stop: tuple[str, ...], lookup: PromptLookup | None) -> Any:
        """The request's SemanticQuery, or the reason it is not looked up (a string); refuses a min_similarity
        below the model's threshold (a request may only be stricter)."""
        if lookup is None or not lookup.option.use:
            return "opted_out"
        if lookup.text is None:
            return lookup.skip or "not_looked_up"
        if not settings.greedy and not lookup.seed_given:
            return "unseeded_sampling"
        threshold = self.threshold
        wanted = lookup.option.min_similarity
        if wanted is not None:
            if wanted < self.threshold:
                raise RequestError(
                    f"'semantic_cache.min_similarity' is {wanted}; it may only be stricter than this model's "
                    f"threshold {self.threshold} (handler.semantic_cache.threshold)"
                )
            threshold = wanted
        fields = [
            self.model["name"],
            self.model["version"],
            self.model["identity"],
            self.model["info"],
            lookup.api,
            lookup.context,
            str(settings.max_new_tokens),
            settings.temperature.hex(),
            str(settings.top_k),
            settings.top_p.hex(),
            "" if settings.greedy else str(settings.seed),
            json.dumps(list(stop)),
            lookup.option.partition,
            exact_terms(lookup.text) if self.settings["exact_terms"] else "",
        ]
        return SemanticQuery(group_hash(fields), lookup.text, threshold)

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    # ------------------------------------------------------------------------------------------------- per batch
    def look_up_batch(self, queries: list[Any]) -> list[Looked]:
        """One Looked per request of a batch: ``queries`` holds each request's SemanticQuery, or the reason it is not
        looked up (counted here), or None (nothing to look up)."""
        asked = [position for position, query in enumerate(queries) if isinstance(query, SemanticQuery)]
        for query in queries:
            if isinstance(query, str):
                self.skip(query)
        looked = [Looked() for _ in queries]
        if asked:
            for position, item in zip(asked, self.lookup([queries[p] for p in asked]), strict=True):
                looked[position] = item
        return looked

    def lookup(self, queries: list[SemanticQuery]) -> list[Looked]:
        """Embed the queries' texts in one call of the embedding handler, take what other workers stored since the
        last batch, then search each query's group."""
        started = time.perf_counter()
        self.sync()
        try:
            rows = self.embedder.embed([query.text for query in queries])
        except Exception:  # the cache must never fail a request: no lookup for this batch
            logger.warning("semantic cache: embedding %d prompt(s) failed", len(queries), exc_info=True)
            rows = [RequestError("embedding failed")] * len(queries)
        looked = []
        for query, row in zip(queries, rows, strict=True):
            if isinstance(row, RequestError):
                looked.append(Looked(skip="embed_failed"))
            elif row.truncated:
                looked.append(Looked(skip="too_long"))
            else:
                looked.append(Looked(vector=self.probe(query.text, row.value), group=query.group))
        found = [
            self.store.candidates(query.group, item.vector.vector, query.threshold, self.settings["candidates"])
            if item.vector is not None
            else []
            for query, item in zip(queries, looked, strict=True)
        ]
        for position, hit in self.verify(looked, found).items():
            looked[position] = Looked(hit=hit, group=looked[position].group)
        for item in looked:
            if item.skip:
                self.skip(item.skip)
            else:
                self.counts["hits" if item.hit is not None else "misses"] += 1
        self.lookup_ms.append((time.perf_counter() - started) * 1000)
        return looked

    def probe(self, text: str, vector: torch.Tensor) -> Probe:
        return Probe(vector, text, lexical.read(text) if self.settings["lexical_check"] else None)

    def verify(self, looked: list[Looked], found: list[list[Candidate]]) -> dict[int, Hit]:
        """The hits: for each lookup, its most similar candidate that passes the lexical check (where on) and the
        verifier (where packed; all the batch's pairs scored in one call, the best score answers)."""
        passed: list[list[Candidate]] = []
        for item, candidates in zip(looked, found, strict=True):
            probe = item.vector
            kept = []
            for candidate in candidates:
                if probe is None or (probe.reading is not None and self.lexically_refused(probe.reading, candidate)):
                    self.refused["lexical"] += 1
                else:
                    kept.append(candidate)
            passed.append(kept)
        if self.verifier is not None:
            passed = self.verified(looked, passed)
        hits = {}
        for position, candidates in enumerate(passed):
            if candidates:
                self.store.touch(candidates[0].entry_id)
                hits[position] = candidates[0].hit
        return hits

    def lexically_refused(self, reading: lexical.Reading, candidate: Candidate) -> bool:
        stored = candidate.reading
        if stored is None:  # an entry from the shared tier is read when it first becomes a candidate
            stored = lexical.read(candidate.prompt)
            self.store.set_reading(candidate.entry_id, stored)
        return bool(lexical.compare(reading, stored))

    def verified(self, looked: list[Looked], passed: list[list[Candidate]]) -> list[list[Candidate]]:
        """The candidates the verifier scores at or above its threshold, best score first (none where it fails)."""
        assert self.verifier is not None
        pairs = [
            (item.vector.prompt, candidate.prompt)
            for item, candidates in zip(looked, passed, strict=True)
            if item.vector is not None
            for candidate in candidates
        ]
        if not pairs:
            return passed
        try:
            scores = iter(self.verifier.score(pairs))
        except Exception:  # the cache must never fail a request: unverified candidates answer nothing
            logger.warning("semantic cache: verifying %d pair(s) failed", len(pairs), exc_info=True)
            self.refused["verifier_failed"] += len(pairs)
            return [[] for _ in passed]
        threshold = self.settings["verifier_threshold"]
        kept = []
        for candidates in passed:
            scored = [(next(scores), candidate) for candidate in candidates]
            good = [candidate for score, candidate in sorted(scored, key=lambda pair: -pair[0]) if score >= threshold]
            self.refused["verifier"] += len(scored) - len(good)
            kept.append(good)
        return kept

    def remember(self, answers: list[tuple[bytes, Probe, StoredAnswer]]) -> None:
        """Keep new answers (not one already stored for the same prompt), and hand them to the shared tier."""
        stored = []
        for group, probe, answer in answers:
            if answer.finish_reason not in FINISH_REASONS:
                continue
            if self.store.lookup(group, probe.vector, DUPLICATE_SIMILARITY) is not None:
                continue
            created = time.time()
            if self.store.insert(group, probe.vector, answer, created, probe.prompt, probe.reading):
                stored.append(SharedEntry(group, probe.vector, answer, created, probe.prompt))
        self.counts["stored"] += len(stored)
        if self.shared is not None and stored:
            self.shared.publish(stored)

    def sync(self) -> None:
        if self.shared is None:
            return
        self.keep(self.shared.poll())

    def keep(self, received: list[SharedEntry]) -> None:
        """Other workers' answers into this worker's index, with their writers' creation times."""
        for entry in received:
            self.store.insert(entry.group, entry.vector, entry.answer, entry.created, entry.prompt)

    def record(self, metrics: HandlerMetrics) -> None:
        """This batch's figures (counters only when non-zero)."""
        for name, key in (
            ("SemanticCacheHits", "hits"),
            ("SemanticCacheMisses", "misses"),
            ("SemanticCacheStored", "stored"),
        ):
            if self.counts[key]:
                metrics.record(name, self.counts[key])
        for reason, count in self.skipped.items():
            metrics.record("SemanticCacheSkipped", count, [("Reason", reason)])
        for check, count in self.refused.items():
            metrics.record("SemanticCacheRefused", count, [("Check", check)])
        if self.shared is not None:
            received = self.shared.drain_received()
            if received:
                metrics.record("SemanticCacheReceived", received)
            record_shared_cache(self.shared, metrics)
        for milliseconds in self.lookup_ms:
            metrics.record("SemanticCacheLookupMilliseconds", milliseconds)
        metrics.record("SemanticCacheEntries", len(self.store))
        self.counts.clear()
        self.skipped.clear()
        self.refused.clear()
        self.lookup_ms = []

    def describe(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "candidates": self.settings["candidates"],
            "exact_terms": self.settings["exact_terms"],
            "lexical_check": self.settings["lexical_check"],
            "verifier_threshold": self.settings["verifier_threshold"] if self.verifier is not None else None,
            "capacity": self.settings["capacity"],
            "max_bytes": self.settings["max_bytes"],
            "ttl_s": self.settings["ttl_s"],
            **self.store.describe(),
            "embedder": self.embedder.describe(),
            "verifier": self.verifier.describe() if self.verifier is not None else None,
            "shared": self.shared.describe() if self.shared is not None else None,
        }


def open_semantic_cache(
    raw_settings: dict[str, Any],
    model_dir: str,
    model: dict[str, str],
    max_completion_tokens: int,
    threads: int,
    gpu: Any,
) -> SemanticCache | None:
    """The worker's cache, or None when it is off (``enabled: false``, or ``auto`` and no embedder in the archive)."""
    settings = SEMANTIC_CACHE_OPTION.check("semantic_cache", raw_settings)
    enabled = settings["enabled"]
    if enabled is False or (enabled == "auto" and not os.path.isdir(os.path.join(model_dir, settings["embedder"]))):
        return None
    embedder = load_embedder(
        model_dir, settings["embedder"], settings["embedder_handler"], model["name"], model["version"], threads, gpu
    )
    shared = None
    url = effective_url(settings["shared"]["url"])
    if url:
        described = embedder.describe()
        fingerprint = embedder_fingerprint(
            json.dumps(described["model"], sort_keys=True),
            described["backend"],
            described["precision"],
            embedder.dimension,
            described["identity"],
        )
        shared = SemanticTier(
            settings["shared"],
            url,
            read_password(),
            f"sem:{model['name']}:{model['version']}:answers",
            fingerprint,
            embedder.dimension,
            settings["capacity"],
            settings["ttl_s"],
            max_completion_tokens,
        )
        logger.info("semantic cache shared tier %s, stream %s", redacted(url), shared.stream_key)
    verifier = load_verifier(
        model_dir,
        settings["verifier"],
        settings["verifier_handler"],
        settings["verifier_label"],
        model["name"],
        model["version"],
        threads,
        gpu,
    )
    cache = SemanticCache(settings, embedder, model, shared, verifier)
    logger.info(
        "semantic cache on: threshold %.3f, %d candidate(s), lexical check %s, verifier %s, capacity %d, "
        "embedder %s %s",
        settings["threshold"],
        settings["candidates"],
        "on" if settings["lexical_check"] else "off",
        f"{verifier.engine.backend} {verifier.engine.precision} at {settings['verifier_threshold']}"
        if verifier is not None
        else "none",
        settings["capacity"],
        embedder.engine.backend,
        embedder.engine.precision,
    )
    return cache
