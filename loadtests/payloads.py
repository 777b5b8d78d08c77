"""Request bodies and response checks for each served model: the traffic every load test, baseline and ceiling shares.

The payloads are seeded streams, so two runs (and the side-by-side systems) see the same mix:

- ``classifier``: one random 128-d row per request (standard normal, the scale the model was trained on).
- any other name: an embedding model packaged from a user's folder, sent the minilm mix (``embedding_traffic``); an
  image model (its archive says it is one, scripts/ops/registry.py) the image mix (loadtests/images.py,
  ``image_traffic``).
- ``minilm``: the README mix (scripts/ops/payloads.py ``ReadmeTextMix``): English-like sentences, mostly short with a
  tail of long ones (some longer than the model's 256-token window, which the server must truncate), and a share of
  requests repeating a small set of popular sentences, so that a response cache sees a realistic hit rate instead of
  0 % or 100 %.

A check returns ``None`` for a good response body or a short reason, which the load test reports as a failure.
"""

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadtests import network_traffic as network_payloads
from loadtests.images import ImagePayloads, OpenAIImagePayloads, RawBody, RawImagePayloads
from scripts.ops import registry
from scripts.ops.payloads import MINILM_REPEAT_HEAVY_SHARE, ReadmeTextMix

CLASSIFIER_FEATURES = 128
CLASSIFIER_CLASSES = 10
MINILM_DIMENSIONS = 384


class MinilmPayloads(ReadmeTextMix):
    """Seeded stream of ``{"text": ...}`` bodies of the README mix (scripts/ops/payloads.py ReadmeTextMix); the popular
    set depends only on the base seed (shared by users)."""

    def next(self):
        return {"text": self.next_text()}


class RepeatHeavyMinilmPayloads(MinilmPayloads):
    """The minilm mix with most requests repeating the popular set: where a shared cache pays (docs/cache.md)."""

    repeat_share = MINILM_REPEAT_HEAVY_SHARE


class ClassifierPayloads:
    """Seeded stream of ``{"inputs": [128 floats]}`` bodies."""

    def __init__(self, seed=0, stream=0):
        self.rng = random.Random(f"classifier-{seed}-{stream}")

    def next_row(self):
        return [round(self.rng.gauss(0.0, 1.0), 6) for _ in range(CLASSIFIER_FEATURES)]

    def next(self):
        return {"inputs": self.next_row()}


def _numbers(values, count):
    return (
        isinstance(values, list)
        and len(values) == count
        and all(type(v) in (int, float) and math.isfinite(v) for v in values)
    )


def check_minilm(body) -> str | None:
    """A single-text answer: ``{"embedding": [384 finite floats]}``."""
    if not isinstance(body, dict) or "embedding" not in body:
        return f"expected an object with 'embedding', got {str(body)[:80]!r}"
    if not _numbers(body["embedding"], MINILM_DIMENSIONS):
        size = len(body["embedding"]) if isinstance(body["embedding"], list) else type(body["embedding"]).__name__
        return f"'embedding' must be {MINILM_DIMENSIONS} finite numbers, got {size}"
    return None


def check_classifier(body) -> str | None:
    """A single-row answer: ``{"label": 0..9, "probabilities": [10 numbers summing to 1]}``."""
    if not isinstance(body, dict) or "label" not in body or "probabilities" not in body:
        return f"expected an object with 'label' and 'probabilities', got {str(body)[:80]!r}"
    probabilities = body["probabilities"]
    if not _numbers(probabilities, CLASSIFIER_CLASSES):
        return f"'probabilities' must be {CLASSIFIER_CLASSES} finite numbers"
    if abs(sum(probabilities) - 1.0) > 1e-3:
        return f"'probabilities' sum to {sum(probabilities):.4f}, not 1"
    if type(body["label"]) is not int or not 0 <= body["label"] < CLASSIFIER_CLASSES:
        return f"'label' must be an int in [0, {CLASSIFIER_CLASSES}), got {body['label']!r}"
    return None


class OpenAIEmbeddingPayloads(MinilmPayloads):
    """The minilm mix (same seeds, same texts) as OpenAI-style embedding requests, for servers with that API (the
    Infinity baseline): ``{"model": <served name>, "input": text}``."""

    served_name = "minilm"

    def next(self):
        return {"model": self.served_name, "input": self.next_text()}


