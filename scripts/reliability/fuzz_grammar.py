"""The whole-server fuzzer's request grammar: seeded, reproducible request bodies per model, valid and invalid.

Every case is drawn from ``random.Random(f"{seed}:{model}:{index}")``, so ``(seed, model, index)`` rebuilds it exactly
(``python -m scripts.reliability.fuzz --model M --seed S --case I``; ``--archive PATH`` instead of ``--model`` for a
user's model). The first cases of a campaign walk every production once, so even a short run covers each kind of body;
the rest are drawn by weight.

A case says what the server must do with it:

- ``OK``: a valid request. It must be answered 200 and its answer must equal the in-process reference
  (the fuzzer's oracle may still turn it into ``ERROR``, e.g. a text over a limit the oracle can measure).
- ``ERROR``: an invalid request. It must get its own 4xx with a strict-JSON body whose ``message`` names the problem
  (``oversize``: over ``max_request_size``, where TorchServe itself answers 413 before any handler sees it).
- ``EITHER``: a request a reasonable server may accept or refuse (e.g. JSON sent as text/plain, a UTF-8 BOM, a
  temperature of 1e-40): a 4xx with a message is fine, and so is a 200 — but then its answer must be right.

Bodies are written by :func:`dumps`, which can place literal text (``NaN``, ``1e400``, a 5000-digit integer) and
duplicate keys where the standard encoder cannot.
"""

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scripts.ops import payloads, registry
from scripts.reliability.image_grammar import ImageProductions

OK, ERROR, EITHER = "ok", "error", "either"
FLT_MAX = 3.4028234663852886e38  # the largest finite float32
JSON = "application/json"


class Raw(str):
    """Literal JSON text placed as is (a number spelled ``1E-45``, ``NaN``, ``1e400``, a huge integer)."""


class Pairs(list):
    """A JSON object as (key, value) pairs: keys may repeat (Python's parser keeps the last one, as TorchServe's)."""


def dumps(value, style=(", ", ": "), ascii_only=True):
    """JSON text for ``value``, honouring :class:`Raw` and :class:`Pairs`; ``style`` = (item, key) separators."""
    item, colon = style

    def write(node):
        if isinstance(node, Raw):
            return str(node)
        if isinstance(node, (Pairs, dict)):
            pairs = node if isinstance(node, Pairs) else node.items()
            return "{" + item.join(json.dumps(k, ensure_ascii=ascii_only) + colon + write(v) for k, v in pairs) + "}"
        if isinstance(node, (list, tuple)):
            return "[" + item.join(write(v) for v in node) + "]"
        return json.dumps(node, ensure_ascii=ascii_only)

    return write(value)


def encode(text):
    """UTF-8 bytes of a body; a lone surrogate in the text becomes its (invalid) 3-byte form instead of failing."""
    return text.encode("utf-8", "surrogatepass")


@dataclass
class Case:
    model: str
    seed: int
    index: int
    production: str
    body: bytes
    content_type: str | None  # None: no Content-Type header at all
    expect: str  # OK, ERROR or EITHER (see the module docstring)
    query: Any = None  # what the oracle needs to check a 200 answer (model-specific)
    oversize: bool = False  # longer than max_request_size: TorchServe's own 413
    archive: str | None = None  # a user's model: its archive, which the reproducer names instead of --model
    path: str = ""  # a route after /predictions/<model>/1.0/ (another API's shape); '' = the model's own URL

    def url(self, model_url):
        return f"{model_url}/1.0/{self.path}" if self.path else model_url

    def reproducer(self, url):
        """A shell command that sends exactly this body (curl for small ones, the fuzzer's CLI for big ones)."""
        header = f" -H 'Content-Type: {self.content_type}'" if self.content_type is not None else ""
        if len(self.body) <= 400:
            data = self.body.hex()
            return (
                f"python3 -c \"import sys; sys.stdout.buffer.write(bytes.fromhex('{data}'))\" | "
                f"curl -s -X POST {self.url(url)}{header} --data-binary @-"
            )
        source = f"--archive {self.archive}" if self.archive else f"--model {self.model}"
        return (
            f"python -m scripts.reliability.fuzz {source} --seed {self.seed} --case {self.index} "
            f"--send   # {len(self.body)} bytes"
        )

    def preview(self, width=160):
        text = self.body[:width].decode("utf-8", "backslashreplace")
        return text + (f"... ({len(self.body)} bytes)" if len(self.body) > width else "")


@dataclass
class Limits:
    """What the served configuration allows, read from the archive's model-config.yaml and the server properties."""

    max_request_size: int
    handler: dict[str, Any] = field(default_factory=dict)  # the handler: section with defaults filled in
    features: int = 128  # classifier
    vocab_size: int = 0  # generator
    max_prompt_chars: int = 0  # generator: longer prompts cannot fit max_prompt_tokens
    repeat_piece: str = " a"  # generator: a piece that is one token however often it repeats
    labels: int = 0  # text-classifier: the model's outputs (1: a reranker)
    max_tokens: int = 0  # text models: the model's token limit (longer texts are truncated to it)
    prompts: tuple[str, ...] = ()  # embedding / sparse: the folder's named prompts


# ------------------------------------------------------------------------------------------------ shared pieces
ODD_TEXTS = [
    "naïve café déjà vu — “quotes” and ‘apostrophes’",
    "日本語のテキストと中文文本",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "עברית ומילים בערבית العربية",
    "combining e\u0301 and zero\u200bwidth joiner\u200d here",
    "tabs\tand\nnewlines\r\nmixed",
    "NUL inside \u0000 a text",
    "\u200b",  # zero-width space only: not whitespace for Python's strip
    "math ∑∫√∞ ≤ ≥ ≠ and arrows → ← ↑",
    "a",
    "x" * 600,
    "1234567890 " * 40,
    "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬…æ",
    "\U0001d573\U0001d58d\U0001d58a \U0001f600",  # astral plane letters
]


def sentence(rng, words=None):
    count = words if words is not None else rng.choice([1, 3, 6, 10, 16, 40, 120, 300])
    return payloads.words(rng, count)


def text_pool(seed, size):
    """Texts the good requests draw from (references are computed once per text)."""
    rng = random.Random(f"{seed}:texts")
    texts = list(ODD_TEXTS)
    while len(texts) < size:
        texts.append(f"{sentence(rng)} {len(texts)}")
    return texts[:size]


def style(rng):
    return rng.choice([(", ", ": "), (",", ":"), (" ,\n\t", " :  "), (",\r\n", ":")])


def json_case(rng, value, content_type=JSON):
    return encode(dumps(value, style(rng), ascii_only=rng.random() < 0.5)), content_type


def wrong_values(rng):
    """A value of some JSON type, for 'wrong type' productions."""
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1.5,
            "",
            "text",
            [],
            [1, 2],
            {},
            {"a": 1},
            Raw("1e400"),
            Raw("NaN"),
            Raw("-Infinity"),
            Raw("1" + "0" * 400),
            [[[]]],
            "\u0000",
        ]
    )


def deep(depth, opener="["):
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return '{"a": ' * depth + "1" + "}" * depth
    return opener * depth + closer * depth


# Generic malformations of a good body, the same for every model: (name, make(rng, good_bytes) -> (body, ct), expect)
def _truncated(rng, good):
    return good[: rng.randrange(1, max(2, len(good)))], JSON


def _garbage_after(rng, good):
    return good + rng.choice([b"}", b"]", b" xyz", b"\x00", b",{}", b'\n{"a":1}']), JSON


def _bytes(rng, _good):
    body = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 64, 1000])))
    content_type = rng.choice([JSON, "application/octet-stream", "text/plain", None])
    if content_type == "text/plain":  # valid UTF-8 sent as text is a valid text for minilm: keep one bad byte
        body = b"\xff" + body
    return body, content_type


