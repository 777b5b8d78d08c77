"""``handler.precision`` for the generator: bf16 decoding where the CPU computes bf16 natively, behind a gate on the
model's own greedy decoding.

What serves at bf16 (:func:`at_precision`): the model's weights, activations and key/value cache in bf16, except
its output layer, which keeps its fp32 weights and takes the last hidden state cast to fp32 (:class:`Fp32Head`).
The logits that sampling, log probabilities and structured outputs' masks read are then fp32 numbers computed in
fp32 (every decoding pass hands them on as fp32 anyway: decoding.model_step, mixed_pass.forward). A bf16 output
layer would round each logit to 8 significant bits: steps of 0.5 nats for logits around -100, as a trained GPT-2's
are, which makes ties of greedy choices and log probabilities off by as much.

Which precision serves (:class:`GeneratorEngine`, on the engine's walk, handlers/core/engine.py): ``fp32`` as asked;
``auto`` resolves to bf16 on a CPU with native bf16 (avx512_bf16 or amx_bf16; ``TS_CPU_AS`` masks them), else fp32;
``bf16`` asked on a CPU without native bf16 is refused with that reason (emulated bf16 is slower than fp32). A bf16
candidate must pass the engine's cosine gate on next-token logits and then :func:`decoding_gate`: the gate prompts
(:mod:`handlers.generation.gate`: three prompts decoded together and one alone, :data:`GATE_TOKENS` tokens each)
decoded greedily by the fp32 model and by the candidate must give the same tokens, and the log probability of every
chosen token must be within :data:`MAX_LOGPROB_DIFFERENCE` of fp32's. A refused candidate leaves fp32 serving, with
the gate's figures in the refusal; ``describe`` shows the precision served, why, and the gate's figures.

A model whose next-token distribution is nearly flat (random weights, as the demo's and the measurement model's)
may fail the gate: its greedy choices hang on differences smaller than bf16's rounding. That is the gate doing its
job, not a reason to loosen it: such a model's bf16 answers would not be its fp32 answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core import runtime
from handlers.core.base import HandlerEngine
from handlers.core.config import ConfigError
from handlers.generation.decoding import Sequence
from handlers.generation.gate import GATE_TOKENS, greedy_sequences

logger = logging.getLogger(__name__)

# Largest |log probability difference| (nats) of a chosen gate token between the candidate and fp32: each chosen
# token's probability within about 10 % of fp32's (exp(0.1) = 1.105). Measured (docs/generation.md, "Precision"):
# bf16 costs the demo model 0.02, and 0.04 with its output layer scaled 3 times (peaked choices); the random 124 M
# model differs by 0.21 and in its tokens.
MAX_LOGPROB_DIFFERENCE = 0.1


class Fp32Head(torch.nn.Linear):
    """A reduced-precision model's output layer, kept in fp32: its input is cast to fp32, so the logits are computed
    (not only returned) in fp32."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight, self.bias)


def fp32_head(head: torch.nn.Linear) -> Fp32Head:
    """An :class:`Fp32Head` sharing ``head``'s fp32 weights (no copy)."""
    kept = Fp32Head(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
    kept.weight = head.weight
    kept.bias = head.bias
    return kept


def at_precision(fp32_model: Any, precision: str) -> Any:
    """The model to serve at ``precision``: the fp32 model itself, or a converted copy whose output layer (a Linear,
    as every transformers causal LM's) stays fp32 at a float precision (int8's dynamic quantization keeps fp32
    activations and is left as runtime.convert_model makes it)."""
    model: Any = runtime.convert_model(fp32_model, precision)  # a transformers model: set_output_embeddings
    if precision not in ("bf16", "fp16"):
        return model
    head = fp32_model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        model.set_output_embeddings(fp32_head(head))
    else:
        logger.warning("the model's output layer is %s, not a Linear: its logits are computed in %s",
                       type(head).__name__, precision)  # fmt: skip
    return model


@dataclass(frozen=True)
class GateFigures:
    """:func:`decoding_gate`'s comparison of a candidate's greedy decoding with fp32's."""

    precision: str
    rows: int  # gate rows decoded (prompts together, and one alone)
    tokens: int  # greedy tokens per row
    differing_rows: int  # rows whose tokens are not fp32's
    first_difference: tuple[int, int] | None  # (row, token) of the first token that differs; None: all equal
    max_logprob_difference: float  # over the chosen tokens before each row's first difference
    seconds: float  # both decodings
    threshold: float = MAX_LOGPROB_DIFFERENCE

    @property
    def passed(self) -> bool:
        return self.first_difference is None and self.max_logprob_difference <= self.threshold

    def summary(self) -> str:
        compared = f"{self.rows} gate rows x {self.tokens} greedy tokens"
        logprobs = f"max |logprob difference| of the chosen tokens {self.max_logprob_difference:.4f}"
        if self.first_difference is not None:
            row, token = self.first_difference
            return (
                f"greedy {self.precision} tokens differ from fp32's in {self.differing_rows} of {compared} (first "
                f"at token {token} of row {row}); {logprobs} before the difference (threshold {self.threshold:g})"
            )
        verdict = "within" if self.passed else "above"
        return f"greedy {self.precision} tokens equal fp32's on {compared}; {logprobs}, {verdict} the threshold " \
               f"{self.threshold:g}"  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "passed": self.passed,
            "rows": self.rows,
            "tokens": self.tokens,
            "differing_rows": self.differing_rows,
            "first_difference": None if self.first_difference is None else list(self.first_difference),
            "max_logprob_difference": round(self.max_logprob_difference, 6),
            "logprob_threshold": self.threshold,
            "seconds": round(self.seconds, 2),
        }


