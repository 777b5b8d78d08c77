"""Whole-server fuzzing: thousands of generated requests per model, sent concurrently to a real TorchServe.

    python -m scripts.reliability.fuzz --model classifier --requests 5000          # own server on free ports
    python -m scripts.reliability.fuzz --model generator --running                 # against `make serve`
    python -m scripts.reliability.fuzz --model minilm --seed 1 --case 17 [--send]  # show (and send) one case
    python -m scripts.reliability.fuzz --archive model_store/my-classifier.mar     # a user's model, as packaged

Requests come from a seeded grammar of valid and invalid bodies (scripts/reliability/fuzz_grammar.py): numeric
extremes, odd content types and encodings, limits and just over them, deep nesting, duplicate keys, wrong types for
every field, sampling parameters at their extremes. A user's archive (--archive, or campaign() with any model name) is
fuzzed with the grammar of its kind, read from the archive (its handler, else model_source.json). They are sent from
many clients at once, so bad and good requests share batches. Every answer is checked:

- strict JSON (NaN/Infinity tokens refused; a streamed answer is NDJSON, each line strict), except TorchServe's own
  413 for a body over max_request_size;
- a valid request gets 200 and the same answer as the in-process reference for that request alone (the archived
  classifier weights; sentence-transformers for MiniLM; the generator's own handler, one request at a time, for
  greedy and seeded requests; for a user's text classifier or reranker its own handler in fp32, probabilities and
  relevance scores within 0.02, labels and order wherever the reference's scores are further apart; for a user's
  image model, whose damaged images may still decode, the shape its kind answers in: ImageOracle);
- an invalid request gets its own 4xx with a JSON ``message``, never a 5xx and never a 200;
- no worker restarts (worker PIDs from the management API before and after).

The suite runs this as its "fuzz" check (`python -m scripts.reliability --only fuzz`); `make test` runs a short
seeded form (tests/integration/test_fuzz_server.py). Failing examples are printed with a command that reproduces
each one. Exit code: 0 all passed, 1 a criterion failed, 2 usage error.
"""

import argparse
import base64
import http.client
import json
import math
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import torch
import yaml

from handlers.core.errors import RequestError
from scripts.ops import registry
from scripts.reliability import corpus
from scripts.reliability.fuzz_grammar import EITHER, ERROR, FLT_MAX, OK, Grammar, Limits

REPO = Path(__file__).resolve().parents[2]
FUZZ_MODELS = tuple(registry.bundled_models())  # the bundled models (`make mar`)
NDJSON = "application/x-ndjson"

# Failure classes, in the order the report lists them; each must be 0 for the check to pass.
CLASSES = {
    "not_strict_json": "answers that are not strict JSON",
    "server_error_on_client_body": "5xx for an invalid or unusual body",
    "good_failed": "valid requests not answered 200",
    "wrong_answer": "200 answers that differ from the reference",
    "bad_accepted": "invalid requests answered 200",
    "error_without_message": "4xx without a JSON message",
    "lost": "requests without an HTTP answer",
}


# ------------------------------------------------------------------------------------------------ strict JSON
def _refuse_constant(token):
    raise ValueError(f"non-standard JSON token {token}")


def strict_json(payload):
    """Parse bytes as strict JSON (UTF-8, no NaN/Infinity); raises ValueError."""
    return json.loads(payload.decode("utf-8"), parse_constant=_refuse_constant)


def strict_ndjson(payload):
    """Each non-empty line strict JSON; returns the list of values."""
    lines = [line for line in payload.decode("utf-8").split("\n") if line.strip()]
    if not lines:
        raise ValueError("empty stream")
    return [json.loads(line, parse_constant=_refuse_constant) for line in lines]


def media_type(content_type):
    return (content_type or "").split(";")[0].strip().lower()


def charset(content_type):
    for part in (content_type or "").split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def meant_text(case):
    """The body as text the way its sender meant it (BOM, then the charset parameter, then UTF-8); None if none."""
    body = case.body
    try:
        if body.startswith((b"\xff\xfe", b"\xfe\xff")):
            return body.decode("utf-16")
        if body.startswith(b"\xef\xbb\xbf"):
            return body.decode("utf-8-sig")
        return body.decode(charset(case.content_type) or "utf-8")
    except (UnicodeDecodeError, LookupError):
        return None


def meant_json(case):
    text = meant_text(case)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


# ------------------------------------------------------------------------------------------------ oracles
def handler_limits(archive, max_request_size):
    """The archive's handler: section with the handler's defaults filled in (as the worker validates it)."""
    from scripts.reliability.cost import served_handler_config

    options = registry.archive_model(archive).handler_class.options
    with zipfile.ZipFile(archive) as mar:
        config = yaml.safe_load(mar.read("model-config.yaml")) or {}
        return Limits(max_request_size=max_request_size, handler=served_handler_config(mar, config, options))


class ClassifierOracle:
    """The archived weights in fp32, one request alone: what its answer must be, or that it must be refused."""

    def __init__(self, archive, max_request_size):
        from scripts.reliability.references import load_classifier

        self.model = load_classifier(archive)
        self.model64 = load_classifier(archive).double()  # how far from float32 overflow an input takes the model
        self.limits = handler_limits(archive, max_request_size)
        self.limits.features = self.model.layers[0].in_features
        self.expected = {}

    def exact(self, values):
        """float64 logits, the largest pre-activation or logit (overflows float32 if > FLT_MAX), and the largest
        sum of absolute terms (no partial sum of any order can exceed it)."""
        first, second = self.model64.layers[0], self.model64.layers[2]
        before = first(values)
        mass = values.abs() @ first.weight.abs().T + first.bias.abs()
        hidden = self.model64.layers[1](before)
        logits = second(hidden)
        mass = max(mass.max().item(), (hidden.abs() @ second.weight.abs().T + second.bias.abs()).max().item())
        return logits, max(before.abs().max().item(), logits.abs().max().item()), mass

    def rows(self, case):
        body = meant_json(case)
        inputs = body.get("inputs") if isinstance(body, dict) and set(body) == {"inputs"} else None
        if not isinstance(inputs, list) or not inputs:
            return None, None
        single = not isinstance(inputs[0], list)
        rows = [inputs] if single else inputs
        if any(not isinstance(r, list) or len(r) != self.limits.features for r in rows):
            return None, None
        if any(type(v) not in (int, float) for r in rows for v in r):
            return None, None
        return rows, single

    def prepare(self, cases):
        for case in cases:
            if case.expect == ERROR:
                continue
            rows, single = self.rows(case)
            if rows is None:
                continue
            if any(abs(v) > 1e39 for r in rows for v in r):  # huge ints too: float32 cannot hold them
                case.expect = ERROR
                continue
            values = torch.tensor(rows, dtype=torch.float64)
            as_float32 = values.float()
            if not torch.isfinite(as_float32).all():  # NaN/inf or beyond float32 after rounding
                case.expect = ERROR
                continue
            with torch.inference_mode():
                served = torch.softmax(self.model(as_float32), dim=-1)
                logits, peak, mass = self.exact(values)
            if peak > FLT_MAX * 1.001:
                case.expect = ERROR  # the input overflows inside the model: a 4xx naming it, never NaN
                continue
            if mass > FLT_MAX / 10 or not torch.isfinite(served).all():
                # A partial sum may pass float32's range: batched and single sums may land on either side of it.
                case.expect = EITHER
            # The exact answer (float64); fp32 serving is within 1e-4 of it wherever it does not overflow.
            self.expected[case.index] = (torch.softmax(logits, dim=-1).float(), single)

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no valid request could be read from this body, yet it was answered 200"
        probabilities, single = self.expected[case.index]
        answers = [answer] if single else answer
        if not isinstance(answers, list) or len(answers) != len(probabilities):
            return f"expected {len(probabilities)} row answer(s), got {str(answer)[:120]}"
        for row, (got, want) in enumerate(zip(answers, probabilities, strict=True)):
            try:
                values = torch.tensor(got["probabilities"], dtype=torch.float32)
                label = got["label"]
            except (TypeError, KeyError, ValueError):
                return f"row {row}: not a {{label, probabilities}} object: {str(got)[:120]}"
            if values.shape != want.shape or not torch.allclose(values, want, atol=1e-4):
                return f"row {row}: probabilities differ from the reference by {(values - want).abs().max():.2e}"
            if label != int(want.argmax()) and want.max() - want.sort().values[-2] > 1e-4:
                return f"row {row}: label {label}, reference {int(want.argmax())}"
        return None