GENERIC = [
    ("empty body", lambda rng, good: (b"", rng.choice([JSON, "text/plain", None])), ERROR),
    ("whitespace body", lambda rng, good: (rng.choice([b" ", b"\n\t  \r\n", b" " * 10000]), JSON), ERROR),
    ("truncated json", _truncated, ERROR),
    ("garbage after json", _garbage_after, ERROR),
    ("random bytes", _bytes, ERROR),
    (
        "deep nesting",
        lambda rng, good: (deep(rng.choice([50, 1000, 5000, 100000]), rng.choice("[{")).encode(), JSON),
        ERROR,
    ),
    (
        "top-level scalar",
        lambda rng, good: (
            rng.choice([b"null", b"true", b"0", b"-0.0", b"1e400", b"NaN", b'"text"', b"[]", b"[{}]"]),
            JSON,
        ),
        ERROR,
    ),
    ("overlong utf-8", lambda rng, good: (good.replace(b"{", b'{"\xc0\xaf": 1, ', 1), JSON), ERROR),
    ("utf-8 encoded surrogate", lambda rng, good: (good.replace(b"{", b'{"\xed\xa0\x80": 1, ', 1), JSON), ERROR),
    ("nul byte", lambda rng, good: (good.replace(b"{", b"{\x00", 1), JSON), ERROR),
    (
        "utf-16 with BOM",
        lambda rng, good: (
            good.decode("utf-8").encode(rng.choice(["utf-16", "utf-16-be"])),
            rng.choice([JSON, "application/json; charset=utf-16"]),
        ),
        EITHER,
    ),
    ("utf-8 BOM", lambda rng, good: (b"\xef\xbb\xbf" + good, JSON), EITHER),
    (
        "form content type",
        lambda rng, good: (
            good,
            rng.choice(["application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz"]),
        ),
        ERROR,
    ),
    (
        "other content type",
        lambda rng, good: (
            good,
            rng.choice(
                ["application/octet-stream", None, "application/xml", "image/png", "application/json-patch+json"]
            ),
        ),
        EITHER,
    ),
    (
        "json content type variants",
        lambda rng, good: (
            good,
            rng.choice(
                [
                    "application/json; charset=utf-8",
                    "application/json;charset=UTF-8",
                    "APPLICATION/JSON",
                    "application/json; charset=latin-1",
                ]
            ),
        ),
        EITHER,
    ),
]


# ------------------------------------------------------------------------------------------------ classifier
EXTREMES = [
    FLT_MAX,
    -FLT_MAX,
    Raw("3.4028235e38"),
    Raw("-3.4028235e+38"),
    3.3e38,
    -3.3e38,
    3e38,
    2.9e38,
    1e38,
    -1e38,
    1e30,
    2**100,
    -(2**100),
    1.17549435e-38,
    Raw("1E-45"),
    1e-300,
    5e-324,
    Raw("-0.0"),
    0,
    -0.0,
]
BEYOND_FLOAT32 = [
    3.5e38,
    -3.5e38,
    Raw("3.4028236e38"),
    1e39,
    -1e39,
    1e300,
    Raw("1e309"),
    Raw("-1e400"),
    10**39,
    -(10**39),
    Raw("1" + "0" * 400),
    Raw("1.0e99999"),
]
NON_FINITE = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("nan"), Raw("inf")]
TINY = [Raw("1e-45"), 1e-300, 5e-324, 2.2250738585072014e-308, 1.4e-45, Raw("4.9406564584124654e-324"), -1e-310]


def number(rng):
    """A value from the normal range, written in one of several literal forms."""
    value = rng.gauss(0, 1.5)
    form = rng.random()
    if form < 0.6:
        return value
    if form < 0.7:
        return rng.randint(-5, 5)
    if form < 0.8:
        return Raw(f"{value:.3E}")
    if form < 0.9:
        return rng.choice(TINY)
    return Raw(repr(round(value, 2)))


def classifier_row(rng, features, specials=(), share=0.0):
    row = [number(rng) for _ in range(features)]
    if specials:
        for position in rng.sample(range(features), max(1, int(share * features))):
            row[position] = rng.choice(specials)
    return row


def classifier_body(rng, limits, rows=None, specials=(), share=0.0):
    features = limits.features
    count = rows if rows is not None else rng.choice([0, 0, 0, 1, 2, 3, 5, 8, 16])
    if count == 0:
        return {"inputs": classifier_row(rng, features, specials, share)}
    return {"inputs": [classifier_row(rng, features, specials, share) for _ in range(count)]}


class ClassifierProductions:
    """The classifier's productions: feature rows, float32 extremes, wrong shapes and types."""

    def __init__(self, limits, seed, pool_size):  # rows are drawn per case: no pool, no seed of its own
        self.limits = limits
        self.features, self.max_rows = limits.features, limits.handler["max_rows_per_request"]

    def good(self, rng):
        return (*json_case(rng, classifier_body(rng, self.limits)), OK)

    def at_max_rows(self, rng):
        return (*json_case(rng, classifier_body(rng, self.limits, rows=self.max_rows)), OK)

    def extremes(self, rng):  # finite float32 values, some huge: the oracle decides from the model what must happen
        share = rng.choice([0.01, 0.1, 1.0])
        return (*json_case(rng, classifier_body(rng, self.limits, specials=EXTREMES, share=share)), OK)

    def large_but_safe(self, rng):  # big and tiny finite values the model computes without overflow: must be served
        specials = [1e30, -1e30, 2**100, -(2**90), 1e20, Raw("1.17549435e-38"), Raw("1E-45"), 5e-324, Raw("-0.0")]
        return (
            *json_case(rng, classifier_body(rng, self.limits, specials=specials, share=rng.choice([0.05, 0.3]))),
            OK,
        )

    def issue_repro(self, rng):  # issue 11 #2: [1e38]*128, [2.9e38]*128, random +-2.9e38
        value = rng.choice([1e38, 2.9e38, 3.3e38, FLT_MAX])
        row = (
            [value] * self.features
            if rng.random() < 0.5
            else [rng.choice([value, -value]) for _ in range(self.features)]
        )
        return (*json_case(rng, {"inputs": row}), OK)

    def beyond(self, rng):
        return (*json_case(rng, classifier_body(rng, self.limits, specials=BEYOND_FLOAT32, share=0.01)), ERROR)

    def non_finite(self, rng):
        return (*json_case(rng, classifier_body(rng, self.limits, specials=NON_FINITE, share=0.01)), ERROR)

    def wrong_count(self, rng):
        count = rng.choice(
            [0, 1, self.features - 1, self.features + 1, 2 * self.features, rng.randrange(0, 3 * self.features)]
        )
        count = count if count != self.features else self.features + 1
        row = [number(rng) for _ in range(count)]
        return (*json_case(rng, {"inputs": row if rng.random() < 0.5 else [row]}), ERROR)

    def too_many_rows(self, rng):
        rows = rng.choice([self.max_rows + 1, self.max_rows + 2, 2 * self.max_rows])
        return (*json_case(rng, {"inputs": [[0.5] * self.features] * rows}), ERROR)

    def wrong_type_inputs(self, rng):
        value = rng.choice([None, True, 0, 3.5, "1,2,3", "", {}, {"a": [1]}, [], [[]], [[[0.5] * self.features]]])
        return (*json_case(rng, {"inputs": value}), ERROR)

    def wrong_type_element(self, rng):
        row = classifier_row(rng, self.features)
        row[rng.randrange(self.features)] = rng.choice([None, True, False, "1", "", [1], {"v": 1}, [], Raw("null")])
        return (
            *json_case(rng, {"inputs": row if rng.random() < 0.5 else [classifier_row(rng, self.features), row]}),
            ERROR,
        )

    def ragged(self, rng):
        rows = [classifier_row(rng, self.features), classifier_row(rng, self.features)[: rng.randrange(self.features)]]
        rng.shuffle(rows)
        return (*json_case(rng, {"inputs": rows}), ERROR)

    def row_not_list(self, rng):
        return (
            *json_case(rng, {"inputs": [classifier_row(rng, self.features), rng.choice([5, "row", None, {}])]}),
            ERROR,
        )

    def unknown_field(self, rng):
        body = classifier_body(rng, self.limits)
        body[rng.choice(["input", "temperature", "Inputs", "", "inputs "])] = wrong_values(rng)
        return (*json_case(rng, body), ERROR)

    def missing_inputs(self, rng):
        return (
            *json_case(rng, rng.choice([{}, {"input": [0.5] * self.features}, {"data": [[0.5] * self.features]}])),
            ERROR,
        )

    def duplicate_keys(self, rng):  # the last key wins in Python's parser; a server may also refuse duplicates
        good_rows = classifier_body(rng, self.limits)["inputs"]
        bad = rng.choice([None, "x", [1, 2], []])
        if rng.random() < 0.5:
            return (*json_case(rng, Pairs([("inputs", bad), ("inputs", good_rows)])), EITHER)
        return (*json_case(rng, Pairs([("inputs", good_rows), ("inputs", bad)])), ERROR)

    def max_body(self, rng):  # exactly max_request_size bytes: still served
        body = dumps({"inputs": [0.25] * self.features}).encode()
        return body + b" " * (self.limits.max_request_size - len(body)), JSON, OK

    def over_max_body(self, rng):
        body = dumps({"inputs": [0.25] * self.features}).encode()
        return body + b" " * (self.limits.max_request_size + rng.choice([1, 1000]) - len(body)), JSON, ERROR

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good, 30),
            (self.at_max_rows, 2),
            (self.extremes, 8),
            (self.large_but_safe, 4),
            (self.issue_repro, 3),
            (self.beyond, 6),
            (self.non_finite, 4),
            (self.wrong_count, 5),
            (self.too_many_rows, 2),
            (self.wrong_type_inputs, 4),
            (self.wrong_type_element, 5),
            (self.ragged, 2),
            (self.row_not_list, 2),
            (self.unknown_field, 3),
            (self.missing_inputs, 2),
            (self.duplicate_keys, 3),
            (self.max_body, 0.1),
            (self.over_max_body, 0.1),
        ]

    def good_body(self, rng):
        return json_case(rng, classifier_body(rng, self.limits))[0]


