"""``handler.compile_decode``: the decoding passes' token-wise work compiled by torch.compile, behind a gate.

What is compiled is each decoder layer's MLP (the submodules named ``mlp``: GPT-2, Llama, Qwen, Mistral, Phi ...),
the largest token-wise part of a step, not the whole forward: the forward also runs the key/value cache's bookkeeping
(rows joining and leaving, buffers growing in place: :mod:`handlers.generation.kv_cache`) and the mixed pass's
per-part attention (:mod:`handlers.generation.mixed_pass`), Python that changes shape every step and would break the
graph or recompile. An MLP sees its tokens flattened to ``[tokens, hidden]`` and is compiled with dynamic shapes, so
one graph serves every batch size and chunk width (two, as torch specialises a size of 1: a lone row's step, and the
rest); :func:`compile_counts` says how many it made.

At load (:func:`compile_decode`): ``false`` keeps the model eager; ``true`` and ``auto`` compile, then greedy fp32
decoding of a few prompts, batched and one row alone, must give exactly the tokens the eager model gives, or the
model is put back to eager with the reason logged and shown by describe. ``auto`` also times a decoding step of one
row and of a full batch, eager against compiled, and keeps the compiled MLPs only when both are faster. The figures
behind the shipped default (off) are in docs/generation.md.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.config import Option
from handlers.generation.gate import gate_prompts, greedy_tokens

logger = logging.getLogger(__name__)

SETTINGS = ("auto", "true", "false")
BACKEND = "inductor"  # what torch.compile uses; tests swap in a cheaper one


class CompileOption(Option):
    """``auto``, ``true`` or ``false``, as a string; YAML's booleans (an unquoted true/false) are taken as those."""

    def check(self, key: str, value: Any) -> Any:
        if isinstance(value, bool):
            value = str(value).lower()
        return super().check(key, value)


@dataclass
class CompileOutcome:
    """What load made of ``handler.compile_decode`` (describe shows it)."""

    setting: str
    compiled: bool
    reason: str
    graphs: int = 0  # graphs torch.compile made (the gate's and the timing's passes)
    seconds: float = 0.0  # load time spent compiling, gating and timing

    def describe(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "compiled": self.compiled,
            "reason": self.reason,
            "graphs": self.graphs,
            "seconds": round(self.seconds, 1),
        }


class FlatMLP(torch.nn.Module):
    """An MLP run by a compiled function on its tokens flattened to ``[tokens, hidden]``: the batch's layout
    (rows x columns, or a mixed pass's one long row) then never makes a graph of its own."""

    def __init__(self, mlp: torch.nn.Module, compiled: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.eager = mlp
        self.compiled = compiled

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = self.compiled(self.eager, hidden.reshape(-1, hidden.shape[-1]))
        return flat.reshape(*hidden.shape[:-1], flat.shape[-1])


def run_module(module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return module(hidden)


def mlp_parents(model: Any) -> list[torch.nn.Module]:
    """The modules that hold an ``mlp`` submodule (one per decoder layer)."""
    return [module for module in model.modules() if isinstance(getattr(module, "mlp", None), torch.nn.Module)]


def install(model: Any) -> int:
    """Replace every layer's MLP by a :class:`FlatMLP` sharing one compiled function; returns how many."""
    compiled = torch.compile(run_module, dynamic=True, backend=BACKEND)
    parents = [parent for parent in mlp_parents(model) if not isinstance(parent.mlp, FlatMLP)]
    for parent in parents:
        mlp = parent.mlp
        assert isinstance(mlp, torch.nn.Module)  # mlp_parents' condition
        parent.mlp = FlatMLP(mlp, compiled)
    return len(parents)


def uninstall(model: Any) -> None:
    """Put the eager MLPs back."""
    for parent in mlp_parents(model):
        if isinstance(parent.mlp, FlatMLP):
            parent.mlp = parent.mlp.eager


def compile_counts() -> int:
    """Graphs torch.compile has made in this process (dynamo's unique graphs)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def step_seconds(model: Any, pad_token_id: int, rows: int, repeats: int = 5) -> float:
    """Median seconds of a decoding step of ``rows`` rows about 64 columns wide."""
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import RunningBatch

    batch = RunningBatch(model, pad_token_id, [])
    prompt = gate_prompts(model)[2]
    times = []
    with torch.inference_mode():
        batch.prefill([Sequence(list(prompt), SamplingSettings(max_new_tokens=1000)) for _ in range(rows)])
        while batch.width < 64:
            batch.step()
        for _ in range(repeats):
            started = time.perf_counter()
            batch.step()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def compile_decode(model: Any, setting: str, pad_token_id: int, max_rows: int) -> CompileOutcome:
    """Apply ``handler.compile_decode`` to ``model`` (see the module's docstring); never raises for a model that
    cannot be compiled: it stays eager and the outcome says why."""
    if setting == "false":
        return CompileOutcome(setting, False, "handler.compile_decode is false")
    started, graphs_before = time.perf_counter(), compile_counts()

    def eager(reason: str) -> CompileOutcome:
        uninstall(model)
        logger.warning("compile_decode %s: decoding stays eager: %s", setting, reason)
        return CompileOutcome(setting, False, reason, compile_counts() - graphs_before, time.perf_counter() - started)

    expected = greedy_tokens(model, pad_token_id)
    if not install(model):
        return eager("the model has no 'mlp' submodules to compile")
    try:
        got = greedy_tokens(model, pad_token_id)
    except Exception as error:  # a compiler that fails here (no C++ compiler, an unsupported op) leaves it eager
        return eager(f"torch.compile failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    if got != expected:
        differing = sum(a != b for a, b in zip(got, expected, strict=True))
        return eager(f"greedy fp32 tokens differ from eager on {differing} of {len(expected)} gate prompts")
    reason = "greedy fp32 tokens equal to eager on the gate prompts"
    if setting == "auto":
        timings = {}
        for rows in sorted({1, max_rows}):
            compiled_s = step_seconds(model, pad_token_id, rows)
            uninstall(model)
            eager_s = step_seconds(model, pad_token_id, rows)
            install(model)
            timings[rows] = (eager_s, compiled_s)
        shown = ", ".join(f"{rows} row(s) {e * 1000:.1f} -> {c * 1000:.1f} ms" for rows, (e, c) in timings.items())
        if any(compiled_s >= eager_s for eager_s, compiled_s in timings.values()):
            return eager(f"compiled steps are not faster ({shown})")
        reason += f"; steps {shown}"
    outcome = CompileOutcome(setting, True, reason, compile_counts() - graphs_before, time.perf_counter() - started)
    logger.info("compile_decode %s: MLPs compiled (%s; %d graphs, %.0f s)", setting, reason, outcome.graphs,
                outcome.seconds)  # fmt: skip
    return outcome