class MiniLMOracle:
    """sentence-transformers' encode() of each text (fp32), token counts from its tokenizer, the request limits."""

    def __init__(self, archive, max_request_size):
        from sentence_transformers import SentenceTransformer

        from scripts.reliability.model_files import minilm_reference_dir

        self.limits = handler_limits(archive, max_request_size)
        self.model = SentenceTransformer(str(minilm_reference_dir()), device="cpu")
        self.max_tokens = self.model.max_seq_length
        self.expected = {}  # case index -> (shape, texts)
        self.tokens, self.vectors = {}, {}

    def request(self, case):
        """(shape, texts, truncate) of a body as the API defines it, or None if it cannot be one."""
        if case.path:
            return self.route_request(case)
        if media_type(case.content_type).startswith("text/"):
            text = meant_text(case)
            return ("text", [text], True) if text is not None else None
        body = meant_json(case)
        if not isinstance(body, dict):
            return None
        truncate = body.get("truncate", True)
        if "text" in body and isinstance(body["text"], str):
            return "text", [body["text"]], truncate
        inputs = body.get("input")
        if isinstance(inputs, str):
            return "openai", [inputs], truncate
        if isinstance(inputs, list) and inputs and all(isinstance(t, str) for t in inputs):
            return "openai", inputs, truncate
        return None

    @staticmethod
    def route_request(case):
        """(shape, texts, truncate) of a body sent to another API's route (OpenAI, Cohere, TEI, /tokenize)."""
        body = meant_json(case)
        if not isinstance(body, dict):
            return None
        shapes = {"v1/embeddings": ("openai", "input"), "v2/embed": ("cohere", "texts"), "embed": ("tei", "inputs")}
        shape, field = shapes.get(case.path, ("tokenize", "inputs"))
        texts = body.get(field)
        texts = [texts] if isinstance(texts, str) and shape != "cohere" else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
            return None
        truncate = {"cohere": body.get("truncate") != "NONE", "tei": body.get("truncate", False)}.get(
            shape, body.get("truncate", True)
        )
        return shape, texts, truncate

    def route_limit(self, case):
        """Cohere's max_tokens where it is below the model's limit (each text is cut to that many tokens before its
        special tokens are added), else None."""
        body = meant_json(case) if case.path == "v2/embed" else None
        wanted = body.get("max_tokens") if isinstance(body, dict) else None
        return wanted if type(wanted) is int and 0 < wanted < self.max_tokens else None

    def refused_for_length(self, case, counts, truncate):
        """(whether a text is over its limit with truncation off, the request's tokens after truncation)."""
        cut = self.route_limit(case)
        if cut is not None:  # the text is cut to `cut` tokens (special tokens not counted), then its 2 are added
            words = [count - 2 for count in counts]
            return (not truncate and max(words) > cut), sum(min(w, cut) + 2 for w in words)
        return (not truncate and max(counts) > self.max_tokens), sum(min(c, self.max_tokens) for c in counts)

    def token_count(self, text):
        if text not in self.tokens:
            self.tokens[text] = len(self.model.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"])
        return self.tokens[text]

    def prepare(self, cases):
        limits = self.limits.handler
        for case in cases:
            if case.expect == ERROR:
                continue
            request = self.request(case)
            if request is None:
                continue
            shape, texts, truncate = request
            if any(len(text) > limits.get("max_text_chars", float("inf")) for text in texts) or sum(
                map(len, texts)
            ) > limits.get("max_request_chars", float("inf")):
                case.expect = ERROR
                continue
            counts = [self.token_count(text) for text in texts]
            too_long, tokens = self.refused_for_length(case, counts, truncate)
            if any(not text.strip() for text in texts) or (
                shape != "tokenize" and (too_long or tokens > limits.get("max_request_tokens", float("inf")))
            ):
                case.expect = ERROR
                continue
            self.expected[case.index] = (shape, texts)
        wanted = sorted({text for _, texts in self.expected.values() for text in texts} - set(self.vectors))
        if wanted:
            vectors = self.model.encode(wanted, batch_size=32, convert_to_tensor=True, normalize_embeddings=True)
            self.vectors.update(zip(wanted, vectors.cpu(), strict=True))

    def check_row(self, got, text, where):
        try:
            vector = torch.tensor(got["embedding"], dtype=torch.float32)
        except (TypeError, KeyError, ValueError):
            return f"{where}: no embedding in {str(got)[:120]}"
        want = self.vectors[text]
        if vector.shape != want.shape:
            return f"{where}: embedding has shape {tuple(vector.shape)}, expected {tuple(want.shape)}"
        cosine = torch.nn.functional.cosine_similarity(vector, want, dim=0).item()
        if not cosine >= 0.999:
            return f"{where}: cosine {cosine:.4f} to the reference"
        if got.get("truncated") is not (self.token_count(text) > self.max_tokens):
            return f"{where}: truncated={got.get('truncated')!r} for a text of {self.token_count(text)} tokens"
        return None

    def vector_problem(self, vector, text, where):
        try:
            got = torch.tensor(vector, dtype=torch.float32)
        except (TypeError, ValueError):
            return f"{where}: not a vector: {str(vector)[:120]}"
        want = self.vectors[text]
        if got.shape != want.shape or not torch.nn.functional.cosine_similarity(got, want, dim=0).item() >= 0.999:
            return f"{where}: not the reference vector of its text"
        return None

    def encoded_problem(self, rows, kind, texts, where, compare=True):
        """Rows of one embedding type (OpenAI's encoding_format, Cohere's embedding_types) for ``texts``."""
        if not isinstance(rows, list) or len(rows) != len(texts):
            return f"{where}: {len(texts)} rows expected, got {str(rows)[:120]}"
        dimension = self.model.get_embedding_dimension()
        for index, (row, text) in enumerate(zip(rows, texts, strict=True)):
            if kind == "base64":
                try:
                    row = np.frombuffer(base64.b64decode(row, validate=True), dtype="<f4").tolist()
                except (TypeError, ValueError):
                    return f"{where}[{index}]: not base64 float32 bytes"
            if kind in ("float", "base64"):
                problem = self.vector_problem(row, text, f"{where}[{index}]") if compare else None
            else:
                low, high, size = {"int8": (-128, 127, dimension), "uint8": (0, 255, dimension)}.get(
                    kind, (-128, 127, (dimension + 7) // 8) if kind == "binary" else (0, 255, (dimension + 7) // 8)
                )
                valid = isinstance(row, list) and len(row) == size
                valid = valid and all(type(v) is int and low <= v <= high for v in row)
                problem = None if valid else f"{where}[{index}]: not {size} {kind} values: {str(row)[:120]}"
            if problem:
                return problem
        return None

    def route_problem(self, case, shape, texts, answer):
        body = meant_json(case)
        if shape == "tokenize":
            special = body.get("add_special_tokens", True) if isinstance(body, dict) else True
            for index, (tokens, text) in enumerate(zip(answer, texts, strict=True)):
                want = self.model.tokenizer(text, add_special_tokens=special, truncation=False)["input_ids"]
                if not isinstance(tokens, list) or [t.get("id") for t in tokens] != want:
                    return f"tokens of text {index} differ from the tokenizer's"
            return None if len(answer) == len(texts) else f"{len(texts)} token lists expected"
        if shape == "tei":
            return self.encoded_problem(answer, "float", texts, "answer")
        if shape == "cohere":
            if not isinstance(answer, dict) or answer.get("texts") != texts:
                return f"a Cohere answer echoing the texts expected, got {str(answer)[:120]}"
            full = self.route_limit(case) is None  # a shorter max_tokens answers another vector
            for kind in dict.fromkeys(body.get("embedding_types") or ["float"]):
                problem = self.encoded_problem(answer["embeddings"].get(kind), kind, texts, kind, full)
                if problem:
                    return problem
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        rows = [row.get("embedding") for row in data] if isinstance(data, list) else None
        return self.encoded_problem(rows, body.get("encoding_format", "float"), texts, "data")

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no valid request could be read from this body, yet it was answered 200"
        shape, texts = self.expected[case.index]
        if case.path:
            return self.route_problem(case, shape, texts, answer)
        if not isinstance(answer, dict):
            return f"answer is not an object: {str(answer)[:120]}"
        if shape == "text":
            return self.check_row(answer, texts[0], "embedding")
        data = answer.get("data")
        if answer.get("object") != "list" or not isinstance(data, list) or len(data) != len(texts):
            return f"expected an OpenAI list of {len(texts)} embeddings, got {str(answer)[:120]}"
        for index, (row, text) in enumerate(zip(data, texts, strict=True)):
            if not isinstance(row, dict) or row.get("index") != index:
                return f"data[{index}] has index {row.get('index') if isinstance(row, dict) else row!r}"
            problem = self.check_row(row, text, f"data[{index}]")
            if problem:
                return problem
        tokens = sum(min(self.token_count(text), self.max_tokens) for text in texts)
        if (answer.get("usage") or {}).get("prompt_tokens") != tokens:
            return f"usage {answer.get('usage')} but the texts have {tokens} tokens"
        return None


def without_logprobs(value):
    """Choices compared without their logprobs (a batched step adds in another order: the last bits may differ)."""
    if isinstance(value, list):
        return [{k: v for k, v in c.items() if k != "logprobs"} if isinstance(c, dict) else c for c in value]
    return value


class GeneratorShapes:
    """What every generator answer must look like, whatever its text: one choice (or n), each with its text, a
    finish reason, a token count within the limit and, when asked, one logprobs entry per token."""

    limits: Limits

    def shape_problem(self, body, answer):
        if not isinstance(answer, dict):
            return f"no answer object in {str(answer)[:160]}"
        n = body.get("n", 1)
        choices = answer.get("choices") if n > 1 else [answer]
        if not isinstance(choices, list) or len(choices) != n:
            return f"{n} choices asked, got {str(answer)[:160]}"
        limit = body.get("max_new_tokens", self.limits.handler["default_max_new_tokens"])
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
                return f"no text in {str(choice)[:160]}"
            count = choice.get("completion_tokens")
            if not (isinstance(count, int) and 1 <= count <= limit) or choice.get("finish_reason") not in (
                "length",
                "stop",
            ):
                return f"malformed answer: {str(choice)[:160]}"
            if "logprobs" in body and len(choice.get("logprobs") or []) != count:
                return f"logprobs asked: one per token expected in {str(choice)[:160]}"
        if body.get("temperature", 0) != 0 and not isinstance(answer.get("seed"), int):
            return f"a sampled answer without its seed: {str(answer)[:160]}"
        return None

    def chat_problem(self, body, answer):
        """A chat answer (the tools productions): each choice a message whose tool calls name a tool of the request
        and whose arguments validate against its parameters, whatever the weights wrote."""
        import jsonschema

        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != body.get("n", 1):
            return f"no chat choices in {str(answer)[:160]}"
        tools = {tool["function"]["name"]: tool["function"].get("parameters") for tool in body.get("tools", [])}
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict) or choice.get("finish_reason") not in ("stop", "length", "tool_calls"):
                return f"malformed chat choice: {str(choice)[:160]}"
            calls = message.get("tool_calls") or []
            if (choice["finish_reason"] == "tool_calls") != bool(calls) and choice["finish_reason"] != "length":
                return f"finish_reason {choice['finish_reason']!r} with {len(calls)} tool calls"
            if calls and body.get("tool_choice") == "none":
                return f"tool calls answered to tool_choice none: {str(calls)[:160]}"
            for call in calls:
                name = call.get("function", {}).get("name")
                if name not in tools:
                    return f"a call of {name!r}, which is not in the request's tools"
                try:
                    jsonschema.validate(json.loads(call["function"]["arguments"]), tools[name] or {})
                except (ValueError, jsonschema.ValidationError) as error:
                    return f"the arguments of a {name} call do not follow its parameters: {str(error)[:160]}"
        return None


class GeneratorOracle(GeneratorShapes):
    """The generator's own handler in-process, one request at a time: deterministic requests (greedy, or seeded)
    must get exactly its answer from the batched server; the others get shape checks."""

    def __init__(self, archive, max_request_size):
        from scripts.bench_embeddings import unpack
        from scripts.ops.handler_loader import load_handler

        self.model_dir = unpack(archive, Path(tempfile.mkdtemp(prefix="fuzz-generator-")))
        self.handler, self.context = load_handler(self.model_dir, "generator")
        handler_limits_ = self.handler.loaded.limits
        self.limits = handler_limits(archive, max_request_size)
        self.limits.vocab_size = handler_limits_.vocab_size
        self.limits.max_prompt_chars = handler_limits_.max_prompt_chars
        self.limits.repeat_piece = self.repeat_piece()
        self.references = {}  # canonical request -> (status, answer)
        self.expected = {}  # case index -> canonical request, or None (sampling without a seed: shape checks)
        self.requests = {}

    def repeat_piece(self):
        """A piece that encodes to exactly n tokens when repeated n times (to build prompts at the token limit)."""
        n = self.limits.handler["max_prompt_tokens"]
        for piece in (" a", "a", " the", "x", " x", "."):
            if (
                len(self.handler.loaded.tokenizer.encode(piece * n)) == n
                and len(self.handler.loaded.tokenizer.encode(piece * (n + 1))) == n + 1
            ):
                return piece
        raise RuntimeError("no single-token piece found to build prompts at the token limit")

    def alone(self, body):
        """(status, answer) of one request alone through the handler, in-process."""
        from scripts.ops.handler_loader import set_requests

        set_requests(self.context, [{"Content-Type": "application/json"}])
        [response] = self.handler.handle([{"body": body}], self.context)
        status = self.context.get_response_status(0)[0] or 200
        return status, json.loads(response)

    def prepare(self, cases):
        for case in cases:
            if case.expect == ERROR:
                continue
            body = meant_json(case)
            if not isinstance(body, dict):
                continue
            self.requests[case.index] = body
            if case.path:  # a chat request (tools): its answer's shape and calls are checked, not its text
                self.expected[case.index] = None
                continue
            sampling = body.get("temperature", 0) != 0
            if sampling and "seed" not in body:
                self.expected[case.index] = None
                continue
            key = json.dumps({k: v for k, v in body.items() if k != "stream"}, sort_keys=True)
            if key not in self.references:
                self.references[key] = self.alone({k: v for k, v in body.items() if k != "stream"})
            status, _ = self.references[key]
            if 400 <= status < 500:
                case.expect = ERROR  # the handler refuses it alone; batched, it must be refused too
            self.expected[case.index] = key

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no valid request could be read from this body, yet it was answered 200"
        body = self.requests[case.index]
        if case.path:
            return self.chat_problem(body, answer)
        problem = self.shape_problem(body, answer)
        if problem:
            return problem
        key = self.expected[case.index]
        if key is None:  # unseeded sampling: only the shape can be checked
            return None
        status, want = self.references[key]
        if status != 200:
            return f"answered 200, but the request alone in-process gets {status} {str(want)[:120]}"
        for field_name in ("text", "finish_reason", "prompt_tokens", "completion_tokens", "seed", "choices"):
            if without_logprobs(answer.get(field_name)) != without_logprobs(want.get(field_name)):
                return (
                    f"{field_name} {str(answer.get(field_name))[:60]!r} differs from the request alone: "
                    f"{str(want.get(field_name))[:60]!r}"
                )
        return None


TOLERANCE = 0.02  # served precision may be bf16 (some CPUs), the in-process reference is fp32


def ranking_problem(order, reference, complete):
    """What is wrong with ``order`` (keys of ``reference``, best first) as a ranking by the reference's scores, where
    scores within TOLERANCE may come in either order; ``complete``: no key left out may beat a kept one by more."""
    if not all(isinstance(key, (str, int)) and key in reference for key in order) or len(set(order)) != len(order):
        return f"{order!r} are not distinct entries of {sorted(reference)}"
    for place, better in enumerate(order):
        for worse in order[place + 1 :]:
            if reference[worse] - reference[better] > TOLERANCE:
                return (
                    f"{worse!r} ranked below {better!r}; the request alone scores them "
                    f"{reference[worse]:.4f} and {reference[better]:.4f}"
                )
    if complete and order:
        floor = min(reference[key] for key in order)
        beaten = [key for key in reference if key not in order and reference[key] - floor > TOLERANCE]
        if beaten:
            return (
                f"{beaten[0]!r} left out, though the request alone scores it {reference[beaten[0]]:.4f} > {floor:.4f}"
            )
    return None


def close(value, want):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value - want) <= TOLERANCE


