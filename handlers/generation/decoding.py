"""Token-by-token generation for a batch of prompts with a Hugging Face causal LM, reusing the key/value cache.

The pieces, each usable without a server:

- :class:`SamplingSettings` / :class:`Sequence`: what one request asked for and what it has produced so far.
- :func:`left_pad`: prompts of different lengths as one batch (left padding, attention mask, position ids), so that
  every row's next token is at the last column.
- :func:`choose_token`: greedy or seeded temperature/top-k/top-p sampling for one row, with that request's own
  generator, so a request's tokens never depend on its batch-mates.
- :func:`recompute`: a whole batch decoded to its end without a cache, every step running each row's whole prefix
  again (the reference the tests and the benchmark compare against; the cached path,
  :func:`handlers.generation.running.generate`, builds on these pieces, so it lives above them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.generation.logprobs import TokenLogprob, token_logprob

FINISH_STOP = "stop"  # the model produced its end-of-text token
FINISH_LENGTH = "length"  # max_new_tokens reached
FINISH_ERROR = "error"  # this sequence alone could not continue (see Sequence.error); the others go on


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy (argmax); otherwise logits are divided by it before sampling
    top_k: int = 0  # 0 = sample from the whole vocabulary
    seed: int = 0  # seeds this request's own generator (unused when greedy)
    top_p: float = 1.0  # nucleus: sample from the most likely tokens that together hold this probability (1 = all)
    # None: no log probabilities (the row pays nothing for them); k: each token's logprob and its k likeliest
    # alternatives' (handlers/generation/logprobs.py)
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class ConstraintFailed(ValueError):
    """A row's output grammar can take no token (handlers.generation.structured): that row alone stops with it.
    ``status`` 400 when the request's own grammar caused it (its schema outgrew the grammar engine's limits while
    decoding), 500 when it should not have happened."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class TokenConstraint(Protocol):
    """What decoding asks of a constrained row (handlers.generation.structured.Constraint)."""

    def mask(self, logits: torch.Tensor, stop_token_ids: frozenset[int]) -> torch.Tensor: ...

    def advance(self, token: int, more: bool) -> bool: ...


@dataclass(eq=False)  # a sequence is one request's state: equal only to itself (and usable as a dict key)
class Sequence:
    """One request's generation state; decoding appends to ``token_ids`` and sets ``finish_reason``."""

    prompt_ids: list[int]
    settings: SamplingSettings
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # why it stopped when finish_reason is FINISH_ERROR
    error_status: int = 500  # 400: the request's own doing (its grammar), answered as a client error
    constraint: TokenConstraint | None = None  # its output grammar (response_format); None: free text
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when settings.logprobs is set
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a prompt needs at least one token")
        # Sampling runs on the CPU with a per-request generator: same seed -> same tokens on any device, any batch.
        self.generator = torch.Generator(device="cpu").manual_seed(self.settings.seed)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def stop(self) -> None:
        """Finish now with FINISH_STOP (a stop sequence appeared in the text): called from an ``on_step`` callback,
        it makes the sequence leave the batch before the next step, whatever the length check decided."""
        self.finish_reason = FINISH_STOP


