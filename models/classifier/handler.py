"""The classifier's own request and answer, as hooks of the network path (handlers/network/hooks.py).

``{"inputs": [128 numbers]}`` -> ``{"label": int, "probabilities": [...]}``, or ``{"inputs": [[128 numbers], ...]}``
-> a list of those objects in row order. The program (``model.pt2``, exported by scripts/train_classifier.py) takes
the rows as ``inputs`` and returns ``logits``; the network engine checks the rows against it, batches them with other
requests' and hands each request its own rows back. Clients of the Open Inference Protocol
(``POST /v2/models/classifier/infer``) get the logits without these hooks.

Each refusal is a :class:`RequestError` naming the value: 400 for a malformed body, 422 for finite inputs that
overflow inside the model (the logits are then inf or NaN, and softmax would answer NaN, which is not JSON). The row
limit (413) is the handler's ``max_rows_per_request``, enforced by the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from handlers.core.errors import RequestError, shown
from handlers.core.http import Float32List, decode_json

ALLOWED_FIELDS = {"inputs"}
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028234663852886e38; anything larger becomes inf
# The row width the program was trained for, recorded by the training script beside this file.
FEATURES = int(json.loads((Path(__file__).with_name("training.json")).read_text())["features"])


def preprocess(request: Any) -> dict[str, torch.Tensor]:
    rows, _ = parse_rows(body_of(request))
    return {"inputs": rows}


def postprocess(outputs: dict[str, torch.Tensor], request: Any) -> Any:
    logits = outputs["logits"].float()
    single = not isinstance(body_of(request)["inputs"][0], list)
    overflowed = [row for row, finite in enumerate(torch.isfinite(logits).all(dim=-1).tolist()) if not finite]
    if overflowed:
        where = "'inputs'" if single else f"'inputs' rows {overflowed[:10]}"
        raise RequestError(
            f"{where} overflow inside the model (activations beyond float32's range); scale the values down",
            code=422,
            error_type="InputOverflow",
        )
    probabilities = torch.softmax(logits, dim=-1)
    labels = probabilities.argmax(dim=-1).tolist()
    # Float32List: each probability printed as the shortest text that reads back as the same float32.
    answers = [
        {"label": label, "probabilities": Float32List(row)}
        for label, row in zip(labels, probabilities.tolist(), strict=True)
    ]
    return answers[0] if single else answers


def body_of(request: Any) -> Any:
    """The body's JSON value; a body that is not JSON is refused naming where it stops being JSON."""
    try:
        return request.json()
    except ValueError:
        return decode_json(request.body)  # raises the precise refusal (empty, not UTF-8, not JSON at line/column)


def parse_rows(body: Any) -> tuple[torch.Tensor, bool]:
    """The body's rows as float32 [rows, FEATURES], and whether it sent one row without the rows dimension."""
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
    for number, row in enumerate(rows):
        check_row(row, "'inputs'" if single else f"'inputs'[{number}]")
    return torch.tensor(rows, dtype=torch.float32), single


def check_row(row: Any, where: str) -> None:
    if not isinstance(row, list):
        raise RequestError(f"{where} must be a list of {FEATURES} numbers")
    if len(row) != FEATURES:
        raise RequestError(f"{where} has {len(row)} values; expected {FEATURES}")
    for position, value in enumerate(row):
        if type(value) not in (int, float):
            raise RequestError(f"{where}[{position}] is {type(value).__name__}, not a number")
        # abs() first: a huge int compares exactly, where isfinite would overflow converting it to float.
        if not abs(value) <= FLOAT32_MAX:
            raise RequestError(
                f"{where}[{position}] is {shown(value)}: values must be finite float32 "
                f"numbers (at most {FLOAT32_MAX:.8g} in magnitude)"
            )