class TextClassifierOracle:
    """A user's text classifier, NLI model or reranker: its own handler in-process (fp32, eager), one request alone.
    Limits it can measure (characters; tokens with the model's own tokenizer) turn valid-looking requests into ones
    that must be refused; a 200 must match the request alone: probabilities and relevance scores within TOLERANCE,
    labels and order exactly wherever the reference's scores are further apart than that, everything else exactly."""

    def __init__(self, archive, max_request_size):
        from scripts.bench_embeddings import unpack
        from scripts.ops.handler_loader import load_handler

        self.name = Path(archive).stem
        self.model_dir = unpack(Path(archive), Path(tempfile.mkdtemp(prefix="fuzz-text-classifier-")))
        # Loaded under the archive's own name: answers that name the model (Jina's and Cohere's "model") must match.
        self.handler, self.context = load_handler(self.model_dir, self.name, {"precision": "fp32", "backend": "eager"})
        loaded = self.handler.loaded
        self.limits = handler_limits(archive, max_request_size)
        self.limits.labels, self.limits.max_tokens = len(loaded.info.labels), loaded.max_tokens
        # canonical request -> (status, answer, shape, every row's probabilities by label, the documents sent)
        self.references = {}
        self.expected = {}  # case index -> canonical request

    @staticmethod
    def request(case):
        """(content type, body) as the sender meant them: a text (text/*) or a JSON object; None if neither."""
        if media_type(case.content_type).startswith("text/"):
            text = meant_text(case)
            return None if text is None else ("text/plain", text)
        body = meant_json(case)
        return ("application/json", body) if isinstance(body, dict) else None

    @staticmethod
    def rows(body):
        """(rows, truncate) of a request of a shape the API defines, each row a text or a (text, pair); else None."""
        if isinstance(body, str):
            return [body], True
        if "query" in body:
            documents = body.get("documents")
            rows = [(body["query"], d) for d in documents] if isinstance(documents, list) else None
        elif "inputs" in body:
            inputs = body["inputs"]
            items = [inputs] if isinstance(inputs, str) else inputs if isinstance(inputs, list) else []
            rows = [tuple(item) if isinstance(item, list) else item for item in items]
        elif "text" in body:
            pair = body.get("text_pair")
            rows = [body["text"] if pair is None else (body["text"], pair)]
        else:
            rows = None
        if not rows or any(isinstance(row, tuple) and len(row) != 2 for row in rows):
            return None
        if not all(isinstance(text, str) for row in rows for text in (row if isinstance(row, tuple) else (row,))):
            return None
        return rows, body.get("truncate", True)

    def over_limits(self, rows, truncate):
        """Whether a request of these rows is over a limit: characters per text and per request (a pair counts both
        texts), tokens after truncation (the model's tokenizer), a text too long when truncate is false."""
        limits = self.limits.handler
        texts = [text for row in rows for text in (row if isinstance(row, tuple) else (row,))]
        if any(len(text) > limits["max_text_chars"] for text in texts):
            return True
        if sum(map(len, texts)) > limits["max_request_chars"]:
            return True
        try:
            tokenized = self.handler.engine.tokenize(rows)
        except Exception:  # text the tokenizer cannot take: the handler alone decides
            return False
        if truncate is False and any(row.truncated for row in tokenized):
            return True
        return sum(len(row.ids) for row in tokenized) > limits["max_request_tokens"]

    def call(self, content_type, body, path=""):
        from scripts.ops.handler_loader import set_requests

        set_requests(self.context, [{"Content-Type": content_type, "url_path": path}])
        [response] = self.handler.handle([{"body": body}], self.context)
        return self.context.get_response_status(0)[0] or 200, json.loads(response)

    def alone(self, content_type, body):
        """The request alone in-process: its status and answer, its shape, and every label's probability per row
        (scored by the handler's text engine, so that labels and rankings can be compared)."""
        status, answer = self.call(content_type, body)
        shape = "single" if isinstance(body, str) or "text" in body else "list" if "inputs" in body else "rerank"
        documents = body.get("documents") if shape == "rerank" else None
        if status != 200:
            return status, answer, shape, None, documents
        rows, _ = self.rows(body)
        scored = self.handler.engine.score(rows)  # the handler's own engine, each row alone
        if any(isinstance(row, RequestError) for row in scored):
            return status, answer, shape, None, documents
        labels = self.handler.loaded.info.labels
        probabilities = [dict(zip(labels, row.value.tolist(), strict=True)) for row in scored]
        return status, answer, shape, probabilities, documents

    def prepare(self, cases):
        for case in cases:
            if case.expect == ERROR:
                continue
            request = self.request(case)
            if request is None:
                continue
            if case.path or is_zero_shot(request[1]):  # another API's shape: the same request alone, compared whole
                key = json.dumps([case.path, request], sort_keys=True)
                if key not in self.references:
                    self.references[key] = ("route", *self.call(*request, path=case.path))
                if self.references[key][1] != 200:
                    case.expect = ERROR
                else:
                    self.expected[case.index] = key
                continue
            rows = self.rows(request[1])
            if rows is not None and self.over_limits(*rows):
                case.expect = ERROR
                continue
            key = json.dumps(request, sort_keys=True)
            if key not in self.references:
                self.references[key] = self.alone(*request)
            self.expected[case.index] = key

    def row_problem(self, got, want, probabilities, where):
        """One row's answer against the request alone's (``want``) and every label's reference probability."""
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{where}: expected the fields {sorted(want)}, got {str(got)[:160]}"
        label = got["label"]
        if not isinstance(label, str) or label not in probabilities:
            return f"{where}: label {label!r} is not one of {sorted(probabilities)}"
        if probabilities[label] < max(probabilities.values()) - TOLERANCE:
            return f"{where}: label {label!r}, the request alone {want['label']!r} ({probabilities})"
        if not close(got["score"], probabilities[label]):
            return f"{where}: score {got['score']!r} for {label!r}, the request alone {probabilities[label]:.4f}"
        problem = None
        if "scores" in want:
            problem = scores_problem(got["scores"], len(want["scores"]), probabilities)
        if "labels" in want and not problem:
            problem = labels_problem(got["labels"], probabilities)
        return f"{where}: {problem}" if problem else None

    def results_problem(self, answer, want, shape, probabilities, documents):
        """An 'inputs' or reranking answer: its fields, model and usage, then each result."""
        if not isinstance(answer, dict) or set(answer) != set(want):
            return f"expected the fields {sorted(want)}, got {str(answer)[:160]}"
        if answer["model"] != self.name or answer["usage"] != want["usage"]:
            return f"model {answer['model']!r}, usage {answer['usage']}; the request alone: {want['usage']}"
        results = answer["results"]
        if not isinstance(results, list) or len(results) != len(want["results"]):
            return f"{len(want['results'])} results expected, got {str(results)[:160]}"
        if shape == "rerank":
            relevance = [row[next(iter(row))] for row in probabilities]
            return rerank_problem(results, set(want["results"][0]), relevance, documents)
        for index, (got, expected, row) in enumerate(zip(results, want["results"], probabilities, strict=True)):
            problem = self.row_problem(got, expected, row, f"results[{index}]")
            if problem:
                return problem
        return None

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no valid request could be read from this body, yet it was answered 200"
        reference = self.references[self.expected[case.index]]
        if reference[0] == "route":
            return same_answer(answer, reference[2])
        status, want, shape, probabilities, documents = reference
        if status != 200:
            return f"answered 200, but the request alone in-process gets {status} {str(want)[:120]}"
        if probabilities is None:
            return "the in-process reference could not score every row of this request"
        if shape == "single":
            return self.row_problem(answer, want, probabilities[0], "answer")
        return self.results_problem(answer, want, shape, probabilities, documents)


