"""Zero-shot classification with any NLI classifier, as transformers' ``zero-shot-classification`` pipeline does it.

Accepted at the model's own URL (a classification model whose labels include an entailment label):

- ``{"inputs": "..." | ["...", ...], "parameters": {"candidate_labels": [...] | "a, b", "hypothesis_template": str?,
  "multi_label": bool?}}`` (the Hugging Face Inference API's body), or the same options at the top level beside
  ``inputs`` (or ``sequences``, the pipeline's argument name);
- each text is paired with ``hypothesis_template`` (default ``"This example is {}."``) filled with each label: the
  pairs are rows of the one text-model path (batched and cached with every other request's rows);
- answered as the pipeline answers: per text ``{"sequence", "labels", "scores"}``, labels best first; one object for
  one text, a list for a list. ``multi_label`` false (and more than one label): a softmax of the entailment logits
  over the labels; true (or a single label): per label, a softmax over its contradiction and entailment logits.

The template must hold ``{}`` (the place of the label) and no other braces: it is filled by replacing ``{}``, never
by ``str.format`` with the client's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.errors import RequestError, shown, too_large
from handlers.core.http import Float32
from handlers.text.requests.common import (
    RequestContext,
    check_bool,
    check_fields,
    check_request_chars,
    check_text,
    text_list,
    truncate_flag,
)
from handlers.text.rows import Row, RowOptions

DEFAULT_TEMPLATE = "This example is {}."
OPTIONS = {"candidate_labels", "hypothesis_template", "multi_label"}
MAX_LABEL_CHARS = 200


@dataclass
class ZeroShotRequest:
    texts: list[Row]  # (sequence, hypothesis) for every sequence, then every label
    names: list[str]
    truncate: bool
    sequences: list[str]
    labels: list[str]
    multi_label: bool
    single: bool  # one text sent (answered as one object)
    options: list[RowOptions] | None = None


def is_zero_shot(body: Any) -> bool:
    return isinstance(body, dict) and ("candidate_labels" in body or "parameters" in body)


def entailment_index(labels: Sequence[str]) -> int:
    """Where the model's entailment logit is: its first label that starts with "entail", as the pipeline looks."""
    for index, label in enumerate(labels):
        if label.lower().startswith("entail"):
            return index
    raise RequestError(
        f"zero-shot classification needs an NLI model, whose labels include 'entailment'; this model's labels are "
        f"{list(labels)[:8]}"
    )


def candidate_labels(value: Any) -> list[str]:
    if isinstance(value, str):  # the pipeline also takes "a, b, c"
        value = [label.strip() for label in value.split(",") if label.strip()]
    if not isinstance(value, list) or not value:
        raise RequestError("'candidate_labels' must be a non-empty list of labels (or one string 'a, b, c')")
    return [check_text(label, f"'candidate_labels'[{i}]", MAX_LABEL_CHARS) for i, label in enumerate(value)]


def hypothesis_template(value: Any) -> str:
    template = check_text(value, "'hypothesis_template'", MAX_LABEL_CHARS)
    rest = template.replace("{}", "", 1)
    if "{}" not in template or "{" in rest or "}" in rest:
        raise RequestError(
            f"'hypothesis_template' {shown(template)} must hold '{{}}' once, where the label goes, and no other braces"
        )
    return template


def parse_zero_shot(api: RequestContext, body: dict[str, Any]) -> ZeroShotRequest:
    entailment_index(api.info.labels)
    if len(api.info.labels) < 2:
        raise RequestError("zero-shot classification needs an NLI model with entailment and contradiction outputs")
    text_field = "sequences" if "sequences" in body else "inputs"
    allowed = {text_field, "truncate", "parameters"} if "parameters" in body else {text_field, "truncate", *OPTIONS}
    check_fields(body, allowed, "zero-shot classification")
    options = body.get("parameters", body)
    if not isinstance(options, dict):
        raise RequestError(f"'parameters' must be an object with {sorted(OPTIONS)}, got {shown(options)}")
    if options is not body:
        check_fields(options, OPTIONS, "'parameters'")
    if text_field not in body:
        raise RequestError(f"missing field '{text_field}' (a text or a list of texts to classify)")
    sequences, _ = text_list(body[text_field], text_field, api.limits)
    if "candidate_labels" not in options:
        raise RequestError("missing field 'candidate_labels'")
    labels = candidate_labels(options["candidate_labels"])
    template = hypothesis_template(options.get("hypothesis_template", DEFAULT_TEMPLATE))
    multi_label = check_bool(options, "multi_label", False)
    pairs = len(sequences) * len(labels)
    if pairs > api.limits.max_inputs:
        raise too_large(
            f"{len(sequences)} text(s) x {len(labels)} labels are {pairs} pairs; at most {api.limits.max_inputs} are "
            f"allowed per request (handler.max_inputs)"
        )
    hypotheses = [template.replace("{}", label, 1) for label in labels]
    pairs_of: list[tuple[str, str]] = [(sequence, hypothesis) for sequence in sequences for hypothesis in hypotheses]
    names = [f"'{text_field}'[{s}] with label {labels[h]!r}" for s in range(len(sequences)) for h in range(len(labels))]
    check_request_chars(sum(len(premise) + len(hypothesis) for premise, hypothesis in pairs_of), api.limits)
    texts: list[Row] = list(pairs_of)
    single = isinstance(body[text_field], str)
    return ZeroShotRequest(texts, names, truncate_flag(body), sequences, labels, multi_label, single)


def format_zero_shot(api: RequestContext, request: ZeroShotRequest, rows: Sequence[Any]) -> Any:
    entailment = entailment_index(api.info.labels)
    contradiction = -1 if entailment == 0 else 0
    logits = torch.stack([row.value.to(torch.float32) for row in rows])
    logits = logits.reshape(len(request.sequences), len(request.labels), -1)
    if request.multi_label or len(request.labels) == 1:
        scores = torch.softmax(logits[..., [contradiction, entailment]], dim=-1)[..., 1]
    else:
        scores = torch.softmax(logits[..., entailment], dim=-1)
    answers = []
    for sequence, row in zip(request.sequences, scores.tolist(), strict=True):
        order = sorted(range(len(row)), key=lambda i: (row[i], i), reverse=True)
        answers.append(
            {
                "sequence": sequence,
                "labels": [request.labels[i] for i in order],
                "scores": [Float32(row[i]) for i in order],
            }
        )
    return answers[0] if request.single else answers
