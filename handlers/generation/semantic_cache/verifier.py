"""The similarity cache's optional model verifier: a cross-encoder (a text-pair classifier or a one-output reranker)
that reads the new prompt and a stored one together and says whether they ask the same thing.

A bi-encoder compares two vectors made apart; a cross-encoder attends across both texts, so it sees the word order,
the swapped places and the one flipped word that a cosine cannot. It costs a forward pass per pair, so it scores only
the candidates the embedding lookup proposed (and the lexical check let through), all of a generator batch's pairs
in one call.

The archive packs the model folder (``verifier/``, staged by scripts/prepare_text_model.py --kind classification when
the generator is packaged with ``--var verifier=<folder>``: checked, proved against transformers, backends built and
ranked). :class:`handlers.text_classifier.TextClassifierHandler` loads it exactly as it would load a text-classifier
archive (backend walk and accuracy gate, length buckets, its LRU of scores); pairs go through that handler's request
parser and batch stages, so nothing here runs a model itself.

Which number is "the same question": a one-output model (a reranker / similarity cross-encoder) answers it; a
classifier answers the probability of its positive label (``verifier_label``; ``auto`` finds one named like
duplicate, paraphrase, equivalent, entailment or same).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.core.http import RequestView
from handlers.generation.semantic_cache.embedder import started

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
    """Scores of (new prompt, stored prompt) pairs through the text-classification handler's stages."""

    def __init__(self, handler: Any, label: str) -> None:
        self.handler = handler
        labels = list(handler.loaded.info.labels)
        self.labels = labels
        self.label = positive_label(labels, label)
        self.max_pairs = int(handler.config["max_inputs"])
        self.max_chars = int(handler.config["max_text_chars"])

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """One score in [0, 1] per pair (the positive label's probability, or a reranker's relevance), computed in
        calls of at most the handler's max_inputs pairs. A pair the handler refuses (a text over its limits) scores
        0: not verified."""
        scores: list[float] = []
        for start in range(0, len(pairs), self.max_pairs):
            scores += self.score_chunk(pairs[start : start + self.max_pairs])
        return scores

    def score_chunk(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Scores of at most max_inputs pairs in one call; a call the handler refuses as too large (its
        max_request_tokens, max_request_chars) is split in halves, and a single pair it refuses scores 0."""
        usable = [index for index, (a, b) in enumerate(pairs) if len(a) + len(b) <= self.max_chars]
        scores = [0.0] * len(pairs)
        if not usable:
            return scores
        body = {"inputs": [list(pairs[index]) for index in usable], "top_k": None, "truncate": True}
        try:
            payload = self.handler.parse_request(body, RequestView(None, 0))
            with torch.inference_mode():
                batch = self.handler.preprocess([payload])
                computed = self.handler.inference(batch, None)
            [answer] = self.handler.postprocess(computed, [payload])
            if isinstance(answer, RequestError):
                raise answer
        except RequestError:
            if len(usable) == 1:
                return scores
            half = len(usable) // 2
            for part in (usable[:half], usable[half:]):
                for index, score in zip(part, self.score_chunk([pairs[index] for index in part]), strict=True):
                    scores[index] = score
            return scores
        for index, result in zip(usable, answer["results"], strict=True):
            scores[index] = next(float(s["score"]) for s in result["scores"] if s["label"] == self.label)
        return scores

    def describe(self) -> dict[str, Any]:
        handler = self.handler
        return {
            "model": {key: handler.kind.describe(handler.loaded.info)[key] for key in ("architecture", "labels")},
            "label": self.label,
            "backend": handler.backend,
            "precision": handler.precision,
            "backend_min_cosine": round(handler.min_cosine, 6),
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
    """The text-classification handler for ``model_dir/folder`` (initialised as TorchServe initialises a worker's
    handler), or None when the archive packs no such folder."""
    from handlers.text_classifier import TextClassifierHandler

    path = os.path.join(model_dir, folder) if folder else ""
    if not path or not os.path.isdir(path):
        return None
    handler = started(TextClassifierHandler(), path, handler_config, f"{owner}-verifier", version, threads, gpu)
    return Verifier(handler, label)