class TextModelOracle:
    """A user's embedding, sparse or multi-vector model: its own handler in-process (fp32, eager), one request alone.
    Limits it can measure (characters; tokens with the model's own tokenizer) turn valid-looking requests into ones
    that must be refused; a 200 must be the request alone's answer: the same fields, flags, counts and token usage,
    and numbers within what a reduced precision moves (a vector's or a weight row's cosine, each token vector's)."""

    COSINE = 0.99  # bf16 and compiled backends stay far above it on the gate's reference rows

    def __init__(self, archive, max_request_size, kind):
        from scripts.bench_embeddings import unpack
        from scripts.ops.handler_loader import load_handler

        self.name = Path(archive).stem
        self.kind = kind
        self.model_dir = unpack(Path(archive), Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-")))
        self.handler, self.context = load_handler(
            self.model_dir, self.name, {"precision": "fp32", "backend": "eager", "cache_size": 0}
        )
        loaded = self.handler.loaded
        self.limits = handler_limits(archive, max_request_size)
        self.limits.max_tokens = loaded.max_tokens
        self.limits.prompts = tuple(loaded.info.prompts)
        self.references = {}  # canonical request -> (status, answer)
        self.expected = {}  # case index -> canonical request

    def over_limits(self, body):
        """Whether a readable request is over a character limit (counted as sent; a prompt adds to each text)."""
        if isinstance(body, str):
            texts = [body]
        else:
            items = body.get("text", body.get("input"))
            texts = [items] if isinstance(items, str) else items if isinstance(items, list) else []
        texts = [text for text in texts if isinstance(text, str)]
        limits = self.limits.handler
        return (
            any(len(t) > limits["max_text_chars"] for t in texts) or sum(map(len, texts)) > limits["max_request_chars"]
        )

    def call(self, content_type, body):
        from scripts.ops.handler_loader import set_requests

        set_requests(self.context, [{"Content-Type": content_type}])
        [response] = self.handler.handle([{"body": body}], self.context)
        return self.context.get_response_status(0)[0] or 200, json.loads(response)

    def prepare(self, cases):
        for case in cases:
            if case.expect == ERROR:
                continue
            request = TextClassifierOracle.request(case)
            if request is None:
                continue
            if self.over_limits(request[1]):
                case.expect = ERROR
                continue
            key = json.dumps(request, sort_keys=True)
            if key not in self.references:
                self.references[key] = self.call(*request)
            if self.references[key][0] != 200:  # refused alone (a token limit it measured, a bad option): refused
                case.expect = ERROR
                continue
            self.expected[case.index] = key

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no valid request could be read from this body, yet it was answered 200"
        status, want = self.references[self.expected[case.index]]
        if status != 200:
            return f"answered 200, but the request alone in-process gets {status} {str(want)[:120]}"
        return same_answer(answer, want, "answer", self.COSINE)


def as_numbers(value):
    """A JSON value that is numbers a reduced precision moves, as {position: number}: a vector (a list of numbers
    with a float), a sparse row (a list of {"index", "value"}), a decoded sparse row (a dict of floats); else None."""
    if isinstance(value, list) and value and all(type(v) in (int, float) for v in value):
        return dict(enumerate(value)) if any(type(v) is float for v in value) else None
    if isinstance(value, list) and value and all(isinstance(v, dict) and set(v) == {"index", "value"} for v in value):
        return {entry["index"]: entry["value"] for entry in value}
    if isinstance(value, dict) and value and all(type(v) is float for v in value.values()):
        return value
    return None


def vector_problem(got, want, where, cosine):
    """Two {position: number} maps (a vector, or a sparse row's listed entries) as vectors over their union."""
    if not isinstance(got, dict) or not all(type(v) in (int, float) and math.isfinite(v) for v in got.values()):
        return f"{where}: not finite numbers: {str(got)[:120]}"
    if len(got) != len(want):
        return f"{where}: {len(got)} numbers, the request alone {len(want)}"
    keys = sorted(set(got) | set(want), key=str)
    a = torch.tensor([float(got.get(k, 0.0)) for k in keys])
    b = torch.tensor([float(want.get(k, 0.0)) for k in keys])
    similarity = (
        float(torch.nn.functional.cosine_similarity(a, b, dim=0)) if a.norm() and b.norm() else float(torch.equal(a, b))
    )
    return None if similarity >= cosine else f"{where}: cosine {similarity:.4f} to the request alone"


def same_answer(got, want, where="answer", cosine=None):
    """Why ``got`` is not the request alone's answer ``want``, or None: the same fields and values. With ``cosine``,
    numbers a reduced precision moves (a vector, a sparse row, token vectors) are compared as vectors by cosine;
    otherwise a float within TOLERANCE. Ranked entries (by "index", or zero-shot's labels) are compared by what they
    rank, since a near tie may order them either way; a response "id" is the answer's own."""
    if cosine is not None:
        numbers = as_numbers(want)
        if numbers is not None:
            found = as_numbers(got) if isinstance(got, type(want)) else None
            return vector_problem(found, numbers, where, cosine)
    if isinstance(want, dict):
        return same_object(got, want, where, cosine)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where}: {len(want)} entries expected, got {str(got)[:160]}"
        if want and all(isinstance(item, dict) and "index" in item for item in want + got):
            got, want = (sorted(items, key=lambda item: item["index"]) for items in (got, want))
        problems = (same_answer(a, b, f"{where}[{i}]", cosine) for i, (a, b) in enumerate(zip(got, want, strict=True)))
        return next((problem for problem in problems if problem), None)
    if isinstance(want, float):
        return None if close(got, want) else f"{where}: {got!r}, the request alone {want!r}"
    return None if got == want else f"{where}: {str(got)[:80]!r}, the request alone {str(want)[:80]!r}"


