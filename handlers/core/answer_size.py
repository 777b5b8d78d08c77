"""How large one answer may be, and the refusal of a request whose answer would be larger.

TorchServe 0.12's frontend reads a worker's message with ``ModelResponseDecoder``, which checks every length field of
it (each request's body among them) against the server's ``max_response_size``; one body over it raises
``TooLongFrameException``, the frontend drops the worker's connection, every request of that batch gets 500 "Worker
died" and the worker restarts. The check is per body, not per message: a batch whose answers together are larger is
delivered (tests/integration/test_answer_size.py sends one).

The worker is not told ``max_response_size``: the project's server start (scripts/ops/server.py) exports the value its
properties file says as ``TS_MAX_RESPONSE_SIZE``, TorchServe's own environment name for that key, and every worker
inherits the frontend's environment. Without it, TorchServe's default applies.
"""

from __future__ import annotations

import os

from handlers.core.errors import RequestError

LIMIT_ENV = "TS_MAX_RESPONSE_SIZE"
TORCHSERVE_DEFAULT = 6_553_500  # bytes: TorchServe's own default for max_response_size
# Bytes kept free below the limit: the body is checked as UTF-8 bytes, exactly as TorchServe frames it, so this only
# covers a header or content type a later version might count with it.
MARGIN = 4096

# Worst case of one float32 in a JSON answer: the shortest text that reads back as the float32 is at most 14
# characters ("-1.1754944e-38"), and a comma follows it.
JSON_FLOAT_BYTES = 15


def frame_limit() -> int:
    """The largest response body (bytes) the frontend accepts from this worker: max_response_size less the margin."""
    raw = os.environ.get(LIMIT_ENV, "").strip()
    try:
        size = int(raw) if raw else TORCHSERVE_DEFAULT
    except ValueError:
        size = TORCHSERVE_DEFAULT
    return max(size - MARGIN, 1)


def base64_bytes(raw_bytes: int) -> int:
    """Characters of ``raw_bytes`` bytes in base64 (padded)."""
    return 4 * ((raw_bytes + 2) // 3)


DEFAULT_FIT = "send fewer or shorter inputs"


def answer_too_large(size: int, limit: int, fit: str | None = None, estimated: bool = False) -> RequestError:
    """The 413 for a request whose answer (``size`` bytes, or at most that when ``estimated`` before computing) is
    over ``limit``; ``fit`` says how to make it fit (fewer inputs, a compact encoding the route offers)."""
    what = f"may reach {size} bytes" if estimated else f"is {size} bytes"
    return RequestError(
        f"the answer to this request {what}, more than the {limit} bytes one answer may have (the server's "
        f"max_response_size less {MARGIN} bytes); {fit or DEFAULT_FIT}",
        code=413,
        error_type="AnswerTooLarge",
    )