# ------------------------------------------------------------------------------------------------ text models
EMBEDDING_TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
EMPTY_TEXTS = ["", " ", "\t\n", "\u3000", "\u00a0 \u2003", "\r\n"]  # empty, or only whitespace for Python's strip
LONE_SURROGATES = ["\ud800", "\udfff", "a\ud83d", "\ude00b"]  # escaped in JSON they parse; no tokenizer takes them
INVALID_UTF8 = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80abc", b"\xf5\x80\x80\x80"]


def text_of_length(length):
    """Exactly ``length`` characters of words (far more tokens than any model keeps)."""
    return ("word " * (length // 5 + 1))[: length - 1] + "x"


class TextProductions:
    """What every text model's grammar shares (minilm, a user's text classifier or reranker): a pool of texts,
    text/plain bodies in several charsets, the body-size limit, bad UTF-8. Both APIs take ``{"text": ...}``."""

    def __init__(self, limits, seed, pool_size):
        self.limits, self.texts = limits, text_pool(seed, pool_size)
        self.max_inputs = limits.handler["max_inputs"]
        self.text_limit = limits.handler.get("max_text_chars")

    def pick(self, rng):
        return rng.choice(self.texts)

    def plain_text(self, rng):
        content_type = rng.choice(
            ["text/plain", "text/plain; charset=utf-8", "text/plain;charset=UTF-8", "text/markdown", "TEXT/PLAIN"]
        )
        return encode(self.pick(rng)), content_type, OK

    def plain_other_charset(self, rng):  # a charset we may or may not honour: a 200 must answer the text as meant
        text = rng.choice(["naïve façade", "café crème", "Grüße aus Köln"])  # Latin-1 can spell these
        charset = rng.choice(["latin-1", "utf-16"])
        return text.encode(charset), f"text/plain; charset={charset}", EITHER

    def max_body_text(self, rng):  # a text/plain body of exactly max_request_size bytes
        size = self.limits.max_request_size
        return ("word " * (size // 5 + 1)).encode()[:size], "text/plain", OK

    def over_max_body(self, rng):
        return b"x" * (self.limits.max_request_size + rng.choice([1, 1000])), rng.choice(["text/plain", JSON]), ERROR

    def surrogate_pair(self, rng):  # a valid escaped pair is one astral character
        return encode(dumps({"text": "smile \ud83d\ude00 please"}, ascii_only=True)), JSON, OK

    def invalid_utf8_text(self, rng):
        junk = rng.choice(INVALID_UTF8)
        return b"hello " + junk + b" world", rng.choice(["text/plain", "text/plain; charset=utf-8"]), ERROR

    def nul_text(self, rng):
        return b"before \x00 after", "text/plain", OK

    def text_hazards(self):
        """The (production, weight) pairs of hostile and boundary texts every user text model's grammar draws alike
        (plain-text bodies, token and character limits, body size, odd encodings, counts), in the order they walk."""
        return [
            (self.plain_text, 6),
            (self.plain_other_charset, 2),
            (self.token_boundary, 3),
            (self.char_boundary, 1),
            (self.request_chars_boundary, 1),
            (self.max_body_text, 0.1),
            (self.over_max_body, 0.2),
            (self.empty_text, 4),
            (self.lone_surrogate, 3),
            (self.surrogate_pair, 1),
            (self.invalid_utf8_text, 2),
            (self.nul_text, 1),
            (self.over_text_chars, 2),
            (self.over_request_chars, 1),
            (self.too_many_inputs, 2),
        ]


# ------------------------------------------------------------------------------------------------ minilm


class MinilmProductions(TextProductions):
    """minilm's productions: both body shapes, text/plain, limits of tokens, characters and bytes, bad text."""

    def good_text(self, rng):
        body = {"text": self.pick(rng)}
        if rng.random() < 0.3:
            body["truncate"] = rng.random() < 0.5
        return (*json_case(rng, body), OK)

    def good_openai(self, rng):
        count = rng.choice([0, 1, 2, 3, 8])
        body = {"input": self.pick(rng) if count == 0 else [self.pick(rng) for _ in range(count)]}
        for key, value in (
            ("model", "all-MiniLM-L6-v2"),
            ("user", "fuzzer"),
            ("encoding_format", "float"),
            ("dimensions", 384),
            ("truncate", True),
        ):
            if rng.random() < 0.2:
                body[key] = value
        return (*json_case(rng, body), OK)

    def max_inputs_list(self, rng):
        return (*json_case(rng, {"input": [f"short text {i}" for i in range(self.max_inputs)]}), OK)

    def token_boundary(self, rng):  # around the 256-token limit ([CLS] + n words + [SEP]), truncate true and false
        body = {"text": " ".join(["word"] * rng.choice([253, 254, 255, 256, 300])), "truncate": rng.random() < 0.7}
        return (*json_case(rng, body), OK)  # the oracle counts tokens and expects 400 for truncate false + long

    def char_boundary(self, rng):  # at and just over the character limit (the oracle knows which one must fail)
        limit = self.text_limit or 20000
        length = rng.choice([limit, limit + 1])
        text = text_of_length(length)
        if rng.random() < 0.5:
            return encode(text), "text/plain", OK
        return (*json_case(rng, {"input": [text, "short"]}), OK)

    def empty_text(self, rng):
        value = rng.choice(EMPTY_TEXTS)
        if rng.random() < 0.3:
            return encode(value), "text/plain", ERROR
        return (*json_case(rng, rng.choice([{"text": value}, {"input": value}, {"input": ["ok", value]}])), ERROR)

    def wrong_types(self, rng):
        field_name = rng.choice(["text", "input", "truncate", "model", "user", "encoding_format", "dimensions"])
        value = wrong_values(rng)
        if field_name == "truncate" and isinstance(value, bool):
            value = "yes"
        if field_name in ("text", "input") and isinstance(value, str) and value.strip():
            value = 5
        if field_name in ("model", "user") and isinstance(value, str):  # any string is fine there
            value = rng.choice([5, None, ["m"], {"name": "m"}])
        if field_name == "input" and value == [1, 2]:
            value = [[101, 102]]
        body = {"text": "hello"} if field_name in ("text", "truncate") else {"input": "hello"}
        body[field_name] = value
        if field_name == "encoding_format":
            body[field_name] = rng.choice(["base32", "FLOAT", None, 1])  # float and base64 are served
        if field_name == "dimensions":
            body[field_name] = rng.choice([128, 383, 385, 384.0, True, "384", None, 0, -384, 10**30])
        return (*json_case(rng, body), ERROR)

    def too_many_inputs(self, rng):
        return (*json_case(rng, {"input": ["x"] * rng.choice([self.max_inputs + 1, 10 * self.max_inputs])}), ERROR)

    def text_and_input(self, rng):
        return (*json_case(rng, {"text": "a", "input": "b"}), ERROR)

    def unknown_field(self, rng):
        body = rng.choice([{"text": "a"}, {"input": ["a"]}])
        body[rng.choice(["normalize", "pooling", "Text", "", "texts"])] = wrong_values(rng)
        return (*json_case(rng, body), ERROR)

    def lone_surrogate(self, rng):
        where = rng.choice(LONE_SURROGATES)
        body = rng.choice([{"text": f"abc {where} def"}, {"input": ["fine", f"x{where}"]}])
        return encode(dumps(body, ascii_only=True)), JSON, ERROR

    def duplicate_keys(self, rng):
        if rng.random() < 0.5:
            return (*json_case(rng, Pairs([("text", 5), ("text", self.pick(rng))])), EITHER)
        return (*json_case(rng, Pairs([("text", self.pick(rng)), ("text", None)])), ERROR)

    # ----------------------------------------------------------------------------- the other APIs' routes
    def good_cohere(self, rng):  # /v2/embed with a few of the types (the oracle checks float and the others' shapes)
        body = {"texts": [self.pick(rng) for _ in range(rng.choice([1, 2, 4]))]}
        body["embedding_types"] = rng.sample(EMBEDDING_TYPES, rng.randint(1, len(EMBEDDING_TYPES)))
        if rng.random() < 0.5:
            body["input_type"] = rng.choice(["search_query", "search_document", "classification", "clustering"])
        if rng.random() < 0.3:
            body["truncate"] = rng.choice(["END", "NONE"])
        if rng.random() < 0.2:
            body["max_tokens"] = rng.choice([1, 8, 255, 256, 10**6])
        return (*json_case(rng, body), OK, "v2/embed")

    def bad_cohere(self, rng):
        body = {"texts": [self.pick(rng)]}
        name, value = rng.choice(
            [
                ("embedding_types", rng.choice([["int4"], "int8", [], [None], ["float", 8]])),
                ("truncate", rng.choice(["START", "end", 0, True])),
                ("output_dimension", rng.choice([0, 128, 383, -1, 384.5, "384"])),
                ("input_type", rng.choice(["image", "query", 5, ""])),
                ("texts", rng.choice(["one text", [], [5], [""], None])),
                ("images", ["data:image/png;base64,AAAA"]),
                ("max_tokens", rng.choice([0, -5, 1.5, "8"])),
                ("priority", rng.choice(["high", 1.5, []])),
                ("model", rng.choice(["embed-english-v3.0", 5, ""])),
                ("normalize", True),
            ]
        )
        if not (name == "embedding_types" and value == []):
            body[name] = value
        else:
            body["texts"] = []
        return (*json_case(rng, body), ERROR, "v2/embed")

    def good_compressed(self, rng):  # OpenAI's route with a compressed encoding_format
        body = {"input": [self.pick(rng) for _ in range(rng.choice([1, 3]))]}
        body["encoding_format"] = rng.choice(EMBEDDING_TYPES)
        return (*json_case(rng, body), OK, "v1/embeddings")

    def good_tei_embed(self, rng):
        body = {"inputs": self.pick(rng) if rng.random() < 0.3 else [self.pick(rng), self.pick(rng)], "truncate": True}
        return (*json_case(rng, body), OK, "embed")

    def good_tokenize(self, rng):
        body = {"inputs": [self.pick(rng) for _ in range(rng.choice([1, 2]))]}
        if rng.random() < 0.5:
            body["add_special_tokens"] = rng.random() < 0.5
        return (*json_case(rng, body), OK, "tokenize")

    def bad_tokenizer_route(self, rng):
        path, body = rng.choice(
            [
                ("tokenize", {"inputs": rng.choice([5, [], None, [""], {"a": 1}])}),
                ("tokenize", {"inputs": "a", "add_special_tokens": rng.choice(["no", 0, 1])}),
                ("tokenize", {"inputs": "a", "prompt_name": "query"}),
                ("decode", {"ids": rng.choice([[-1], [10**9], [1.5], [], [[]], "101", [True], [[[1]]]])}),
                ("decode", {"ids": [101], "skip_special_tokens": "yes"}),
                (
                    "embed",
                    {"inputs": "a", rng.choice(["normalize", "truncation_direction"]): rng.choice([False, "left"])},
                ),
            ]
        )
        return (*json_case(rng, body), ERROR, path)

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good_text, 22),
            (self.good_openai, 12),
            (self.good_cohere, 4),
            (self.bad_cohere, 4),
            (self.good_compressed, 3),
            (self.good_tei_embed, 2),
            (self.good_tokenize, 2),
            (self.bad_tokenizer_route, 3),
            (self.max_inputs_list, 1),
            (self.plain_text, 10),
            (self.plain_other_charset, 2),
            (self.token_boundary, 3),
            (self.char_boundary, 1),
            (self.max_body_text, 0.1),
            (self.over_max_body, 0.2),
            (self.empty_text, 4),
            (self.wrong_types, 10),
            (self.too_many_inputs, 2),
            (self.text_and_input, 1),
            (self.unknown_field, 3),
            (self.lone_surrogate, 3),
            (self.surrogate_pair, 1),
            (self.invalid_utf8_text, 3),
            (self.nul_text, 1),
            (self.duplicate_keys, 2),
        ]

    def good_body(self, rng):
        return json_case(rng, {"text": self.pick(rng)})[0]


# ------------------------------------------------------------------------------------------------ text-classifier
# top_k / top_n: a positive integer (a huge one is clamped) or null; everything else is refused.
BAD_COUNTS = [
    0,
    -1,
    -(10**30),
    Raw("-0"),
    1.5,
    2.0,
    1e30,
    Raw("1e2"),
    Raw("1E400"),
    Raw("NaN"),
    Raw("-Infinity"),
    True,
    False,
    "2",
    "",
    [],
    [1],
    {},
]


class TextClassifierProductions(TextProductions):
    """A user's text classifier, NLI model or reranker (handlers/text/requests/classification.py): one text or pair,
    lists mixing texts and pairs, reranking (valid only for a model with one output), top_k and top_n at their extremes,
    the character, token and count limits, and wrong types for every field."""

    def __init__(self, limits, seed, pool_size):
        super().__init__(limits, seed, pool_size)
        self.labels = max(1, limits.labels)
        self.reranks = OK if limits.labels == 1 else ERROR  # reranking needs one relevance score
        self.max_tokens = limits.max_tokens or 128
        self.request_chars = limits.handler["max_request_chars"]

    def row(self, rng):  # an item of 'inputs': a text or a [text, text_pair]
        return [self.pick(rng), self.pick(rng)] if rng.random() < 0.4 else self.pick(rng)

    def count(self, rng):  # a valid top_k / top_n
        return rng.choice([None, 1, 1, 2, 3, self.labels, self.labels + 1, 10**30, Raw("1" + "0" * 400)])

    def options(self, rng, body, names=("top_k", "truncate")):
        for name in names:
            if rng.random() < 0.3:
                body[name] = rng.random() < 0.5 if name in ("truncate", "return_documents") else self.count(rng)
        return body

    def place(self, rng, value):
        """A body of some shape with ``value`` in one of its text slots (the other slots hold good texts)."""
        good = self.pick(rng)
        return rng.choice(
            [
                {"text": value},
                {"text": good, "text_pair": value},
                {"inputs": value},
                {"inputs": [good, value]},
                {"inputs": [[good, value]]},
                {"inputs": [[value, good], good]},
                {"query": value, "documents": [good]},
                {"query": good, "documents": [good, value]},
            ]
        )

    def good_text(self, rng):
        body = {"text": self.pick(rng)}
        if rng.random() < 0.5:
            body["text_pair"] = self.pick(rng) if rng.random() < 0.9 else None
        return (*json_case(rng, self.options(rng, body)), OK)

    def good_inputs(self, rng):
        count = rng.choice([0, 1, 2, 3, 5, 8])
        inputs = self.pick(rng) if count == 0 else [self.row(rng) for _ in range(count)]
        return (*json_case(rng, self.options(rng, {"inputs": inputs})), OK)

    def max_inputs_list(self, rng):
        inputs = [
            [f"premise {i}", f"hypothesis {i}"] if i % 3 == 0 else f"short text {i}" for i in range(self.max_inputs)
        ]
        return (*json_case(rng, {"inputs": inputs, "top_k": None}), OK)

    def rerank(self, rng):  # valid for a reranker; a model with several outputs must refuse it
        body = {"query": self.pick(rng), "documents": [self.pick(rng) for _ in range(rng.choice([1, 2, 3, 5, 8, 16]))]}
        return (*json_case(rng, self.options(rng, body, ("top_n", "return_documents", "truncate"))), self.reranks)

    def rerank_route(self, rng):  # Cohere v2 / v1 (and Jina) / TEI bodies: valid for a reranker only
        documents = [self.pick(rng) for _ in range(rng.choice([1, 2, 3, 5]))]
        path = rng.choice(["v2/rerank", "v1/rerank", "rerank"])
        if path == "rerank":
            body = {"query": self.pick(rng), "texts": documents, "truncate": True}
            for name in ("raw_scores", "return_text"):
                if rng.random() < 0.4:
                    body[name] = rng.random() < 0.5
        else:
            body = {"query": self.pick(rng), "documents": [{"text": d} if rng.random() < 0.3 else d for d in documents]}
            if rng.random() < 0.4:
                body["top_n"] = rng.choice([1, 2, 10**6])
            if rng.random() < 0.4:
                body["return_documents"] = rng.random() < 0.5
            if rng.random() < 0.3:
                body["max_tokens_per_doc"] = rng.choice([1, 4, 4096])
        return (*json_case(rng, body), self.reranks, path)

    def bad_rerank_route(self, rng):
        path = rng.choice(["v2/rerank", "v1/rerank", "rerank"])
        docs = "texts" if path == "rerank" else "documents"
        body = {"query": "q", docs: ["d"]}
        name, value = rng.choice(
            [
                (docs, rng.choice([[], "d", [5], [{"title": "t"}], None])),
                ("query", rng.choice(["", 5, None, ["q"]])),
                ("top_n" if path != "rerank" else "raw_scores", rng.choice([0, -1, "2", 1.5])),
                ("max_tokens_per_doc" if path != "rerank" else "truncation_direction", rng.choice([0, "left", -3])),
                (
                    "model" if path != "rerank" else "return_text",
                    rng.choice([5, "rerank-v3.5"] if path != "rerank" else [1]),
                ),
                ("unknown", 1),
            ]
        )
        body[name] = value
        return (*json_case(rng, body), ERROR, path)

    def zero_shot(self, rng):  # valid for an NLI model only (one whose labels name entailment)
        labels = rng.sample(["travel", "cooking", "finance", "sports", "music", "politics"], rng.choice([1, 2, 3]))
        text = self.pick(rng) if rng.random() < 0.5 else [self.pick(rng), self.pick(rng)]
        options = {"candidate_labels": labels, "multi_label": rng.random() < 0.5}
        if rng.random() < 0.3:
            options["hypothesis_template"] = "This text is about {}."
        body = {"inputs": text, "parameters": options} if rng.random() < 0.5 else {"inputs": text, **options}
        return (*json_case(rng, body), EITHER)

    def bad_zero_shot(self, rng):
        body = {"inputs": "x", "candidate_labels": ["a", "b"]}
        name, value = rng.choice(
            [
                ("candidate_labels", rng.choice([[], "", [5], [" "], {"a": 1}])),
                ("hypothesis_template", rng.choice(["no placeholder", "{0} {}", 5, "{}{}{x}"])),
                ("multi_label", rng.choice(["yes", 1, 0])),
                ("parameters", rng.choice([[], "x", 5])),
            ]
        )
        body[name] = value
        return (*json_case(rng, body), ERROR)

    def tokenize_route(self, rng):
        return (*json_case(rng, {"inputs": [self.pick(rng), self.pick(rng)]}), OK, "tokenize")

    def rerank_max_documents(self, rng):
        documents = [f"document number {i}" for i in range(self.max_inputs)]
        body = {
            "query": "which document?",
            "documents": documents,
            "top_n": rng.choice([None, 3]),
            "return_documents": True,
        }
        return (*json_case(rng, body), self.reranks)

    def count_extremes(self, rng):  # valid extremes: null (every label), more than there are, a 400-digit integer
        value = rng.choice([None, 1, self.labels, self.labels + 1, 10**30, Raw("1" + "0" * 400), Raw("1")])
        if self.reranks == OK and rng.random() < 0.5:
            return (*json_case(rng, {"query": "q", "documents": [self.pick(rng), self.pick(rng)], "top_n": value}), OK)
        body = rng.choice([{"text": self.pick(rng)}, {"inputs": [self.row(rng), self.row(rng)]}])
        return (*json_case(rng, {**body, "top_k": value}), OK)

    def token_boundary(self, rng):  # around the model's token limit, truncate true and false: the oracle counts tokens
        text = " ".join(["word"] * (self.max_tokens + rng.choice([-4, -3, -2, -1, 0, 1, 40])))
        body = rng.choice(
            [{"text": text}, {"text": "a question", "text_pair": text}, {"inputs": [text, ["short", text]]}]
        )
        body["truncate"] = rng.random() < 0.6
        return (*json_case(rng, body), OK)

    def char_boundary(self, rng):  # one text at and just over max_text_chars (the oracle knows which one must fail)
        text = text_of_length(rng.choice([self.text_limit, self.text_limit + 1]))
        if rng.random() < 0.3:
            return encode(text), "text/plain", OK
        body = rng.choice([{"text": text}, {"text": "short", "text_pair": text}, {"inputs": [["short", text]]}])
        return (*json_case(rng, body), OK)

    def request_chars_boundary(self, rng):  # all texts together at and just over max_request_chars
        total = self.request_chars + rng.choice([0, 1])
        count = min(self.max_inputs, max(2, -(-total // self.text_limit)))
        if self.reranks == OK and rng.random() < 0.5:  # the query counts once per document
            query = min(self.text_limit, total // (2 * count))
            sizes = [(total - count * query) // count] * count
            sizes[0] += total - count * query - sum(sizes)
            body = {"query": text_of_length(query), "documents": [text_of_length(n) for n in sizes]}
        else:
            sizes = [total // count] * count
            sizes[0] += total - sum(sizes)
            body = {"inputs": [text_of_length(n) for n in sizes]}
        return (*json_case(rng, body), OK)  # over the limit: the oracle expects the 413

    def empty_text(self, rng):
        value = rng.choice(EMPTY_TEXTS)
        if rng.random() < 0.2:
            return encode(value), "text/plain", ERROR
        return (*json_case(rng, self.place(rng, value)), ERROR)

    def lone_surrogate(self, rng):
        body = self.place(rng, f"abc {rng.choice(LONE_SURROGATES)} def")
        return encode(dumps(body, ascii_only=True)), JSON, ERROR

    def over_text_chars(self, rng):
        text = text_of_length(self.text_limit + rng.choice([1, 100, self.text_limit]))
        return (*json_case(rng, self.place(rng, text)), ERROR)

    def over_request_chars(self, rng):  # every text within max_text_chars, together over max_request_chars
        count = self.request_chars // self.text_limit + 1
        if self.reranks == OK and rng.random() < 0.5:  # a short list of documents, each paired with a long query
            body = {"query": text_of_length(self.text_limit), "documents": ["short"] * count}
        else:
            body = {"inputs": [text_of_length(self.text_limit)] * count}
        return (*json_case(rng, body), ERROR)

    def too_many_inputs(self, rng):
        items = ["x"] * rng.choice([self.max_inputs + 1, 10 * self.max_inputs])
        return (*json_case(rng, rng.choice([{"inputs": items}, {"query": "q", "documents": items}])), ERROR)

    def bad_pair(self, rng):  # a pair is exactly two texts
        good = self.pick(rng)
        item = rng.choice([[], [good], [good, good, good], [good, 5], [None, good], [good, [good]], [good, ""]])
        return (*json_case(rng, {"inputs": rng.choice([[item], [good, item]])}), ERROR)

    def wrong_types(self, rng):
        field_name = rng.choice(
            ["text", "text_pair", "inputs", "truncate", "top_k", "query", "documents", "top_n", "return_documents"]
        )
        value = wrong_values(rng)
        if field_name in ("text", "text_pair", "inputs", "query") and isinstance(value, str) and value.strip():
            value = 5  # any non-blank string is a text
        if field_name == "text_pair" and value is None:  # null: no pair
            value = [self.pick(rng)]
        if field_name in ("truncate", "return_documents") and isinstance(value, bool):
            value = "yes"
        if field_name in ("top_k", "top_n"):
            value = rng.choice(BAD_COUNTS)
        if field_name in ("query", "documents", "top_n", "return_documents"):
            body = {"query": "q", "documents": ["d"]}
        else:
            body = rng.choice([{"text": "hello"}, {"inputs": ["hello"]}]) if field_name in ("truncate", "top_k") else {}
            body.setdefault("text" if field_name == "text_pair" else field_name, "hello")
        body[field_name] = value
        return (*json_case(rng, body), ERROR)

    def bad_counts(self, rng):  # top_k / top_n: 0, negatives, floats, booleans, 1e30, strings
        value = rng.choice(BAD_COUNTS)
        if rng.random() < 0.3:
            return (*json_case(rng, {"query": "q", "documents": ["a", "b"], "top_n": value}), ERROR)
        body = rng.choice([{"text": self.pick(rng)}, {"inputs": [self.row(rng)]}])
        return (*json_case(rng, {**body, "top_k": value}), ERROR)

    def unknown_field(self, rng):  # a stranger, or another shape's field
        body, strangers = rng.choice(
            [
                ({"text": "a"}, ["top_n", "documents", "return_documents", "Text", "", "texts", "label"]),
                ({"inputs": ["a"]}, ["text_pair", "top_n", "input", "Inputs", "return_documents"]),
                ({"query": "q", "documents": ["d"]}, ["top_k", "text_pair", "document", "Query"]),
            ]
        )
        body[rng.choice(strangers)] = rng.choice([wrong_values(rng), 1, True, "a"])
        return (*json_case(rng, body), ERROR)

    def shapes(self, rng):  # two request shapes at once, or none
        body = rng.choice(
            [
                {"text": "a", "inputs": ["b"]},
                {"text": "a", "query": "b", "documents": ["c"]},
                {"inputs": ["a"], "query": "b", "documents": ["c"]},
                {},
                {"top_k": 1},
                {"documents": ["d"]},
                {"text_pair": "b"},
                {"input": "a"},
            ]
        )
        return (*json_case(rng, body), ERROR)

    def duplicate_keys(self, rng):  # the last key wins in Python's parser; a server may also refuse duplicates
        text = self.pick(rng)
        if rng.random() < 0.5:
            good = rng.choice(
                [Pairs([("text", 5), ("text", text)]), Pairs([("top_k", 0), ("text", text), ("top_k", 2)])]
            )
            return (*json_case(rng, good), EITHER)
        bad = rng.choice(
            [Pairs([("text", text), ("text", None)]), Pairs([("inputs", [text]), ("top_k", 1), ("top_k", -1)])]
        )
        return (*json_case(rng, bad), ERROR)

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good_text, 14),
            (self.good_inputs, 14),
            (self.max_inputs_list, 1),
            (self.rerank, 8),
            (self.rerank_route, 6),
            (self.bad_rerank_route, 4),
            (self.zero_shot, 4),
            (self.bad_zero_shot, 3),
            (self.tokenize_route, 1),
            (self.rerank_max_documents, 1),
            (self.count_extremes, 3),
            *self.text_hazards(),
            (self.bad_pair, 3),
            (self.wrong_types, 10),
            (self.bad_counts, 6),
            (self.unknown_field, 3),
            (self.shapes, 3),
            (self.duplicate_keys, 2),
        ]

    def good_body(self, rng):
        return json_case(rng, rng.choice([{"text": self.pick(rng)}, {"inputs": [self.row(rng), self.row(rng)]}]))[0]


class TextModelProductions(TextProductions):
    """A user's embedding, sparse or multi-vector model (handlers/text/requests/embedding.py, sparse.py,
    multi_vector.py): 'text' and 'input' bodies with the kind's options at valid extremes and at wrong values, the
    character, token and count limits, and wrong types for every field. A subclass names its options."""

    # option -> (valid values, wrong values)
    options: dict[str, tuple[list[Any], list[Any]]] = {"truncate": ([True, False], ["yes", 1, None, [True]])}

    def __init__(self, limits, seed, pool_size):
        super().__init__(limits, seed, pool_size)
        self.max_tokens = limits.max_tokens or 128
        self.request_chars = limits.handler["max_request_chars"]

    def with_options(self, rng, body, share=0.4):
        for name, (valid, _) in self.options.items():
            if rng.random() < share:
                body[name] = rng.choice(valid)
        return body

    def place(self, rng, value):
        good = self.pick(rng)
        return rng.choice([{"text": value}, {"input": value}, {"input": [good, value]}, {"input": [value]}])

    def good_text(self, rng):
        return (*json_case(rng, self.with_options(rng, {"text": self.pick(rng)})), OK)

    def good_input(self, rng):
        count = rng.choice([0, 1, 2, 3, 5, 8])
        inputs = self.pick(rng) if count == 0 else [self.pick(rng) for _ in range(count)]
        return (*json_case(rng, self.with_options(rng, {"input": inputs})), OK)

    def max_inputs_list(self, rng):
        return (*json_case(rng, {"input": [f"short text {i}" for i in range(self.max_inputs)]}), OK)

    def option_extremes(self, rng):  # every option at a valid value, several at once
        return (*json_case(rng, self.with_options(rng, {"input": [self.pick(rng)]}, share=0.9)), OK)

    def largest_answer(self, rng):
        """The largest answer a request may ask for: max_inputs texts, each as long as the model reads (within the
        request's characters), in the widest encoding (the default, JSON numbers). Over max_response_size it must be
        a 413 naming the limit, never a dropped worker (handlers/core/answer_size.py)."""
        chars = min(self.text_limit, self.request_chars // self.max_inputs)
        words = min(self.max_tokens, max(1, chars // 5))
        return (*json_case(rng, {"input": [" ".join(["word"] * words)] * self.max_inputs}), EITHER)

    def bad_option(self, rng):
        name = rng.choice(sorted(self.options))
        body = rng.choice([{"text": self.pick(rng)}, {"input": [self.pick(rng)]}])
        body[name] = rng.choice(self.options[name][1])
        return (*json_case(rng, body), ERROR)

    def token_boundary(self, rng):  # around the token limit, truncate true and false: the oracle counts tokens
        text = " ".join(["word"] * (self.max_tokens + rng.choice([-4, -2, -1, 0, 1, 40])))
        body = rng.choice([{"text": text}, {"input": [text, "short"]}])
        body["truncate"] = rng.random() < 0.6
        return (*json_case(rng, body), OK)

    def char_boundary(self, rng):  # at and just over max_text_chars (the oracle knows which one must fail)
        text = text_of_length(rng.choice([self.text_limit, self.text_limit + 1]))
        return (*json_case(rng, rng.choice([{"text": text}, {"input": ["short", text]}])), OK)

    def request_chars_boundary(self, rng):
        total = self.request_chars + rng.choice([0, 1])
        count = min(self.max_inputs, max(2, -(-total // self.text_limit)))
        sizes = [total // count] * count
        sizes[0] += total - sum(sizes)
        return (*json_case(rng, {"input": [text_of_length(n) for n in sizes]}), OK)

    def empty_text(self, rng):
        value = rng.choice(EMPTY_TEXTS)
        if rng.random() < 0.2:
            return encode(value), "text/plain", ERROR
        return (*json_case(rng, self.place(rng, value)), ERROR)

    def lone_surrogate(self, rng):
        return encode(dumps(self.place(rng, f"abc {rng.choice(LONE_SURROGATES)} def"), ascii_only=True)), JSON, ERROR

    def over_text_chars(self, rng):
        text = text_of_length(self.text_limit + rng.choice([1, 100, self.text_limit]))
        return (*json_case(rng, self.place(rng, text)), ERROR)

    def over_request_chars(self, rng):
        count = self.request_chars // self.text_limit + 1
        return (*json_case(rng, {"input": [text_of_length(self.text_limit)] * count}), ERROR)

    def too_many_inputs(self, rng):
        return (*json_case(rng, {"input": ["x"] * rng.choice([self.max_inputs + 1, 10 * self.max_inputs])}), ERROR)

    def wrong_types(self, rng):
        field_name = rng.choice(["text", "input", *self.options])
        value = wrong_values(rng)
        if field_name in ("text", "input") and isinstance(value, str) and value.strip():
            value = 5  # any non-blank string is a text
        if field_name in self.options:
            value = rng.choice(self.options[field_name][1])
        body = {} if field_name in ("text", "input") else {"text": "hello"}
        body[field_name] = value
        return (*json_case(rng, body), ERROR)

    def unknown_field(self, rng):
        body = rng.choice([{"text": "a"}, {"input": ["a"]}])
        body[rng.choice(["inputs", "texts", "Text", "", "query", "documents", "top_n", "label"])] = 1
        return (*json_case(rng, body), ERROR)

    def shapes(self, rng):  # two request shapes at once, or none
        body = rng.choice([{"text": "a", "input": ["b"]}, {}, {"truncate": True}, {"inputs": ["a"]}])
        return (*json_case(rng, body), ERROR)

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good_text, 14),
            (self.good_input, 14),
            (self.max_inputs_list, 1),
            (self.largest_answer, 1),
            (self.option_extremes, 4),
            *self.text_hazards(),
            (self.bad_option, 6),
            (self.wrong_types, 8),
            (self.unknown_field, 3),
            (self.shapes, 3),
        ]

    def good_body(self, rng):
        return json_case(rng, rng.choice([{"text": self.pick(rng)}, {"input": [self.pick(rng), self.pick(rng)]}]))[0]


class PromptedProductions(TextModelProductions):
    """A model with named prompts (embedding, sparse): prompt_name picks one, null none, another name is a 400."""

    def __init__(self, limits, seed, pool_size):
        super().__init__(limits, seed, pool_size)
        names = [*limits.prompts, None]
        self.options = {**self.options, "prompt_name": (names, ["no-such-prompt", 5, [], "Query", "\ud800"])}


class EmbeddingProductions(PromptedProductions):
    """A user's embedding model: the native 'text' and 'input' shapes (the OpenAI route has its own client tests)."""


class SparseProductions(PromptedProductions):
    """A SPLADE model: top_k (1 to 10^30 valid; 0, negatives, floats, strings not) and decode."""

    def __init__(self, limits, seed, pool_size):
        super().__init__(limits, seed, pool_size)
        self.options = {
            **self.options,
            "top_k": ([None, 1, 2, 5, 10**30, Raw("1" + "0" * 400)], BAD_COUNTS),
            "decode": ([True, False], ["yes", 1, None, []]),
        }


class MultiVectorProductions(TextModelProductions):
    """A multi-vector model: input_type query or document."""

    options = {
        **TextModelProductions.options,
        "input_type": (["query", "document"], ["passage", "Query", "", None, 5, ["query"]]),
    }


# ------------------------------------------------------------------------------------------------ generator
TINY_TEMPERATURES = [1e-40, 1e-300, 5e-324, 1.4e-45, Raw("1e-45"), 1e-30, 1e-8]
MAX_SEED = 2**63 - 1


GOOD_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "point",
        "schema": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
            "required": ["x", "ok"],
            "additionalProperties": False,
        },
    },
}
BAD_RESPONSE_FORMATS = [
    "json",
    [],
    {"type": "yaml"},
    {"type": "json_schema"},
    {"type": "json_object", "schema": {}},
    {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "tuple"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["v" * 60] * 2000}}},
]


def nested_schema(depth):
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


HOSTILE_SCHEMAS = [
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    {"enum": [f"value-{i}" for i in range(4000)]},
    {"type": "string", "pattern": "^(a+)+(b|c|d+)*[x-z]{2,40}$"},
    {"type": "string", "pattern": "^(x{1,1000}){1,1000}$"},
    nested_schema(30),
    nested_schema(200),
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}},
]


CHAT_PATH = "v1/chat/completions"
# Tools on chat (docs/generation.md, "Tools"): one small tool (the demo's prompt limit holds it and a question).
CLOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "clock",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet"]}, "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
            "required": ["zone", "hour"],
            "additionalProperties": False,
        },
    },
}
TOOL_CHOICES = ["auto", "none", "required", {"type": "function", "function": {"name": "clock"}}]
BAD_TOOLS = [
    {"tools": {"type": "function"}},
    {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
    {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
    {"tools": [CLOCK_TOOL, CLOCK_TOOL]},
    {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": nested_schema(40)}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
    {"tools": [{"type": "retrieval"}]},
    {"tools": [CLOCK_TOOL], "tool_choice": "always"},
    {"tools": [CLOCK_TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
    {"tool_choice": "required"},
    {"tools": [CLOCK_TOOL], "parallel_tool_calls": "yes"},
    {"tools": [CLOCK_TOOL], "response_format": {"type": "json_object"}},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "12"}]},
]


class GeneratorProductions:
    """The generator's productions: sampling settings at and past their limits, prompt lengths, bad fields."""

    def __init__(self, limits, seed, pool_size):
        self.limits, self.prompts = limits, prompt_pool(seed, pool_size)
        self.max_new = limits.handler["max_new_tokens"]
        self.max_prompt = limits.handler["max_prompt_tokens"]
        self.max_temperature = limits.handler["max_temperature"]
        self.vocab = limits.vocab_size
        self.max_n = limits.handler.get("max_n", 1)

    def settings(self, rng, body):
        body["max_new_tokens"] = rng.choice([None, 1, 2, 3, 4, 6, 8, 12, 16, 16, 16])
        if rng.random() < 0.01:
            body["max_new_tokens"] = rng.choice([self.max_new, self.max_new - 1, 64])
        body["temperature"] = rng.choice([None, 0, 0, Raw("-0.0"), 0.7, 1, 1.3, self.max_temperature, 1e-3])
        body["top_k"] = rng.choice([None, 0, 1, 2, 40, self.vocab - 1, self.vocab])
        body["seed"] = rng.choice([None, 0, 1, MAX_SEED, rng.randrange(MAX_SEED)])
        body["stream"] = rng.choice([None, True, False])
        # The similarity cache's option is valid with or without a cache in the archive (docs/semantic-cache.md).
        body["semantic_cache"] = rng.choice([None, None, None, False, True, {"min_similarity": 1}, {"partition": "t"}])
        # Structured outputs (docs/generation.md): mostly free text, sometimes JSON mode or a small schema.
        body["response_format"] = rng.choice([None] * 6 + [{"type": "text"}, {"type": "json_object"}, GOOD_SCHEMA])
        body["logprobs"] = rng.choice([None] * 8 + [0, 3, 20])
        return {k: v for k, v in body.items() if v is not None}

    def choices(self, rng):  # n > 1: every choice's answer (the oracle compares each with the request alone)
        body = self.settings(rng, {"prompt": rng.choice(self.prompts)})
        body["n"] = rng.choice(sorted({1, 2, 3, self.max_n}))
        return (*json_case(rng, body), OK)

    def good(self, rng):
        return (*json_case(rng, self.settings(rng, {"prompt": rng.choice(self.prompts)})), OK)

    def tiny_temperature(self, rng):  # issue 11 #1: must not fail the request (nor, above all, its batch-mates)
        body = self.settings(rng, {"prompt": rng.choice(self.prompts)})
        body["temperature"] = rng.choice(TINY_TEMPERATURES)
        return (*json_case(rng, body), EITHER)

    def prompt_at_limit(self, rng):
        count = rng.choice([self.max_prompt, self.max_prompt - 1])
        body = {"prompt": self.limits.repeat_piece * count, "max_new_tokens": rng.choice([1, 4])}
        return (*json_case(rng, body), OK)

    def prompt_over_limit(self, rng):
        count = rng.choice([self.max_prompt + 1, 2 * self.max_prompt])
        return (*json_case(rng, {"prompt": self.limits.repeat_piece * count, "max_new_tokens": 1}), ERROR)

    def prompt_over_chars(self, rng):
        return (*json_case(rng, {"prompt": "x" * (self.limits.max_prompt_chars + rng.choice([1, 1000]))}), ERROR)

    def bad_field(self, rng):
        body = {"prompt": rng.choice(self.prompts), "max_new_tokens": 2}
        name, value = rng.choice(
            [
                ("max_new_tokens", rng.choice([0, -1, self.max_new + 1, 10**30, 2.5, Raw("1e2"), "4", True, None, []])),
                (
                    "temperature",
                    rng.choice(
                        [
                            -1e-9,
                            -1,
                            self.max_temperature * 1.000001,
                            1e308,
                            Raw("NaN"),
                            Raw("Infinity"),
                            Raw("-Infinity"),
                            Raw("1e309"),
                            Raw("1" + "0" * 400),
                            "0.5",
                            True,
                            None,
                        ]
                    ),
                ),
                ("top_k", rng.choice([-1, self.vocab + 1, 10**20, 1.5, "5", True, None])),
                ("seed", rng.choice([-1, MAX_SEED + 1, 2**64, 2**64 + 1, 1.0, "42", True, None, Raw("1e18")])),
                ("stream", rng.choice(["true", 1, 0, None, "yes", []])),
                ("logprobs", rng.choice([-1, 21, 2.5, "3", True, None, [3]])),
                ("n", rng.choice([0, -1, self.max_n + 1, 10**9, 1.5, Raw("1e9"), "2", True, None])),
                (
                    "semantic_cache",
                    rng.choice(
                        ["yes", 0, [], {"min_similarity": "1"}, {"min_similarity": 2}, {"partition": 5}, {"mode": 1}]
                    ),
                ),
                ("prompt", rng.choice([None, 5, ["a", "b"], {"text": "a"}, "", True])),
                ("response_format", rng.choice(BAD_RESPONSE_FORMATS)),
            ]
        )
        body[name] = value
        return (*json_case(rng, body), ERROR)

    def hostile_schema(self, rng):  # compiled within the grammar library's limits, or refused: never a crash
        schema = rng.choice(HOSTILE_SCHEMAS)
        body = {"prompt": "hi", "max_new_tokens": rng.choice([1, 8]), "seed": 1, "temperature": 1}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "h", "schema": schema}}
        return (*json_case(rng, body), EITHER)

    def chat(self, rng, **fields):
        return {"messages": [{"role": "user", "content": rng.choice(["Time?", "hi", "日本"])}], **fields}

    def tool_calls(self, rng):  # the oracle validates every call's arguments against the tool's parameters
        body = self.chat(rng, tools=[CLOCK_TOOL], tool_choice=rng.choice(TOOL_CHOICES), seed=rng.randrange(1000))
        body["max_tokens"] = rng.choice([1, 8, 150])
        body["temperature"] = rng.choice([0, 1])
        if rng.random() < 0.5:
            body["parallel_tool_calls"] = rng.choice([True, False])
        return (*json_case(rng, body), OK, CHAT_PATH)

    def bad_tools(self, rng):
        body = {**self.chat(rng, max_tokens=4), **rng.choice(BAD_TOOLS)}
        return (*json_case(rng, body), ERROR, CHAT_PATH)

    def hostile_tools(self, rng):  # compiled within the grammar library's limits, or refused: never a crash
        tools = [{"type": "function", "function": {"name": "h", "parameters": rng.choice(HOSTILE_SCHEMAS)}}]
        if rng.random() < 0.3:  # the most tools allowed, each with a schema of its own
            tools = [
                {"type": "function", "function": {"name": f"t{i}", "parameters": nested_schema(i % 8)}}
                for i in range(128)
            ]
        body = self.chat(rng, tools=tools, tool_choice=rng.choice(["required", "auto"]), max_tokens=8, seed=1)
        return (*json_case(rng, body), EITHER, CHAT_PATH)

    def unknown_field(self, rng):
        body = {"prompt": "hi"}
        body[rng.choice(["max_tokens", "best_of", "stop", "top_p", "Prompt", ""])] = wrong_values(rng)
        return (*json_case(rng, body), ERROR)

    def missing_prompt(self, rng):
        return (*json_case(rng, rng.choice([{}, {"max_new_tokens": 3}, {"text": "hi"}])), ERROR)

    def lone_surrogate(self, rng):
        surrogate = rng.choice(["\ud800", "\udbff", "\udc00"])
        body = {"prompt": f"a {surrogate} b", "max_new_tokens": 2}
        return encode(dumps(body, ascii_only=True)), JSON, ERROR

    def odd_prompt(self, rng):  # valid but unusual self.prompts: whitespace, NUL, astral characters, control characters
        prompt = rng.choice([" ", "\n", "\u0000", "\U0001f600", "\x7f\x1b[0m", "\u200b", "\ufeff"])
        return (
            *json_case(
                rng,
                {"prompt": prompt, "max_new_tokens": rng.choice([1, 3]), "seed": 7, "temperature": rng.choice([0, 1])},
            ),
            OK,
        )

    def duplicate_keys(self, rng):
        if rng.random() < 0.5:
            return (
                *json_case(rng, Pairs([("prompt", None), ("prompt", rng.choice(self.prompts)), ("max_new_tokens", 2)])),
                EITHER,
            )
        return (*json_case(rng, Pairs([("prompt", "hi"), ("max_new_tokens", 2), ("max_new_tokens", 0)])), ERROR)

    def over_max_body(self, rng):
        body = encode(dumps({"prompt": "hi"}))
        return body + b" " * (self.limits.max_request_size + 1 - len(body)), JSON, ERROR

    def weighted(self):
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good, 40),
            (self.tiny_temperature, 6),
            (self.choices, 4),
            (self.prompt_at_limit, 1),
            (self.prompt_over_limit, 1),
            (self.prompt_over_chars, 1),
            (self.bad_field, 20),
            (self.unknown_field, 3),
            (self.missing_prompt, 2),
            (self.lone_surrogate, 2),
            (self.odd_prompt, 2),
            (self.duplicate_keys, 2),
            (self.hostile_schema, 1),
            (self.tool_calls, 4),
            (self.bad_tools, 3),
            (self.hostile_tools, 1),
            (self.over_max_body, 0.1),
        ]

    def good_body(self, rng):
        return json_case(rng, {"prompt": rng.choice(self.prompts), "max_new_tokens": 2})[0]


