"""The bad-request corpora kept as data in tests/data/bad_requests/<model>.yaml, turned into HTTP requests."""

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.reliability.image_grammar import corpus_image

CORPUS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "bad_requests"


@dataclass
class BadRequest:
    name: str
    body: bytes
    content_type: str
    status: int
    message: str
    path: str = ""  # after /predictions/<model>/<version>/: a route of the model's other APIs ('' = its own URL)

    def url(self, inference_url, model, version="1.0"):
        return f"{inference_url}/predictions/{model}" + (f"/{version}/{self.path}" if self.path else "")


def error_message(body):
    """The message of an error body in any of the shapes the models answer (handlers/core/errors.py error_body):
    this project's and Cohere's ``message``, OpenAI's ``error.message``, TEI's ``error`` text; None if it has none."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        return error.get("message")
    return body.get("message") if "message" in body else error


def build_body(entry):
    if "body" in entry:
        return entry["body"].encode("utf-8")
    if "body_hex" in entry:
        return bytes.fromhex(entry["body_hex"])
    if "body_parts" in entry:
        parts = entry["body_parts"]
        return "".join(part if isinstance(part, str) else part[0] * part[1] for part in parts).encode("utf-8")
    if "body_image" in entry:  # a generated image, damaged as the entry says (image_grammar.corpus_image)
        return corpus_image(entry["body_image"])
    if "body_rows" in entry:
        spec = entry["body_rows"]
        row = [spec.get("value", 0.0)] * spec["cols"]
        return json.dumps({"inputs": row if spec["rows"] == 0 else [row] * spec["rows"]}).encode("utf-8")
    raise ValueError(f"corpus entry {entry.get('name')!r} has no body")


def load(model):
    path = CORPUS_DIR / f"{model}.yaml"
    entries = yaml.safe_load(path.read_text())
    return [
        BadRequest(
            e["name"],
            build_body(e),
            e.get("content_type", "application/json"),
            int(e["status"]),
            e.get("message", ""),
            e.get("path", ""),
        )
        for e in entries
    ]


def models_with_corpus():
    return sorted(p.stem for p in CORPUS_DIR.glob("*.yaml"))
