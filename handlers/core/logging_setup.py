"""Worker-side logging rules: a client's bad body costs at most one log line, never a traceback.

TorchServe's Python worker decodes each body itself before our handler sees it (ts/protocol/otf_message_handler.py,
`_retrieve_input_data`): for a JSON content type it calls json.loads, for text/* it decodes UTF-8, and when that fails
it logs a warning *with the traceback* through the root logger and forwards the raw bytes. Our handlers then answer
that request with a 400 naming the problem, so the traceback says nothing new, yet at ~15 lines (~1.5 KB in
model_log.log) per malformed body it let any client fill the disk. `install()` (called once when the handler base is
imported) keeps the warning as a single line with the decoder's own message. Every other record, including the
tracebacks of real server errors, is left alone.

It also drops the wall-clock stamp TorchServe's protocol module logs for every batch a worker receives ("Backend
received inference at: <seconds>"): a stdout write in the worker and a line the frontend reads, only for
config/log4j2.xml to discard it (docs/performance.md, "Where a served request's time goes").
"""

from __future__ import annotations

import logging

# The messages TorchServe 0.12 logs (with exc_info) when a body does not decode; the client's fault by construction.
CLIENT_DECODE_WARNINGS = (
    "Failed json decoding of input data",
    "Failed utf-8 decoding of input data",
)
# Long enough for the decoder's position information, short enough that a huge bad body cannot make a long line.
MAX_DETAIL_CHARS = 200


class OneLineClientDecodeErrors(logging.Filter):
    """Rewrites TorchServe's body-decoding warnings to one line without a traceback; passes every record on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.msg, str) and record.msg.startswith(CLIENT_DECODE_WARNINGS):
            error = record.exc_info[1]
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:MAX_DETAIL_CHARS]
            record.msg = f"{record.getMessage().split('.')[0]} ({detail}); the handler answers this request with a 4xx"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


# What TorchServe 0.12's worker logs through the root logger for every batch it receives (ts/protocol).
PER_BATCH_STAMP = "Backend received inference at:"


class DropPerBatchStamp(logging.Filter):
    """Drops the per-batch receive stamp; passes every other record on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(PER_BATCH_STAMP))


def install(logger: logging.Logger | None = None) -> logging.Logger:
    """Attach the filters to the root logger (where TorchServe's protocol module logs), once per process."""
    target = logger or logging.getLogger()
    for kind in (OneLineClientDecodeErrors, DropPerBatchStamp):
        if not any(isinstance(existing, kind) for existing in target.filters):
            target.addFilter(kind())
    return target