def left_pad(
    token_lists: list[list[int]], pad_token_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch of token lists -> (input_ids, attention_mask, position_ids), padded on the left.

    Left padding puts every row's last real token in the last column, where the next-token logits are read. Position
    ids count real tokens only, so a padded row sees the same positions as it would alone.
    """
    width = max(len(tokens) for tokens in token_lists)
    input_ids = torch.full((len(token_lists), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        input_ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
        attention_mask[row, width - len(tokens) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


class NonFiniteLogits(ValueError):
    """The model's logits for one row hold NaN or no finite value: no token can be chosen from them."""


def choose_token(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator) -> int:
    """Next token for one row from its fp32 CPU logits: argmax, or a seeded draw after temperature, top-k and top-p.

    Any temperature in (0, max] is safe, however small: the logits are shifted so that their largest is 0 and divided
    in float64, so the best token keeps probability weight 1 and a tiny temperature degenerates to argmax instead of
    dividing into inf - inf = NaN. ``top_p`` < 1 keeps the most likely tokens whose probabilities (after temperature
    and top-k) add up to at least ``top_p``, and always the most likely one (``top_p`` 0 is greedy's token); at 1 the
    draw is exactly the one without it. Only logits the model itself got wrong raise, and only for this row."""
    top = logits.max()
    if torch.isnan(logits).any() or not torch.isfinite(top):
        raise NonFiniteLogits("the model produced non-finite logits")
    if settings.greedy:
        return int(torch.argmax(logits))
    scaled = (logits.double() - top.double()) / settings.temperature
    if 0 < settings.top_k < scaled.numel():
        kth_largest = torch.topk(scaled, settings.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    probabilities = torch.softmax(scaled, dim=-1)
    if settings.top_p < 1:
        probabilities = nucleus(probabilities, settings.top_p)
    return draw(probabilities, generator)


def draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn with probability proportional to ``weights`` (float64, >= 0): the first whose cumulative weight
    exceeds a uniform point of the request's generator. A zero weight is never drawn. (torch.multinomial draws the
    same way but takes about a millisecond on a 50k-token vocabulary, a step's worth at 16 rows; this, microseconds.)"""
    cumulative = weights.cumsum(0)
    point = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    return min(int(torch.searchsorted(cumulative, point, right=True)[0]), weights.numel() - 1)


NUCLEUS_CANDIDATES = 256  # most likely tokens ranked first; the whole vocabulary only when they hold less than top_p


def nucleus(probabilities: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probabilities`` with every token outside the top-p nucleus set to 0 (the draw renormalises)."""
    candidates = min(probabilities.numel(), NUCLEUS_CANDIDATES)
    ordered, order = torch.topk(probabilities, candidates)  # in descending order
    if candidates < probabilities.numel() and float(ordered.sum()) < top_p:
        ordered, order = torch.sort(probabilities, descending=True, stable=True)
    mass_before = ordered.cumsum(0) - ordered  # probability of the tokens more likely than each one
    inside = mass_before < top_p
    inside[0] = True  # the most likely token always stays
    kept = order[inside]
    return torch.zeros_like(probabilities).index_copy(0, kept, probabilities[kept])


def model_step(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
) -> tuple[torch.Tensor, Any]:
    """One forward pass; returns (fp32 CPU logits of the last column, the updated cache or None).

    Only the last column's logits are wanted: a model that can skip the others (``logits_to_keep``, most causal LMs
    of transformers) is asked to, which spares a prefill its output layer over every prompt token (for GPT-2 small,
    50,257 x 768 multiply-adds per token: as much as a third of the model)."""
    extra = {"logits_to_keep": 1} if keeps_last_logits(model) else {}
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=cache is not None,
        **extra,
    )
    logits = output.logits[:, -1, :].float().cpu()
    return logits, getattr(output, "cache", None) if cache is not None else None


def keeps_last_logits(model: Any) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (asked once per model class)."""
    forward = getattr(model, "forward", None)
    kind = type(model)
    if kind not in _KEEPS_LAST_LOGITS:
        try:
            _KEEPS_LAST_LOGITS[kind] = "logits_to_keep" in inspect.signature(forward).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):
            _KEEPS_LAST_LOGITS[kind] = False
    return _KEEPS_LAST_LOGITS[kind]


_KEEPS_LAST_LOGITS: dict[type, bool] = {}


# on_step(new_tokens) is called after every step with {sequence index: token id} for the rows decoded in that step;
# it may finish a sequence (Sequence.stop(): a stop sequence in its text), which leaves the batch before the next step.
StepCallback = Callable[[dict[int, int]], None]


def recompute(
    model: Any,
    sequences: list[Sequence],
    stop_token_ids: frozenset[int],
    pad_token_id: int,
    on_step: StepCallback | None,
) -> list[Sequence]:
    """:func:`handlers.generation.running.generate` without a cache: every step runs each row's whole prefix again
    (the reference)."""
    device = next(model.parameters()).device
    while True:
        rows = [sequence for sequence in sequences if not sequence.finished]
        if not rows:
            return sequences
        input_ids, attention_mask, position_ids = left_pad(
            [sequence.prompt_ids + sequence.token_ids for sequence in rows], pad_token_id, device
        )
        logits, _ = model_step(model, input_ids, attention_mask, position_ids, None)
        new_tokens = append_tokens(logits, rows, stop_token_ids)
        if on_step is not None:
            position = {sequence: index for index, sequence in enumerate(sequences)}
            on_step({position[sequence]: token for sequence, token in new_tokens.items()})


def append_tokens(logits: torch.Tensor, rows: list[Sequence], stop_token_ids: frozenset[int]) -> dict[Sequence, int]:
    """Choose each row's next token and append it to its sequence, finishing the sequences that stop; returns
    {sequence: token id} for the rows that got one (a row whose logits are unusable finishes with an error)."""
    new_tokens: dict[Sequence, int] = {}
    for row, sequence in enumerate(rows):
        constraint = sequence.constraint  # only a constrained row pays for its grammar
        try:
            row_logits = logits[row] if constraint is None else constraint.mask(logits[row], stop_token_ids)
            token = choose_token(row_logits, sequence.settings, sequence.generator)
        except (NonFiniteLogits, ConstraintFailed) as error:  # this row stops with its own error; the others go on
            sequence.finish_reason, sequence.error = FINISH_ERROR, str(error)
            sequence.error_status = getattr(error, "status", 500)
            continue
        sequence.token_ids.append(token)
        if sequence.settings.logprobs is not None:
            sequence.logprobs.append(token_logprob(logits[row], token, sequence.settings.logprobs))
        new_tokens[sequence] = token
        more = len(sequence.token_ids) < sequence.settings.max_new_tokens
        if token in stop_token_ids:
            sequence.finish_reason = FINISH_STOP
        elif constraint is not None and grammar_complete(sequence, constraint, token, more):
            sequence.finish_reason = FINISH_STOP  # the document is complete: nothing but its end could follow
        elif not more and not sequence.finished:  # (a grammar error finished it already)
            sequence.finish_reason = FINISH_LENGTH
    return new_tokens


def grammar_complete(sequence: Sequence, constraint: TokenConstraint, token: int, more: bool) -> bool:
    """Advance a constrained row's grammar by its new token; whether the grammar is complete. A grammar that
    refuses the token (it allowed it: a library bug) stops that row with an error."""
    try:
        return constraint.advance(token, more)
    except ConstraintFailed as error:
        sequence.finish_reason, sequence.error = FINISH_ERROR, str(error)
        sequence.error_status = error.status
        return False


def stop_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """The end-of-text token id(s): the generation config's (one id or a list), else the tokenizer's; may be none."""
    stop = getattr(generation_config, "eos_token_id", None)
    if stop is None:
        stop = tokenizer.eos_token_id
    if stop is None:
        return []
    return sorted(set(stop)) if isinstance(stop, (list, tuple)) else [stop]


def distinct_prompts(sequences: list[Sequence]) -> tuple[list[Sequence], list[int]]:
    """(the first sequence of each distinct prompt, for each sequence the position of its prompt among those)."""
    first: dict[tuple[int, ...], int] = {}
    source = [first.setdefault(tuple(sequence.prompt_ids), len(first)) for sequence in sequences]
    computing = [sequences[source.index(position)] for position in range(len(first))]
    return computing, source