def same_object(got, want, where, cosine=None):
    if not isinstance(got, dict) or set(got) != set(want):
        return f"{where}: expected the fields {sorted(want)}, got {str(got)[:160]}"
    if set(want) == {"sequence", "labels", "scores"}:  # zero-shot: compared as label -> score
        if sorted(got["labels"]) != sorted(want["labels"]) or got["sequence"] != want["sequence"]:
            return f"{where}: labels {got['labels']!r}, the request alone {want['labels']!r}"
        got, want = ({"scores": dict(zip(x["labels"], x["scores"], strict=True))} for x in (got, want))
    problems = (same_answer(got[key], want[key], f"{where}.{key}", cosine) for key in want if key != "id")
    return next((problem for problem in problems if problem), None)


def is_zero_shot(body):
    return isinstance(body, dict) and ("candidate_labels" in body or "parameters" in body)


def scores_problem(scores, count, probabilities):
    """A row's "scores" (top_k labels, best first) against every label's reference probability."""
    if not isinstance(scores, list) or len(scores) != count:
        return f"{count} scores expected, got {str(scores)[:160]}"
    if not all(isinstance(s, dict) and set(s) == {"label", "score"} for s in scores):
        return f"scores are not {{label, score}} objects: {str(scores)[:160]}"
    problem = ranking_problem([s["label"] for s in scores], probabilities, complete=True)
    if problem:
        return f"scores: {problem}"
    for s in scores:
        if not close(s["score"], probabilities[s["label"]]):
            return f"{s['label']!r} scored {s['score']!r}, the request alone {probabilities[s['label']]:.4f}"
    return None


def labels_problem(labels, probabilities):
    """A multi-label row's "labels": every label whose sigmoid is at least 0.5, best first (within TOLERANCE)."""
    if not isinstance(labels, list):
        return f"labels {labels!r}"
    problem = ranking_problem(labels, probabilities, complete=False)
    if problem:
        return f"labels: {problem}"
    for name, p in probabilities.items():
        if (p >= 0.5 + TOLERANCE and name not in labels) or (p < 0.5 - TOLERANCE and name in labels):
            return f"labels {labels}, but the request alone gives {name!r} {p:.4f}"
    return None


def rerank_problem(results, keys, relevance, documents):
    """Reranking results (best first, top_n of them) against every document's reference relevance."""
    if not all(isinstance(r, dict) and set(r) == keys for r in results):
        return f"results are not {sorted(keys)} objects: {str(results)[:160]}"
    order = [r["index"] for r in results]
    if not all(type(index) is int for index in order):
        return f"indexes {order!r}"
    problem = ranking_problem(order, dict(enumerate(relevance)), complete=True)
    if problem:
        return f"ranking: {problem}"
    for r in results:
        index = r["index"]
        if not close(r["relevance_score"], relevance[index]):
            return f"document {index}: relevance {r['relevance_score']!r}, the request alone {relevance[index]:.4f}"
        if "document" in keys and r["document"] != {"text": documents[index]}:
            return f"document {index}: {str(r['document'])[:120]} is not the document sent"
    return None