def prompt_pool(seed, size):
    rng = random.Random(f"{seed}:prompts")
    prompts = [
        "Once upon a time",
        "hi",
        "The quick brown fox",
        "naïve café",
        "日本語",
        "emoji 😀",
        "".join(rng.choice(string.printable) for _ in range(40)),
    ]
    while len(prompts) < size:
        prompts.append(sentence(rng, rng.choice([1, 2, 5, 12, 30])))
    return prompts[:size]


# ------------------------------------------------------------------------------------------------ campaign
# Each oracle's own productions (a model's oracle: scripts/ops/registry.py); the generic ones (GENERIC: content types,
# encodings, broken JSON) are added to all.
PRODUCTIONS = {
    "mlp": ClassifierProductions,
    "minilm": MinilmProductions,
    "generator": GeneratorProductions,
    "classification": TextClassifierProductions,
    "embedding": EmbeddingProductions,
    "sparse": SparseProductions,
    "multi-vector": MultiVectorProductions,
    "image-classification": ImageProductions,
    "image-text": ImageProductions,
}


class Grammar:
    """All productions of one model; ``case(index)`` is a pure function of (seed, model, index).

    ``kind`` picks the productions (a key of PRODUCTIONS, the model's oracle: default the registry's for a model of
    that name, scripts/ops/registry.py);
    ``archive``, for a user's model, is what its cases' reproducers name."""

    def __init__(self, model, limits, seed, pool_size=200, kind=None, archive=None):
        self.model, self.limits, self.seed = model, limits, seed
        self.kind, self.archive = kind or registry.model(model).oracle, archive
        if self.kind not in PRODUCTIONS:
            raise ValueError(f"no request grammar for model {model!r} (kinds: {', '.join(PRODUCTIONS)})")
        own = PRODUCTIONS[self.kind](limits, seed, pool_size)
        self.good_body = own.good_body
        generic = [(self._generic(name, make, expect), 1.0) for name, make, expect in GENERIC]
        self.productions: list[tuple[Callable, float]] = own.weighted() + generic

    def _generic(self, name, make, expect):
        def production(rng):
            body, content_type = make(rng, self.good_body(rng))
            return body, content_type, expect

        production.__name__ = name.replace(" ", "_")
        return production

    def case(self, index):
        rng = random.Random(f"{self.seed}:{self.model}:{index}")
        if index < len(self.productions):  # the first cases walk every production once
            production = self.productions[index][0]
        else:
            production = rng.choices([p for p, _ in self.productions], [w for _, w in self.productions])[0]
        body, content_type, expect, *route = production(rng)  # a production for another route names its path
        case = Case(self.model, self.seed, index, production.__name__, body, content_type, expect, archive=self.archive)
        case.path = route[0] if route else ""
        case.oversize = len(body) > self.limits.max_request_size
        if case.oversize:
            case.expect = ERROR
        return case

    def cases(self, count):
        return [self.case(index) for index in range(count)]
