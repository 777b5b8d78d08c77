"""The similarity cache's optional model verifier: a cross-encoder (a text-pair classifier or a one-output reranker)
that reads the new prompt and a stored one together and says whether they ask the same thing.

A bi-encoder compares two vectors made apart; a cross-encoder attends across both texts, so it sees the word order,
the swapped places and the one flipped word that a cosine cannot. It costs a forward pass per pair, so it scores only
the candidates the embedding lookup proposed (and the lexical check let through), all of a generator batch's pairs
in one call.

The archive packs the model folder (``verifier/``, staged by scripts/prepare_text_model.py --kind classification when
the generator is packaged with ``--var verifier=<folder>``: checked, proved against transformers, backends built and
ranked). :class:`handlers.text.engine.TextEngine` loads it exactly as a text-classifier worker loads its archive
(backend walk and accuracy gate, length buckets, its LRU of scores) and scores the pairs, so nothing here runs a model
itself.

Which number is "the same question": a one-output model (a reranker / similarity cross-encoder) answers it; a
classifier answers the probability of its positive label (``verifier_label``; ``auto`` finds one named like
duplicate, paraphrase, equivalent, entailment or same).
"""

from __future__ import annotations

import os
from typing import Any

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.generation.semantic_cache.embedder import started
from handlers.text.engine import TextEngine

# Label names that mean "the two texts say the same thing" in common pair classifiers (Quora duplicate questions,
# MRPC / PAWS paraphrase, NLI entailment, STS).
POSITIVE_LABELS = (
    "duplicate",
    "is_duplicate",
    "paraphrase",
    "equivalent",
    "entailment",
    "same",
    "similar",
    "match",
    "yes",
    "true",
    "positive",
    "label_1",
    "1",
)


class Verifier:
    """Scores of (new prompt, stored prompt) pairs, computed by the text engine of a pair classifier."""

    def __init__(self, engine: TextEngine, label: str) -> None:
        self.engine = engine
        labels = list(engine.loaded.info.labels)
        self.labels = labels
        self.label = positive_label(labels, label)
        self.max_chars = int(engine.config["max_text_chars"])

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """One score in [0, 1] per pair (the positive label's probability, or a reranker's relevance), all pairs
        computed together. A pair over the model's limits (its characters, or tokens, of one text) scores 0: not
        verified."""
        usable = [index for index, (a, b) in enumerate(pairs) if len(a) + len(b) <= self.max_chars]
        scores = [0.0] * len(pairs)
        column = self.labels.index(self.label)
        for index, row in zip(usable, self.engine.score([pairs[index] for index in usable]), strict=True):
            if not isinstance(row, RequestError):
                scores[index] = float(row.value[column])
        return scores

    def describe(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "model": {key: engine.kind.describe(engine.loaded.info)[key] for key in ("architecture", "labels")},
            "label": self.label,
            "backend": engine.backend,
            "precision": engine.precision,
            "backend_min_cosine": round(engine.min_cosine, 6),
        }


def positive_label(labels: list[str], wanted: str) -> str:
    """The label whose probability means "same question": the only one of a one-output model, ``wanted`` when named,
    else the first whose name is one of POSITIVE_LABELS."""
    if wanted != "auto":
        if wanted not in labels:
            raise ConfigError(f"handler.semantic_cache.verifier_label: {wanted!r} is not one of the model's {labels}")
        return wanted
    if len(labels) == 1:
        return labels[0]
    for name in POSITIVE_LABELS:
        for label in labels:
            if label.casefold() == name:
                return label
    raise ConfigError(
        f"handler.semantic_cache.verifier_label: cannot tell which of the verifier's labels {labels} means 'the "
        "same question'; name it (verifier_label: <label>)"
    )


def load_verifier(
    model_dir: str,
    folder: str,
    handler_config: dict[str, Any],
    label: str,
    owner: str,
    version: str,
    threads: int,
    gpu: Any,
) -> Verifier | None:
    """The text engine of the pair classifier in ``model_dir/folder``, or None when the archive packs no such
    folder."""
    path = os.path.join(model_dir, folder) if folder else ""
    if not path or not os.path.isdir(path):
        return None
    engine = started(path, handler_config, "classification", f"{owner}-verifier", version, threads, gpu)
    return Verifier(engine, label)