def check_openai_embedding(body, check=check_minilm) -> str | None:
    """An OpenAI-style answer to one input: ``{"data": [{"embedding": [384 finite floats]}]}``."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        return f"expected an object with 'data': [one embedding], got {str(body)[:80]!r}"
    return check(data[0])


def check_embedding(body) -> str | None:
    """A single-text answer of any embedding model: ``{"embedding": [finite floats]}``, of the model's width."""
    if not isinstance(body, dict) or not isinstance(body.get("embedding"), list) or not body["embedding"]:
        return f"expected an object with 'embedding', got {str(body)[:80]!r}"
    if not _numbers(body["embedding"], len(body["embedding"])):
        return "'embedding' must be finite numbers"
    return None


def embedding_traffic(model):
    """The README mix for any embedding model served at /predictions/<model> (an archive packaged from a user's
    folder), and with the suffix -openai the same texts in OpenAI's /embeddings shape (the Infinity baseline)."""
    if model.endswith("-openai"):
        served = model.removesuffix("-openai")
        payloads = type(f"OpenAI{served}", (OpenAIEmbeddingPayloads,), {"served_name": served})
        return ModelTraffic(model, "/embeddings", payloads, lambda body: check_openai_embedding(body, check_embedding))
    return ModelTraffic(model, f"/predictions/{model}", MinilmPayloads, check_embedding)


@dataclass(frozen=True)
class ModelTraffic:
    """What a load test needs to know about one model: where to send, what to send, how to judge the answer."""

    name: str
    path: str
    payloads: Callable  # (seed, stream) -> an object with .next() -> JSON body
    check: Callable  # JSON body (or what `decode` made of the answer) -> None or a failure reason
    # (content bytes, headers) -> the answer `check` judges; None: the body parsed as JSON. A network's OIP traffic
    # reads the binary extension with tritonclient's parser (loadtests/network_traffic.py).
    decode: Callable | None = None

    @property
    def served_model(self) -> str:
        """The TorchServe model this traffic is sent to, whose metrics describe the run: the name in its path
        (``/predictions/<model>``, the OIP's ``/v2/models/<model>/infer``), which a traffic name such as
        ``ranking-oip`` or ``minilm-repeats`` is not; another system's path names no model, so the traffic's own."""
        found = _SERVED_MODEL.match(self.path)
        return found.group("model") if found else self.name


# TorchServe's inference routes that name the model (a version may follow it).
_SERVED_MODEL = re.compile(r"^/(?:predictions|v2/models)/(?P<model>[^/]+)")


def answer_of(model_traffic: ModelTraffic, content: bytes, headers) -> Any:
    """The answer in a response, as the traffic's check takes it; raises ValueError for one it cannot read."""
    if model_traffic.decode is None:
        return json.loads(content)
    try:
        return model_traffic.decode(content, headers)
    except ValueError:
        raise
    except Exception as error:  # a decoder's own error type (tritonclient's) is a bad answer, not a crash
        raise ValueError(f"unreadable answer: {type(error).__name__}: {error}") from None


def network_traffic(name: str) -> ModelTraffic | None:
    """The traffic of a network of the network comparison (``<network>-<format>``, loadtests/network_traffic.py)."""
    parsed = network_payloads.parse_name(name)
    if parsed is None:
        return None
    spec, form = parsed

    def payloads(seed=0, stream=0):
        return network_payloads.NetworkPayloads(seed, stream, spec, form)

    path = network_payloads.path_of(spec, form)
    return ModelTraffic(name, path, payloads, network_payloads.shape_check(spec), network_payloads.decode(form))


MODELS = {
    "classifier": ModelTraffic("classifier", "/predictions/classifier", ClassifierPayloads, check_classifier),
    "minilm": ModelTraffic("minilm", "/predictions/minilm", MinilmPayloads, check_minilm),
    "minilm-repeats": ModelTraffic("minilm-repeats", "/predictions/minilm", RepeatHeavyMinilmPayloads, check_minilm),
    # The same minilm traffic in the request and answer shape of OpenAI's /embeddings API (comparison baselines).
    "minilm-openai": ModelTraffic("minilm-openai", "/embeddings", OpenAIEmbeddingPayloads, check_openai_embedding),
}


