"""``handler.decode_attention``: a decoding step's attention over the padded batch, or over each row's own columns.

``padded`` is transformers' ``sdpa`` over every column of the running batch's cache, padding masked out.
``per_row`` computes a decoding step's attention (and a mixed pass's running rows') in segments of rows, each over
its own columns only (:mod:`handlers.generation.row_attention`, through :data:`mixed_pass.MIXED_PER_ROW`); prefill
and prompt chunks stay ``sdpa``. It pays when rows of very different lengths decode together (a long prompt beside
short ones) and changes nothing in a batch of equal lengths.

At load (:func:`select`), ``per_row`` and ``auto`` first check that greedy fp32 decoding gives exactly the padded
path's tokens: rows of very different lengths together (the long one leaving first, so its columns are dropped
while the others go on) and one row alone; a model that fails the check, or whose attention is not ``sdpa`` through
transformers' interface, stays padded with the reason logged and shown by describe. ``auto`` then times decoding
steps of ``batchSize`` rows, one long prompt among short ones, alternately both ways on the same batch, and keeps
``per_row`` only if its steps are faster. The figures behind the shipped default are in docs/generation.md.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from handlers.generation import mixed_pass

logger = logging.getLogger(__name__)

SETTINGS = ("auto", "per_row", "padded")
# The check's rows: a long prompt (its length: LONG_TOKENS, or the longest the model accepts) decoding 3 tokens
# beside short prompts decoding longer, so it leaves first and its columns are dropped while they go on.
SHORT_PROMPTS = ([15496, 995], [464, 2068, 7586, 21831], [7454, 2402, 257, 640, 612, 373, 257, 1402, 2746])
SHORT_TOKENS = (12, 9, 6)
LONG_TOKENS = 96
LONG_NEW_TOKENS = 3
TIMED_STEPS = 5  # auto: steps timed each way


@dataclass
class AttentionOutcome:
    """What load made of ``handler.decode_attention`` (describe shows it)."""

    setting: str
    per_row: bool
    reason: str
    seconds: float = 0.0  # load time spent checking and timing

    def describe(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "per_row": self.per_row,
            "reason": self.reason,
            "seconds": round(self.seconds, 1),
        }


def long_prompt(vocab: int, tokens: int) -> list[int]:
    return [(7 * index + 3) % vocab for index in range(tokens)]


def greedy_tokens(model: Any, pad_token_id: int, long_tokens: int) -> list[list[int]]:
    """Greedy tokens of a long prompt and :data:`SHORT_PROMPTS` decoded together, then of the first short prompt
    alone."""
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import generate

    vocab = int(model.config.vocab_size)
    prompts = [long_prompt(vocab, long_tokens)] + [[token % vocab for token in prompt] for prompt in SHORT_PROMPTS]
    lengths = (LONG_NEW_TOKENS, *SHORT_TOKENS)
    together = [
        Sequence(prompt, SamplingSettings(max_new_tokens=n)) for prompt, n in zip(prompts, lengths, strict=True)
    ]
    alone = [Sequence(list(prompts[1]), SamplingSettings(max_new_tokens=SHORT_TOKENS[0]))]
    with torch.inference_mode():
        generate(model, together, (), pad_token_id)
        generate(model, alone, (), pad_token_id)
    return [sequence.token_ids[len(sequence.prompt_ids) :] for sequence in together + alone]


def mixed_lengths_batch(model: Any, pad_token_id: int, rows: int, long_tokens: int) -> Any:
    """A running batch of ``rows`` rows: one ``long_tokens``-token prompt, the others a short one (a row each)."""
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import RunningBatch

    vocab = int(model.config.vocab_size)
    short = [token % vocab for token in SHORT_PROMPTS[2]]
    batch = RunningBatch(model, pad_token_id, [])
    with torch.inference_mode():
        batch.prefill([Sequence(long_prompt(vocab, long_tokens), SamplingSettings(max_new_tokens=10_000))])
        if rows > 1:
            batch.prefill([Sequence(list(short), SamplingSettings(max_new_tokens=10_000)) for _ in range(rows - 1)])
    return batch


def paired_steps(model: Any, batch: Any, steps: int) -> tuple[float, float]:
    """Median seconds of a step of ``batch``, (padded, per row), the two taken alternately on the same batch so that
    the machine's drift hits both; the model is left per row."""
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        for _ in range(steps):
            for per_row in (False, True):
                mixed_pass.use_per_row(model, per_row)
                started = time.perf_counter()
                batch.step()
                times[per_row].append(time.perf_counter() - started)
    return statistics.median(times[False]), statistics.median(times[True])


def check(model: Any, pad_token_id: int, long_tokens: int, previous: str) -> str | None:
    """Why ``model`` cannot decode per row (its attention is not ``sdpa``, or greedy fp32 tokens differ from the
    padded path's); None when it can, the model then left per row."""
    if not mixed_pass.use_per_row(model, True):
        return f"the model's attention ({previous}) is not sdpa through transformers' attention interface"
    mixed_pass.switch(model, previous)
    expected = greedy_tokens(model, pad_token_id, long_tokens)
    mixed_pass.use_per_row(model, True)
    got = greedy_tokens(model, pad_token_id, long_tokens)
    if got != expected:
        differing = sum(a != b for a, b in zip(got, expected, strict=True))
        return f"greedy fp32 tokens differ from the padded path's on {differing} of {len(expected)} rows"
    return None


def select(model: Any, setting: str, pad_token_id: int, max_rows: int, max_prompt_tokens: int) -> AttentionOutcome:
    """Apply ``handler.decode_attention`` to ``model`` (see the module's docstring); never raises for a model that
    cannot take it: it stays padded and the outcome says why."""
    if setting == "padded":
        if mixed_pass.uses_per_row(model):
            mixed_pass.use_per_row(model, False)
        return AttentionOutcome(setting, False, "handler.decode_attention is padded")
    started = time.perf_counter()
    previous = str(getattr(model.config, "_attn_implementation", None))
    if previous == mixed_pass.MIXED_PER_ROW:  # set before (a model loaded again): padded is sdpa's form of it
        previous = mixed_pass.MIXED

    def padded(reason: str) -> AttentionOutcome:
        if mixed_pass.uses_per_row(model):  # back to what it was (sdpa outside mixed passes)
            mixed_pass.switch(model, previous)
        logger.warning("decode_attention %s: decoding attention stays padded: %s", setting, reason)
        return AttentionOutcome(setting, False, reason, time.perf_counter() - started)

    if setting == "auto" and max_rows < 2:
        return padded("batchSize 1: a lone row has no padding to skip")
    failed = check(model, pad_token_id, min(LONG_TOKENS, max_prompt_tokens), previous)
    if failed:
        return padded(failed)
    reason = "greedy fp32 tokens equal to the padded path's"
    if setting == "auto":
        long_tokens = min(2 * LONG_TOKENS, max_prompt_tokens)
        batch = mixed_lengths_batch(model, pad_token_id, max_rows, long_tokens)
        padded_s, per_row_s = paired_steps(model, batch, TIMED_STEPS)
        shown = f"{max_rows} rows, one {long_tokens}-token prompt: {padded_s * 1000:.1f} -> {per_row_s * 1000:.1f} ms"
        if per_row_s >= padded_s:
            return padded(f"per-row steps are not faster ({shown})")
        reason += f"; steps {shown}"
    outcome = AttentionOutcome(setting, True, reason, time.perf_counter() - started)
    logger.info("decode_attention %s: per row (%s; %.1f s)", setting, reason, outcome.seconds)
    return outcome
