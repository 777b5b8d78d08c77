"""Classifier requests: what a body may say, validated into float32 rows, batched into one tensor; and each
request's answer from the logits.

Requests: ``{"inputs": [128 numbers]}`` -> ``{"label": int, "probabilities": [...]}``, or
``{"inputs": [[128 numbers], ...]}`` (up to ``handler.max_rows`` rows) -> a list of those objects in row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.errors import RequestError, shown, too_large
from handlers.core.http import Float32List

ALLOWED_FIELDS = {"inputs"}
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028234663852886e38; anything larger becomes inf


@dataclass(frozen=True)
class ClassifierRequest:
    rows: torch.Tensor  # float32 [rows, in_features]
    single: bool  # sent as one row (answered with one object, not a list)


@dataclass(frozen=True)
class ClassifierBatch:
    """What preprocess hands to inference: every accepted request's rows, concatenated in order."""

    inputs: torch.Tensor

    @property
    def rows(self) -> int:
        return len(self.inputs)


def parse_classifier_request(body: Any, in_features: int, max_rows: int) -> ClassifierRequest:
    """Validate one (already JSON-decoded) body into its rows."""
    if not isinstance(body, dict):
        kind = "null" if body is None else type(body).__name__
        raise RequestError(f"body must be a JSON object with an 'inputs' field, got {kind}")
    unknown = sorted(set(body) - ALLOWED_FIELDS)
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; only 'inputs' is accepted")
    if "inputs" not in body:
        raise RequestError("missing field 'inputs'")
    inputs = body["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'inputs' must be a non-empty list of numbers or of rows")
    single = not isinstance(inputs[0], list)
    rows = [inputs] if single else inputs
    if len(rows) > max_rows:
        raise too_large(f"'inputs' has {len(rows)} rows; handler.max_rows is {max_rows}")
    for number, row in enumerate(rows):
        check_row(row, "'inputs'" if single else f"'inputs'[{number}]", in_features)
    return ClassifierRequest(rows=torch.tensor(rows, dtype=torch.float32), single=single)


def check_row(row: Any, where: str, in_features: int) -> None:
    if not isinstance(row, list):
        raise RequestError(f"{where} must be a list of {in_features} numbers")
    if len(row) != in_features:
        raise RequestError(f"{where} has {len(row)} values; expected {in_features}")
    for position, value in enumerate(row):
        if type(value) not in (int, float):
            raise RequestError(f"{where}[{position}] is {type(value).__name__}, not a number")
        # abs() first: a huge int compares exactly, where isfinite would overflow converting it to float.
        if not abs(value) <= FLOAT32_MAX:
            raise RequestError(
                f"{where}[{position}] is {shown(value)}: values must be finite float32 "
                f"numbers (at most {FLOAT32_MAX:.8g} in magnitude)"
            )


def answer_requests(logits: torch.Tensor, requests: list[ClassifierRequest]) -> list[Any]:
    """Each request's rows as label + probabilities; a request whose rows overflow inside the model gets a 422.

    Inputs within float32's range can still overflow in the layers (e.g. 1e38 times a weight above 3.4): such a
    row's logits are inf or NaN, and softmax would turn them into NaN probabilities that are not JSON."""
    finite = torch.isfinite(logits).all(dim=-1).tolist()
    probabilities = torch.softmax(logits, dim=-1)
    labels = probabilities.argmax(dim=-1).tolist()
    probability_rows = [Float32List(row) for row in probabilities.tolist()]  # float32: shortest JSON text
    results: list[Any] = []
    start = 0
    for request in requests:
        rows = range(start, start + len(request.rows))
        start = rows.stop
        overflowed = [row - rows.start for row in rows if not finite[row]]
        if overflowed:
            where = "'inputs'" if request.single else f"'inputs' rows {overflowed[:10]}"
            results.append(
                RequestError(
                    f"{where} overflow inside the model (activations beyond float32's range); scale the values down",
                    code=422,
                    error_type="InputOverflow",
                )
            )
            continue
        answers = [{"label": labels[row], "probabilities": probability_rows[row]} for row in rows]
        results.append(answers[0] if request.single else answers)
    return results