def check_image_classification(body) -> str | None:
    """Our image classifier's answer to one image: ``[{"label", "score"}, ...]``, best first, scores in [0, 1]."""
    if not isinstance(body, list) or not body:
        return f"expected a list of labels and scores, got {str(body)[:80]!r}"
    for entry in body:
        if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
            return f"expected {{'label', 'score'}} entries, got {str(entry)[:80]!r}"
        score = entry.get("score")
        if type(score) not in (int, float) or not 0.0 <= score <= 1.0:
            return f"'score' must be a number in [0, 1], got {score!r}"
    return None


def check_stock_classification(body) -> str | None:
    """TorchServe's stock image_classifier's answer to one image: ``{label: probability, ...}`` (its top 5)."""
    if not isinstance(body, dict) or not body:
        return f"expected an object of labels to probabilities, got {str(body)[:80]!r}"
    if not all(type(v) in (int, float) and 0.0 <= v <= 1.0 for v in body.values()):
        return "every probability must be a number in [0, 1]"
    return None


# The image traffics' suffixes: the same images in another system's request shape (the comparison's baselines).
STOCK_SUFFIX = "-stock"
OPENAI_SUFFIX = "-openai"


def image_kind(model) -> str | None:
    """The image kind of the model named ``model`` (its spec or model_store archive), or None for any other model."""
    try:
        kind = registry.model(model).kind
    except (ValueError, OSError, KeyError):  # no such archive (a text model's name is still a valid traffic name)
        return None
    return kind if kind in registry.IMAGE_KINDS else None


def image_traffic(model, kind) -> ModelTraffic:
    """The image mix (loadtests/images.py) for an image model of ``kind`` served at /predictions/<model>; with the
    suffix -stock the same images as raw bodies to TorchServe's stock image_classifier (an archive of that name
    beside ours), with -openai as Infinity's OpenAI-style image embeddings."""
    served = model.removesuffix(STOCK_SUFFIX).removesuffix(OPENAI_SUFFIX)
    if model.endswith(OPENAI_SUFFIX):
        payloads = type(f"OpenAIImages{served}", (OpenAIImagePayloads,), {"served_name": served})
        return ModelTraffic(model, "/embeddings", payloads, lambda body: check_openai_embedding(body, check_embedding))
    if model.endswith(STOCK_SUFFIX):
        return ModelTraffic(model, f"/predictions/{model}", RawImagePayloads, check_stock_classification)
    check = check_image_classification if kind == "image-classification" else check_embedding
    return ModelTraffic(model, f"/predictions/{model}", ImagePayloads, check)


def traffic(model):
    """The traffic of a bundled model (MODELS), the image mix for an image model, else the README mix for an
    embedding model of that name."""
    if model in MODELS:
        return MODELS[model]
    found = network_traffic(model)
    if found is not None:
        return found
    if not model or not all(char.isalnum() or char in "-_." for char in model):
        raise ValueError(f"{model!r} is not a model name; the bundled ones are {sorted(MODELS)}")
    kind = image_kind(model.removesuffix(STOCK_SUFFIX).removesuffix(OPENAI_SUFFIX))
    if kind is not None:
        return image_traffic(model, kind)
    return embedding_traffic(model)


def request_parts(body) -> tuple[dict[str, Any], str]:
    """How a body is sent: keyword arguments for an HTTP client's post (``json=`` or raw ``data=``) and its
    Content-Type; one place, so the Locust users, the preflight and the in-process baselines agree."""
    if isinstance(body, RawBody):
        return {"data": body.data}, body.content_type
    return {"json": body}, "application/json"


def request_headers(body) -> dict[str, str]:
    """The headers a body needs besides its Content-Type (an OIP binary body's JSON length)."""
    return dict(body.headers) if isinstance(body, RawBody) else {}


def worker_requests(bodies) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """A batch of bodies as TorchServe hands them to a handler in its worker (a JSON body parsed, an image's bytes as a
    bytearray) and each request's headers: for the baselines that call a handler in process."""
    requests, headers = [], []
    for body in bodies:
        # url_path: TorchServe's header on every POST /predictions/<name> (empty: the model's own route); a network
        # handler reads a request without it as the Open Inference Protocol's /v2/models/<name>/infer.
        if isinstance(body, RawBody):
            requests.append({"body": bytearray(body.data)})
            headers.append({"Content-Type": body.content_type, "url_path": "", **request_headers(body)})
        else:
            requests.append({"body": body})
            headers.append({"Content-Type": "application/json", "url_path": ""})
    return requests, headers