class ImageOracle:
    """A user's image model (scripts/ops/registry.py IMAGE_KINDS): what a 200 must look like, from what packaging
    recorded in the archive (model_source.json: a classifier's labels and activation, an image-text model's dimension
    and whether its vectors are unit length) and the images the body carries. A damaged image may still decode (a
    flipped pixel byte), so it is not compared with a reference: whatever is answered 200 must have this shape, one
    answer per image sent, in the order sent.

    - image-classification: per image a list of {label, score}, best first, ``top_k`` of them (default 5, at most the
      number of labels), each label one of the model's, probabilities in [0, 1] (a softmax's summing to at most 1);
    - image-text: one image (a raw body, ``{"image"}``) {"embedding": vector}, ``{"images"}`` {"image_embeddings":
      [vector, ...]}; each vector finite numbers of the model's dimension (unit length where the model normalizes)."""

    DEFAULT_TOP_K = 5  # handlers/image/kinds/classification.py

    def __init__(self, archive, max_request_size, kind):
        self.kind = kind
        self.limits = handler_limits(archive, max_request_size)
        with zipfile.ZipFile(archive) as mar:
            self.source = json.loads(mar.read("model_source.json"))
        self.expected = {}  # case index -> (images sent, single, top_k)

    @staticmethod
    def carried(case):
        """(images, single, top_k) a body carries as its sender meant it, or None where no image can be read."""
        kind = media_type(case.content_type)
        if kind.startswith("image/") or kind == "application/octet-stream":
            return (1, True, None) if case.body else None
        body = meant_json(case)
        if not isinstance(body, dict):
            return None
        top_k = body.get("top_k")
        if "image" in body:
            return 1, True, top_k
        images = body.get("images")
        return (len(images), False, top_k) if isinstance(images, list) and images else None

    def prepare(self, cases):
        for case in cases:
            if case.expect == ERROR:
                continue
            carried = self.carried(case)
            if carried is not None:
                self.expected[case.index] = carried

    def check(self, case, answer):
        if case.index not in self.expected:
            return "no image could be read from this body, yet it was answered 200"
        count, single, top_k = self.expected[case.index]
        if self.kind == "image-text":
            field = "embedding" if single else "image_embeddings"
            if not isinstance(answer, dict) or set(answer) != {field}:
                return f"expected {{{field!r}}}, got {str(answer)[:160]}"
            answers = [answer[field]] if single else answer[field]
        else:
            answers = [answer] if single else answer
        if not isinstance(answers, list) or len(answers) != count:
            return f"{count} image(s) sent, {len(answers) if isinstance(answers, list) else 'no list of'} answered"
        problems = (self.image_problem(one, top_k) for one in answers)
        return next((f"image {index}: {p}" for index, p in enumerate(problems) if p), None)

    def image_problem(self, value, top_k):
        if self.kind == "image-text":
            return self.vector_problem(value)
        labels = self.source["labels"]
        want = min(top_k if type(top_k) is int and top_k > 0 else self.DEFAULT_TOP_K, len(labels))
        if not isinstance(value, list) or len(value) != want:
            return f"{want} {{label, score}} expected, got {str(value)[:160]}"
        if not all(isinstance(s, dict) and set(s) == {"label", "score"} for s in value):
            return f"not {{label, score}} objects: {str(value)[:160]}"
        named = [s["label"] for s in value]
        if len(set(named)) != len(named) or not set(named) <= set(labels):
            return f"labels {named} are not distinct labels of the model ({labels})"
        scores = [s["score"] for s in value]
        if not all(type(x) in (int, float) and math.isfinite(x) for x in scores):
            return f"scores {scores} are not finite numbers"
        bounded = self.source.get("activation") in ("softmax", "sigmoid")  # a regression head's are not probabilities
        if bounded and not all(0.0 <= x <= 1.0 for x in scores):
            return f"scores {scores} are not in [0, 1]"
        if scores != sorted(scores, reverse=True):
            return f"scores {scores} are not best first"
        if self.source.get("activation") == "softmax" and sum(scores) > 1.0 + 1e-4:
            return f"softmax scores {scores} sum to {sum(scores):.6f} > 1"
        return None

    def vector_problem(self, vector):
        dimension = self.source["dimension"]
        if not isinstance(vector, list) or len(vector) != dimension:
            return f"a vector of {dimension} numbers expected, got {str(vector)[:120]}"
        if not all(type(v) in (int, float) and math.isfinite(v) for v in vector):
            return f"not finite numbers: {str(vector)[:120]}"
        norm = math.sqrt(sum(v * v for v in vector))
        if self.source.get("normalized") and abs(norm - 1.0) > 1e-2:  # bf16 moves a unit vector's length ~1e-3
            return f"length {norm:.4f}, but the model's vectors are unit length"
        return None


# Per oracle (scripts/ops/registry.py Model.oracle: a kind's own, or one a spec names): what checks the answers.
ORACLES = {
    "mlp": ClassifierOracle,
    "minilm": MiniLMOracle,
    "generator": GeneratorOracle,
    "classification": TextClassifierOracle,
    "embedding": lambda archive, size: TextModelOracle(archive, size, "embedding"),
    "sparse": lambda archive, size: TextModelOracle(archive, size, "sparse"),
    "multi-vector": lambda archive, size: TextModelOracle(archive, size, "multi-vector"),
    "image-classification": lambda archive, size: ImageOracle(archive, size, "image-classification"),
    "image-text": lambda archive, size: ImageOracle(archive, size, "image-text"),
}


def archive_kind(archive):
    """Which grammar and oracle fuzz an archive (a key of ORACLES), learnt from the archive itself, not its name
    (scripts/ops/registry.py archive_model)."""
    try:
        oracle = registry.archive_model(archive).oracle
    except ValueError as error:
        raise ValueError(f"{error}; the fuzzer covers {', '.join(ORACLES)}") from None
    if oracle not in ORACLES:
        raise ValueError(f"{archive}: no fuzz grammar for oracle {oracle!r}; the fuzzer covers {', '.join(ORACLES)}")
    return oracle


# ------------------------------------------------------------------------------------------------ sending
@dataclass
class Answer:
    status: int  # 0: no HTTP answer
    content_type: str
    body: bytes
    seconds: float
    error: str = ""


def sender(url, headers, timeout):
    """post(case) -> Answer, with one keep-alive connection per thread."""
    parts = urlsplit(url)
    local = threading.local()

    def post(case):
        sent_headers = dict(headers)
        if case.content_type is not None:
            sent_headers["Content-Type"] = case.content_type
        started = time.perf_counter()
        for attempt in (1, 2):
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
            try:
                try:
                    path = parts.path + (f"/1.0/{case.path}" if case.path else "")
                    connection.request("POST", path, body=case.body, headers=sent_headers)
                except OSError:
                    if not case.oversize:
                        raise
                    # TorchServe may answer 413 and close before an over-size body is fully sent: read that answer.
                response = connection.getresponse()
                payload = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    local.connection = None
                return Answer(
                    response.status, response.getheader("Content-Type", ""), payload, time.perf_counter() - started
                )
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                local.connection = None
                # A keep-alive connection the server closed between requests fails at once: retry on a fresh one.
                if attempt == 2 or isinstance(error, TimeoutError):
                    return Answer(0, "", b"", time.perf_counter() - started, f"{type(error).__name__}: {error}")
        raise AssertionError("unreachable")

    return post


# ------------------------------------------------------------------------------------------------ judging
def judge_oversize(answer):
    """A body over max_request_size must get TorchServe's own 413 (its body is not ours to check)."""
    if answer.status == 413:
        return None
    if answer.status >= 500:
        name = "server_error_on_client_body"
    else:
        name = "bad_accepted" if answer.status == 200 else "error_without_message"
    return name, f"a body over max_request_size got {answer.status}, not TorchServe's 413"


def judge_refusal(case, answer, values):
    """A non-200 answer: a failure for a good case, a 5xx for any client body, an error needs a message."""
    if answer.status >= 500:
        name = "good_failed" if case.expect == OK else "server_error_on_client_body"
        return name, f"{answer.status} {answer.body[:200]!r}"
    if case.expect == OK:
        return "good_failed", f"{answer.status} {answer.body[:200]!r}"
    message = corpus.error_message(values[-1])  # this project's, OpenAI's, Cohere's or TEI's error shape
    if not (isinstance(message, str) and message.strip()):
        return "error_without_message", f"{answer.status} {answer.body[:200]!r}"
    return None


