"""Text classifiers, NLI models and cross-encoder rerankers: an ``AutoModelForSequenceClassification`` folder of any
architecture (``id2label``, ``problem_type``), or a sentence-transformers ``CrossEncoder`` folder.

The answer is the model's logits turned into what its head means: softmax over labels for a single-label classifier,
a sigmoid per label for a multi-label one, and for a one-output model (a cross-encoder reranker) what
sentence-transformers' ``CrossEncoder`` applies (its saved ``activation_fn``, by default a sigmoid); an explicit
regression head answers its raw value. The gate compares those probabilities, not cosines of logits (a one-output
model's cosine is only the sign's agreement).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from handlers.core.http import RequestView
from handlers.text.cache import CachedRow
from handlers.text.dialects import cohere, jina, tei
from handlers.text.folder import (
    FolderError,
    TextModelFolder,
    optional_json,
    read_transformer_files,
    token_limit,
)
from handlers.text.kinds.base import Case, Reference, TextKind
from handlers.text.labels import MULTI_LABEL, REGRESSION, SCORE, SINGLE_LABEL, probabilities
from handlers.text.requests.classification import format_answer, format_rerank, parse_classification_request
from handlers.text.requests.common import RequestContext, decoded_body
from handlers.text.requests.rerank import RerankRequest
from handlers.text.requests.zero_shot import ZeroShotRequest, format_zero_shot, is_zero_shot, parse_zero_shot
from handlers.text.routes import Route


class TransformersClassifierReference(Reference):
    """transformers' own model and tokenizer of the folder, one row at a time."""

    def __init__(self, folder: Path, info: TextModelFolder) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        options = {"local_files_only": True, "trust_remote_code": info.remote_code}
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), **options)
        self.body = AutoModelForSequenceClassification.from_pretrained(str(folder), **options).eval()
        self.max_tokens = info.max_tokens

    def answer(self, case: Case) -> Any:
        inputs = self.tokenizer(case.text, case.pair, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        with torch.inference_mode():
            return self.body(**inputs).logits.float()[0]


class ClassificationKind(TextKind):
    name = "classification"
    reference_library = "transformers AutoModelForSequenceClassification"
    default_min_cosine = 0.99
    gate_measure = "1 - largest probability difference"

    def read_folder(self, folder: Path, trust_remote_code: bool) -> TextModelFolder:
        files = read_transformer_files(folder, "", trust_remote_code)
        config = files.config
        architectures = config.get("architectures") or []
        if not any(str(name).endswith("ForSequenceClassification") for name in architectures):
            raise FolderError(
                "config.json",
                f"architectures {architectures} has no *ForSequenceClassification head",
                "save the fine-tuned AutoModelForSequenceClassification (save_pretrained), not the base model",
            )
        id2label = config.get("id2label") or {}
        try:
            labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
        except (TypeError, ValueError):
            raise FolderError(
                "config.json", "id2label keys must be 0..n-1", "save the model with save_pretrained"
            ) from None
        if not labels or [int(key) for key in sorted(id2label, key=int)] != list(range(len(labels))):
            raise FolderError("config.json", "id2label must map 0..n-1 to label names", "set id2label before saving")
        # One output without a stated problem_type is a scorer (a cross-encoder): its activation says how it is read.
        problem_type = config.get("problem_type") or (SINGLE_LABEL if len(labels) > 1 else SCORE)
        if problem_type not in (SINGLE_LABEL, MULTI_LABEL, REGRESSION, SCORE):
            raise FolderError(
                "config.json", f"problem_type {problem_type!r} is unknown", "use a transformers problem_type"
            )
        max_tokens, max_positions = token_limit(
            None, files.tokenizer_config, files.max_positions, "tokenizer_config.json", ""
        )
        return TextModelFolder(
            kind=self.name,
            model_type=files.model_type,
            engine="transformers",
            body_class="AutoModelForSequenceClassification",
            body_output="logits",
            transformer_dir="",
            max_tokens=max_tokens,
            max_positions=max_positions,
            lowercase=False,
            output_size=len(labels),
            labels=labels,
            problem_type=problem_type,
            activation=score_activation(folder, config, len(labels), problem_type),
            remote_code=files.remote_code,
        )

    def reference_cases(self, info: TextModelFolder, sentences: list[str]) -> list[Case]:
        """The sentences, and pairs of them: NLI models and cross-encoders are served pairs, and a pair's second
        segment runs through other embeddings."""
        pairs = [Case(sentences[i], sentences[(i + 1) % len(sentences)]) for i in range(0, len(sentences), 3)]
        return [Case(text) for text in sentences] + pairs

    def load_reference(self, folder: Path, info: TextModelFolder) -> Reference:
        return TransformersClassifierReference(folder, info)

    def routes(self) -> tuple[Route, ...]:
        return (*super().routes(), cohere.RERANK_V2, jina.RERANK, tei.RERANK)

    def parse_request(self, api: RequestContext, body: Any, request: RequestView) -> Any:
        """The model's own body: a text, a list, the project's rerank body, or a zero-shot request."""
        body = decoded_body(body, request.content_type)
        if is_zero_shot(body):
            return parse_zero_shot(api, body)
        return parse_classification_request(api, body, request.content_type)

    def answer(self, api: RequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        if isinstance(payload, ZeroShotRequest):
            return format_zero_shot(api, payload, rows)
        if isinstance(payload, RerankRequest):
            return format_rerank(api, payload, rows)
        return format_answer(payload, rows, api.info, api.model_name)

    def similarity(
        self, info: TextModelFolder, expected: torch.Tensor, got: torch.Tensor, mask: torch.Tensor | None = None
    ) -> float:
        difference = (probabilities(expected, info.activation) - probabilities(got, info.activation)).abs()
        if not torch.isfinite(difference).all():
            return 0.0
        return 1.0 - float(difference.max()) if difference.numel() else 1.0

    def check_value(self, info: TextModelFolder, value: Any) -> bool:
        return bool(torch.isfinite(value).all())

    def options_defaults(self) -> dict[str, Any]:
        # A reranking request is one row per document: 64 documents x 256 tokens.
        return {**super().options_defaults(), "max_request_tokens": 16384}

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        return {
            **super().describe(info),
            "labels": list(info.labels),
            "problem_type": info.problem_type,
            "activation": info.activation,
        }


def score_activation(folder: Path, config: dict[str, Any], labels: int, problem_type: str) -> str:
    """softmax over labels for a single-label classifier, a sigmoid per label for multi-label, and for a one-output
    model (a cross-encoder reranker) what sentence-transformers' CrossEncoder applies: its saved activation_fn
    (config_sentence_transformers.json), by default a sigmoid; an explicit regression head answers its raw value."""
    if labels > 1:
        return "sigmoid" if problem_type == MULTI_LABEL else "softmax"
    if config.get("problem_type") == REGRESSION:
        return "identity"
    saved = optional_json(folder, "config_sentence_transformers.json").get("activation_fn")
    if saved is None:
        saved = (config.get("sentence_transformers") or {}).get("activation_fn")
    if saved is None or str(saved).endswith("Sigmoid"):
        return "sigmoid"
    if str(saved).endswith("Identity"):
        return "identity"
    raise FolderError(
        "config_sentence_transformers.json",
        f"activation_fn {saved!r} is not supported (Sigmoid or Identity)",
        "save the cross-encoder with the default activation",
    )