def compare(precision: str, reference: list[Sequence], got: list[Sequence], seconds: float) -> GateFigures:
    """The figures of ``got`` (the candidate's gate rows) against ``reference`` (fp32's)."""
    first: tuple[int, int] | None = None
    differing, largest = 0, 0.0
    for row, (want, have) in enumerate(zip(reference, got, strict=True)):
        pairs = list(zip(want.token_ids, have.token_ids, strict=True))
        equal = next((index for index, (a, b) in enumerate(pairs) if a != b), len(pairs))
        if equal < len(pairs):
            differing += 1
            first = first or (row, equal)
        for index in range(equal):
            largest = max(largest, abs(want.logprobs[index].logprob - have.logprobs[index].logprob))
    return GateFigures(precision, len(reference), GATE_TOKENS, differing, first, largest, seconds)


def decoding_gate(
    fp32_model: Any,
    candidate: Any,
    pad_token_id: int,
    precision: str,
    reference: list[Sequence] | None = None,
    paged: Any = None,
) -> GateFigures:
    """Greedy decoding of the gate prompts by ``candidate`` (or by the paged step ``paged``,
    :class:`handlers.generation.paged_openvino.PagedModel`) against ``fp32_model`` (``reference``: fp32's gate rows,
    when already decoded)."""
    started = time.perf_counter()
    if reference is None:
        reference = greedy_sequences(fp32_model, pad_token_id, logprobs=True)
    got = greedy_sequences(candidate, pad_token_id, logprobs=True, paged=paged)
    return compare(precision, reference, got, time.perf_counter() - started)


class GeneratorEngine(HandlerEngine):
    """The generator's engine: its candidates at a reduced precision keep an fp32 output layer, are refused on a CPU
    that does not compute them natively, and are gated on greedy decoding (:func:`decoding_gate`)."""

    gate: GateFigures | None = None  # the last candidate's decoding gate (None: only fp32 was tried)
    fp32_rows: list[Sequence] | None = None  # fp32's gate rows, decoded once per load
    decode_step: Any = None  # handler.decode_step's outcome (paged_openvino.BackendOutcome), chosen in the walk

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: Any) -> Any:
        if backend != "eager":
            raise ConfigError(f"handler.backend: {self.family_name()} cannot serve {backend!r}")
        reason = runtime.machine_can_run(precision, self.device)
        if reason:
            raise runtime.BackendUnavailable(reason)
        return at_precision(fp32_model, precision)

    def output_gate(self, fp32_model: torch.nn.Module, model: Any, loaded: Any, precision: str) -> str | None:
        pad = loaded.pad_token_id
        if self.fp32_rows is None:
            self.fp32_rows = greedy_sequences(fp32_model, pad, logprobs=True)
        self.gate = decoding_gate(fp32_model, model, pad, precision, self.fp32_rows)
        logger.info("decoding gate for %s: %s (%.1f s)", precision, self.gate.summary(), self.gate.seconds)
        return None if self.gate.passed else self.gate.summary()

    def select_backend(self, fp32_model: torch.nn.Module, loaded: Any, reference: Any) -> Any:
        """The eager walk, then (while the fp32 model is at hand: the paged step converts and is gated from it) the
        decoding step (``handler.decode_step``, :meth:`handlers.generator.GeneratorHandler.choose_decode_step`)."""
        choice = super().select_backend(fp32_model, loaded, reference)
        handler: Any = self.handler  # a GeneratorHandler
        with self.load_phases.phase("decode_step"):
            self.decode_step = handler.choose_decode_step(fp32_model, loaded, self.paged_gate(fp32_model, loaded))
        return choice

    def paged_gate(self, fp32_model: torch.nn.Module, loaded: Any) -> Callable[[Any, str], GateFigures]:
        """The decoding gate of a paged step against fp32's gate rows (decoded once per load)."""

        def gate(paged: Any, precision: str) -> GateFigures:
            if self.fp32_rows is None:
                self.fp32_rows = greedy_sequences(fp32_model, loaded.pad_token_id, logprobs=True)
            figures = decoding_gate(fp32_model, fp32_model, loaded.pad_token_id, precision, self.fp32_rows, paged)
            logger.info("decoding gate for the %s paged step: %s", precision, figures.summary())
            return figures

        return gate

    def precision_reason(self) -> str:
        """Why the served precision serves, in words."""
        gate = self.gate
        if gate is not None and gate.passed and self.precision == gate.precision:
            return f"{self.precision} passed the decoding gate: {gate.summary()}"
        if self.backend_fallbacks:
            refused = self.backend_fallbacks[0]
            return f"{refused['precision']} refused: {refused['reason']}"
        requested = self.config["precision"]
        if requested == "auto" and self.device.type == "cpu":  # resolved to fp32: no native bf16
            why = runtime.machine_can_run("bf16", self.device)
            return f"handler.precision auto resolves to {self.precision} on this {runtime.cpu_kind()} CPU: {why}"
        return f"handler.precision is {requested}"

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "precision_reason": self.precision_reason(),
            "precision_gate": self.gate.describe() if self.gate is not None else None,
        }