def joined_stream(values):
    """Streamed pieces then the final line -> one answer as the non-streamed form gives it, or None if malformed.

    With n > 1 each piece names its choice (``index``) and the final line holds every choice's rest (``choices``);
    with logprobs each line carries those of its tokens."""
    if (
        not all(isinstance(v, dict) for v in values)
        or values[-1].get("done") is not True
        or any(v.get("done") for v in values[:-1])
        or not all(isinstance(v.get("text"), str) for v in values[:-1])
    ):
        return None
    final = {key: value for key, value in values[-1].items() if key != "done"}
    if not isinstance(final.get("choices"), list):
        if not isinstance(final.get("text"), str):
            return None
        pieces = [*values[:-1], final]
        result = {**final, "text": "".join(v["text"] for v in pieces)}
        if "logprobs" in final:
            result["logprobs"] = [entry for v in pieces for entry in v.get("logprobs") or []]
        return result
    choices = final["choices"]
    if not all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in choices):
        return None
    joined = [{**c, "text": "", **({"logprobs": []} if "logprobs" in c else {})} for c in choices]
    for v in [*values[:-1], *({**c, "index": i} for i, c in enumerate(choices))]:
        index = v.get("index")
        if not isinstance(index, int) or not 0 <= index < len(choices):
            return None
        joined[index]["text"] += v["text"]
        if "logprobs" in joined[index]:
            joined[index]["logprobs"] += v.get("logprobs") or []
    return {**final, "choices": joined}


def judge(case, answer, oracle):
    """The failure class of one answer (a key of CLASSES) and why, or None when it is what the case requires."""
    if answer.status == 0:
        return "lost", answer.error
    if case.oversize:
        return judge_oversize(answer)
    streamed = media_type(answer.content_type) == NDJSON
    try:
        values = strict_ndjson(answer.body) if streamed else [strict_json(answer.body)]
    except (ValueError, UnicodeDecodeError) as error:
        return "not_strict_json", f"{answer.status} {error}: {answer.body[:200]!r}"
    if answer.status != 200:
        return judge_refusal(case, answer, values)
    if case.expect == ERROR:
        return "bad_accepted", f"200 {answer.body[:200]!r}"
    result = joined_stream(values) if streamed else values[0]
    if result is None:
        return "wrong_answer", f"malformed stream: {answer.body[:200]!r}"
    problem = oracle.check(case, result)
    return ("wrong_answer", problem) if problem else None


def evaluate(cases, answers, oracle, url):
    """Counts per failure class, a few reproducible examples of each, and what the campaign sent."""
    counts = Counter({name: 0 for name in CLASSES})
    examples = defaultdict(list)
    productions = defaultdict(Counter)
    for case, answer in zip(cases, answers, strict=True):
        productions[case.production][f"{case.expect}:{answer.status}"] += 1
        verdict = judge(case, answer, oracle)
        if verdict is None:
            continue
        name, why = verdict
        counts[name] += 1
        per_production = sum(1 for e in examples[name] if e["production"] == case.production)
        if len(examples[name]) < 12 and per_production < 3:
            examples[name].append(
                {
                    "case": case.index,
                    "production": case.production,
                    "expect": case.expect,
                    "status": answer.status,
                    "why": str(why)[:400],
                    "content_type": case.content_type,
                    "body": case.preview(),
                    "reproduce": case.reproducer(url),
                }
            )
    return counts, dict(examples), {name: dict(c) for name, c in sorted(productions.items())}


# ------------------------------------------------------------------------------------------------ campaign
def grammar_and_oracle(model, store, seed, max_request_size):
    """The grammar and the oracle for ``store/<model>.mar``, of the kind the archive says it is."""
    archive = Path(store) / f"{model}.mar"
    kind = archive_kind(archive)
    oracle = ORACLES[kind](archive, max_request_size)
    # A bundled model's cases are reproduced with --model, a user's with --archive.
    bundled = registry.archive_model(archive, model).bundled
    return Grammar(model, oracle.limits, seed, kind=kind, archive=None if bundled else str(archive)), oracle


def campaign(server, model, store, requests=5000, seed=0, clients=24, log=print):
    """Fuzz one model (``store/<model>.mar``, any kind archive_kind knows, or a network: the tensor grammar's
    campaign) on a running server; returns a scripts.reliability.rows.Row."""
    from scripts.reliability.rows import Row

    if registry.archive_model(Path(store) / f"{model}.mar", model).oracle == NETWORK_ORACLE:
        return archive_network_campaign(server, model, store, requests, seed, clients, log)
    started = time.perf_counter()
    max_request_size = int(server.props.get("max_request_size", 6553500))
    grammar, oracle = grammar_and_oracle(model, store, seed, max_request_size)
    cases = grammar.cases(requests)
    oracle.prepare(cases)
    prepared = time.perf_counter()
    url = f"{server.inference_url}/predictions/{model}"
    client = server.management()
    pids_before = client.worker_pids(model)
    post = sender(url, server.headers("inference"), timeout=180)
    with ThreadPoolExecutor(max_workers=clients) as pool:
        answers = list(pool.map(post, cases))
    sent = time.perf_counter()
    workers = client.description(model)["workers"]
    pids_after = sorted(worker["pid"] for worker in workers)
    restarts = len(set(pids_before) - set(pids_after))
    counts, examples, productions = evaluate(cases, answers, oracle, url)
    expected = Counter(case.expect for case in cases)
    statuses = Counter(answer.status for answer in answers)
    passed = not any(counts.values()) and restarts == 0 and all(w.get("status") == "READY" for w in workers)
    figure = (
        f"{len(cases)} requests ({expected[OK]} valid, {expected[ERROR]} invalid, {expected[EITHER]} either); "
        + ", ".join(f"{counts[name]} {label}" for name, label in CLASSES.items())
        + f"; worker restarts {restarts}"
    )
    details = {
        "model": model,
        "seed": seed,
        "requests": len(cases),
        "clients": clients,
        "counts": dict(counts),
        "worker_restarts": restarts,
        "pids_before": pids_before,
        "pids_after": pids_after,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "expected": dict(expected),
        "productions": productions,
        "examples": examples,
        "slowest_s": round(max(a.seconds for a in answers), 2) if answers else None,
        "prepare_s": round(prepared - started, 1),
        "send_s": round(sent - prepared, 1),
    }
    for name, items in examples.items():
        for item in items:
            log(
                f"  [{name}] case {item['case']} ({item['production']}, expected {item['expect']}): "
                f"{item['status']} {item['why'][:200]}\n      body: {item['body'][:160]}\n"
                f"      reproduce: {item['reproduce']}"
            )
    return Row(
        f"{model}: fuzz {len(cases)} generated requests ({clients} clients, seed {seed})",
        figure,
        "0 non-strict JSON (TorchServe's 413 excepted), 0 5xx from client bodies, 0 valid requests failed or "
        "wrong, 0 invalid accepted, every 4xx with a message, 0 worker restarts",
        passed,
        details,
    )


# ------------------------------------------------------------------------------------------------ networks
# A served network (handlers/network/) is fuzzed with the tensor grammar (scripts/reliability/tensor_grammar.py): its
# requests carry headers of their own (the binary extension's), each invalid one has an exact status and the input it
# must name, and each valid one's reference is the network engine's answer to it alone, computed here in process.
NETWORK_ORACLE = "network"  # the registry's network kind: fuzzed by network_campaign, not by a grammar of ORACLES
NETWORK_CLASSES = {
    "lost": "requests without an HTTP answer",
    "server_error": "5xx answers",
    "wrong_refusal": "invalid requests not refused with their status naming the input",
    "good_failed": "valid requests not answered 200 (or 422 for an output JSON cannot carry)",
    "wrong_answer": "200 answers that differ from the request alone in process",
}


def post_tensor_case(session, url, case, headers=None, timeout=60):
    """One case's exact bytes and headers as curl --data-binary sends them: (status, headers, body); status 0 and
    the error's text as the body when no HTTP answer came."""
    import requests

    try:
        response = session.post(url, data=case.body, headers={**(headers or {}), **case.headers}, timeout=timeout)
    except requests.RequestException as error:
        return 0, {}, f"{type(error).__name__}: {error}".encode()
    return response.status_code, dict(response.headers), response.content


def network_verdict(case, status):
    """The failure class (a key of NETWORK_CLASSES) of an answer the judge found wrong."""
    if status == 0:
        return "lost"
    if status >= 500:
        return "server_error"
    if case.expect == ERROR:
        return "wrong_refusal"
    return "wrong_answer" if status == 200 else "good_failed"


def network_campaign(
    url,
    program,
    signature,
    options=None,
    requests=2000,
    seed=0,
    clients=8,
    headers=None,
    model="network",
    log=print,
    management=None,
):
    """Fuzz a served network at ``url`` (its inference route) with ``requests`` tensor-grammar cases from ``clients``
    threads; ``program`` and ``signature`` (handlers/network/program.load_program of what the archive packs) and
    ``options`` (the served handler: section, :func:`network_reference`) give the in-process reference. With
    ``management`` (scripts/ops/management.py's client of the same server) the model's worker PIDs are read before
    and after: a worker that died and restarted during the campaign fails it. Returns a scripts.reliability.rows.Row."""
    import requests as http

    from handlers.network.engine import NETWORK_OPTIONS, NetworkEngine
    from scripts.reliability.rows import Row
    from scripts.reliability.tensor_grammar import TensorGrammar, judge, reference

    engine = NetworkEngine(program, signature, {k: v for k, v in (options or {}).items() if k in NETWORK_OPTIONS})
    grammar = TensorGrammar(signature, seed, engine.max_rows_per_request, model)
    cases = grammar.cases(requests)
    expected = [reference(engine, case) for case in cases]
    local = threading.local()

    def send(case):
        if getattr(local, "session", None) is None:
            local.session = http.Session()
        return post_tensor_case(local.session, url, case, headers)

    pids_before = management.worker_pids(model) if management is not None else []
    with ThreadPoolExecutor(max_workers=clients) as pool:
        answers = list(pool.map(send, cases))
    pids_after = management.worker_pids(model) if management is not None else []
    restarts = len(set(pids_before) - set(pids_after))
    counts, examples = Counter({name: 0 for name in NETWORK_CLASSES}), defaultdict(list)
    for case, want, (status, got_headers, body) in zip(cases, expected, answers, strict=True):
        problem = "no answer" if status == 0 else judge(case, status, got_headers, body, want, rtol=1e-4, atol=1e-5)
        if problem is None:
            continue
        name = network_verdict(case, status)
        counts[name] += 1
        if len(examples[name]) < 5:
            examples[name].append({"case": case.index, "production": case.production, "status": status, "why": problem})
            log(
                f"  [{name}] case {case.index} ({case.production}): {problem[:300]}\n      {case.reproducer(url)[:400]}"
            )
    kinds = Counter(case.expect for case in cases)
    return Row(
        f"{model}: fuzz {len(cases)} tensor requests ({clients} clients, seed {seed})",
        f"{len(cases)} requests ({kinds[OK]} valid, {kinds[ERROR]} invalid, {kinds[EITHER]} either); "
        + ", ".join(f"{counts[name]} {label}" for name, label in NETWORK_CLASSES.items())
        + (f"; worker restarts {restarts}" if management is not None else ""),
        "every invalid request refused with its status naming its input, every valid one answered as alone, no 5xx"
        + (", 0 worker restarts" if management is not None else ""),
        not any(counts.values()) and restarts == 0,
        {
            "counts": dict(counts),
            "examples": dict(examples),
            "statuses": dict(Counter(str(a[0]) for a in answers)),
            "worker_restarts": restarts,
            "pids_before": pids_before,
            "pids_after": pids_after,
        },
    )


def network_reference(archive, max_request_size=6553500):
    """(the program's module, its signature, the served handler: section) of a network archive, read as its worker
    reads them: the archive's files extracted and loaded (handlers/network/program.py), the handler section of its
    model-config.yaml with the handler's defaults filled in."""
    from handlers.network.program import load_program

    with tempfile.TemporaryDirectory(prefix="fuzz-network-") as folder:
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder)
        loaded = load_program(folder)
    return loaded.program.module(), loaded.signature, handler_limits(archive, max_request_size).handler


def archive_network_campaign(server, model, store, requests=2000, seed=0, clients=8, log=print):
    """network_campaign against ``store/<model>.mar`` served by ``server`` (scripts/ops/server.py), at the route
    /predictions/<model>, with the server's inference headers and its management client for the PID check."""
    archive = Path(store) / f"{model}.mar"
    program, signature, options = network_reference(archive, int(server.props.get("max_request_size", 6553500)))
    url = f"{server.inference_url}/predictions/{model}"
    return network_campaign(
        url,
        program,
        signature,
        options,
        requests,
        seed,
        clients,
        server.headers("inference"),
        model,
        log,
        management=server.management(),
    )


# ------------------------------------------------------------------------------------------------ CLI
def show_case(model, store, seed, index, server, send):
    max_request_size = int(server.props.get("max_request_size", 6553500)) if server else 6553500
    grammar, oracle = grammar_and_oracle(model, store, seed, max_request_size)
    case = grammar.case(index)
    oracle.prepare([case])
    url = f"{server.inference_url if server else 'http://127.0.0.1:8080'}/predictions/{model}"
    print(
        f"case {index} of {model} (seed {seed}): {case.production}, expected {case.expect}, "
        f"content type {case.content_type!r}, {len(case.body)} bytes\nbody: {case.preview(2000)}\n"
        f"reproduce: {case.reproducer(url)}"
    )
    if not send:
        return 0
    answer = sender(url, server.headers("inference"), timeout=180)(case)
    print(f"answer: {answer.status} {answer.content_type} {answer.body[:2000]!r} {answer.error}")
    verdict = judge(case, answer, oracle)
    print("verdict: as required" if verdict is None else f"verdict: {verdict[0]}: {verdict[1]}")
    return 0 if verdict is None else 1


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.reliability.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", action="append", choices=FUZZ_MODELS, help="model to fuzz (repeatable; default all three)"
    )
    parser.add_argument(
        "--archive",
        type=Path,
        help="fuzz a user's model instead: its .mar (e.g. model_store/my-classifier.mar, served under its file name; "
        "the grammar is chosen by the archive's handler)",
    )
    parser.add_argument("--requests", type=int, default=5000, help="requests per model (5000)")
    parser.add_argument("--seed", type=int, default=0, help="grammar seed: same seed, same requests (0)")
    parser.add_argument("--clients", type=int, default=24, help="concurrent clients (24)")
    parser.add_argument(
        "--running",
        action="store_true",
        help="use the server `make serve` started (TS_PROFILE_CONFIG or config.properties; its "
        "tokens from .run/key_file.json) instead of starting one on free ports",
    )
    parser.add_argument("--case", type=int, help="only show case N (its body, expectation and a reproducer)")
    parser.add_argument("--send", action="store_true", help="with --case: send it and judge the answer")
    parser.add_argument("--out", type=Path, help="write the result rows as JSON here")
    args = parser.parse_args(argv)
    if args.send and args.case is None:
        parser.error("--send needs --case")
    if args.archive and (args.model or not args.archive.is_file()):
        parser.error("--archive needs an existing .mar, and no --model")
    if args.requests < 1 or args.clients < 1:
        parser.error("--requests and --clients must be at least 1")
    return args


def run_campaigns(server, models, store, args):
    """One campaign per model against `server`, each printed as it ends."""
    rows = []
    for model in models:
        row = campaign(server, model, store, args.requests, args.seed, args.clients)
        print(f"[{'pass' if row.passed else 'FAIL'}] {row.check}: {row.figure}", flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    args = parse_arguments(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from scripts import package
    from scripts.ops.server import dev_server, java_home, start_isolated
    from scripts.reliability.rows import write_rows

    if args.archive:  # a user's model, as built: served from the archive's own folder
        store, models = args.archive.resolve().parent, [args.archive.stem]
    else:
        store, models = REPO / "model_store", args.model or list(FUZZ_MODELS)
        for model in models:
            package.build(model, store, log=lambda *_: None)
    server, own = None, False
    if args.running or args.send:
        server = dev_server(os.environ.get("TS_PROFILE_CONFIG") or REPO / "config.properties")
        if not server.running():
            print("error: no `make serve` server is running (start it, or drop --running)", file=sys.stderr)
            return 2
    if args.case is not None:
        return show_case(models[0], store, args.seed, args.case, server, args.send)
    if server is None:
        workdir = Path(tempfile.mkdtemp(prefix="fuzz-"))
        print(f"starting TorchServe with {', '.join(models)} ...", flush=True)
        server = start_isolated(REPO / "config.properties", workdir, store, java_home(), models)
        own = True
    try:
        rows = run_campaigns(server, models, store, args)
    finally:
        if own:
            server.stop()
    if args.out:
        write_rows(args.out, rows)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    from scripts.ops.server import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
