"""What every model family does at load, with no TorchServe in it: choose the device and threads, load the fp32 model,
walk the backend candidates (each checked against fp32 by the accuracy gate, refusals kept with their reason), warm
up what serves. A TorchServe handler owns an engine (handlers/core/base.py turns its context into
:class:`EngineSettings`); the similarity cache, benchmarks and tools load one directly.

A family supplies its model-specific parts by overriding:

- ``load_model(model_dir)``: what it loads, as a :class:`Loaded` object (the fp32 model in eval mode, plus e.g. its
  tokenizer and limits),
- ``reference_batch(loaded)`` and ``warmup_batches(loaded)``: fixed inputs for the accuracy gate and for warm-up,
- ``forward(model, batch)``: one forward pass returning a tensor (used by the gate, warm-up and computing),
- where it has more backends than eager/jit, ``backend_candidates`` and ``load_backend``,
- where one forward pass's cosine similarity says too little about what it serves, ``output_gate`` (a further check
  of each reduced-precision or compiled candidate).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core import identity, runtime
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option, validate
from handlers.core.load_phases import LoadPhases

logger = logging.getLogger(__name__)

GATE_REFUSAL = "accuracy gate:"  # how a refusal by the accuracy gate starts (gate_rejected is read from it)


@dataclass
class Loaded:
    """What ``load_model`` returns; a family's own subclass adds what else it loaded (tokenizer, limits, ...).

    After load, ``model`` is the served model (converted, compiled), not the fp32 one."""

    model: Any  # a torch.nn.Module, or the callable torch.compile / AOTInductor / OpenVINO made of it


@dataclass(frozen=True)
class Candidate:
    """A (backend, precision) the backend walk may serve, and why it is on the list."""

    backend: str
    precision: str
    why: str  # e.g. "configured", "rank 1 in backends/manifest.json": shown as backend_reason when it serves


@dataclass(frozen=True)
class BackendChoice:
    """The backend walk's outcome: what serves, how close it is to fp32, and what was refused before it."""

    model: Any
    backend: str
    precision: str
    min_cosine: float  # smallest cosine similarity of its outputs to fp32 eager's on the reference batch
    reason: str  # why this candidate serves
    fallbacks: list[dict[str, str]]  # {backend, precision, reason} tried and refused at load, in order


@dataclass(frozen=True)
class EngineSettings:
    """Where a model is and how to load it: what a TorchServe worker reads from its context, or a caller says."""

    model_dir: str
    handler_config: Mapping[str, Any] | None = None  # the ``handler:`` section as written (validated at load)
    name: str = "model"  # in log lines, and in cache keys through the version and identity
    version: str = "0"
    gpu_id: int | str | None = None  # None: CPU
    workers: int = 1  # workers sharing this machine's cores (threads: auto divides them)


def cosine_refusal(similarity: float, bound: float) -> str | None:
    """The cosine gate's refusal of a candidate (None: it passes)."""
    if similarity >= bound:
        return None
    return f"min cosine {similarity:.6f} to fp32 eager is below the bound {bound:g}"


class Engine:
    """A model family's loader: after :meth:`start`, ``loaded.model`` is what serves, with the choices that made it."""

    options: dict[str, Option] = COMMON_OPTIONS

    def __init__(self, settings: EngineSettings, options: dict[str, Option] | None = None) -> None:
        self.settings = settings
        self.model_dir = settings.model_dir
        self.model_name = settings.name
        self.model_version = settings.version
        if options is not None:
            self.options = options
        self.config = validate(settings.handler_config, self.options)
        self.device = runtime.choose_device(settings.gpu_id)
        self.threads = runtime.set_threads(self.config["threads"], settings.workers)
        # What this engine computes with, as a digest of the model's content (recorded at package time): in every
        # cache key, in describe and in each answer's header, so two models under one name never share an answer.
        self.identity = str(identity.of_folder(self.model_dir, settings.handler_config)["identity"])
        self.load_phases = LoadPhases()  # each step's seconds, so a slow start says where
        self.loaded: Any = None

    @property
    def model(self) -> Any:
        """The served model (after precision choice and compilation)."""
        return self.loaded.model if self.loaded is not None else None

    def start(self) -> None:
        """Load the fp32 model, choose what serves it (the backend walk and its gate), warm that up."""
        phases = self.load_phases
        with phases.phase("model"):
            loaded = self.load_model(self.model_dir)
            fp32_model = loaded.model.eval().to(self.device)
        # Inputs are made outside inference mode, as served requests' are: a compiled graph guards on that too.
        with phases.phase("reference_inputs"):
            reference_batch = self.reference_batch(loaded)
        with torch.inference_mode():
            choice = self.select_backend(fp32_model, loaded, reference_batch)
        self.backend, self.precision = choice.backend, choice.precision
        self.backend_reason, self.backend_fallbacks = choice.reason, choice.fallbacks
        self.min_cosine = choice.min_cosine
        gated = [f["precision"] for f in choice.fallbacks if f["reason"].startswith(GATE_REFUSAL)]
        self.gate_rejected = gated[0] if gated and gated[0] != choice.precision else None
        # Warm-up shapes depend on the backend that serves (a jit graph needs every shape family, eager one pass).
        with phases.phase("warmup"):
            warmup_batches = list(self.warmup_batches(loaded)) if self.config["warmup"] else []
            with torch.inference_mode():
                for batch in warmup_batches:
                    self.forward(choice.model, batch)
        self.loaded = dataclasses.replace(loaded, model=choice.model)  # the fp32 copy is not kept alive
        # Only jit compiles after load; reading dynamo's counter imports torch._dynamo (~1 s of a start) otherwise.
        self.compiles_after_warmup = runtime.compile_count() if self.backend == "jit" else 0
        self.load_seconds = phases.finish()
        logger.info(
            "%s %s ready on %s: backend=%s precision=%s (requested %s/%s; %s; min cosine to fp32 %.6f), threads=%d, "
            "load %.1fs (%s)",
            self.model_name,
            self.model_version,
            self.device,
            self.backend,
            self.precision,
            self.config["backend"],
            self.config["precision"],
            self.backend_reason,
            self.min_cosine,
            self.threads,
            self.load_seconds,
            phases.summary(),
        )

    def select_backend(self, fp32_model: torch.nn.Module, loaded: Any, reference: Any) -> BackendChoice:
        """Walk the candidates in order; the first that loads and passes the accuracy gate against fp32 serves.

        Each refused candidate is logged once with its reason and listed in ``backend_fallbacks``. The base walk
        ends with eager fp32, which always passes; a walk with nothing left is a config error."""
        wanted = runtime.resolve_precision(self.config["precision"], self.device)
        if wanted == "int8" and self.device.type != "cpu":
            raise ConfigError("handler.precision: int8 dynamic quantization runs on CPU only")
        phases = self.load_phases
        with phases.phase("gate_reference"):
            expected = self.reference_output(fp32_model, reference)
        bound = self.config["min_cosine"]
        fallbacks: list[dict[str, str]] = []
        for candidate in self.backend_candidates(loaded, wanted):
            backend, precision = candidate.backend, candidate.precision
            try:
                with phases.phase("backend_load"):
                    model = self.load_backend(backend, precision, fp32_model, loaded)
                exact = backend == "eager" and precision == "fp32"  # the reference itself: nothing to compare
                with phases.phase("gate"):
                    similarity = (
                        1.0
                        if exact
                        else self.gate_similarity(loaded, expected, self.reference_output(model, reference))
                    )
                    refusal = cosine_refusal(similarity, bound)
                    if refusal is None and not exact:
                        refusal = self.output_gate(fp32_model, model, loaded, precision)
            except runtime.BackendUnavailable as error:
                reason = str(error)
            except ConfigError:
                raise
            except Exception as error:  # a candidate that breaks while loading must not stop the ones after it
                logger.warning("backend %s %s failed to load", backend, precision, exc_info=True)
                reason = f"failed to load: {type(error).__name__}: {error}"
            else:
                if refusal is None:
                    logger.info(
                        "backend %s %s serves (%s): min cosine %.6f to fp32 eager on the reference batch (bound %g)",
                        backend,
                        precision,
                        candidate.why,
                        similarity,
                        bound,
                    )
                    return BackendChoice(model, backend, precision, similarity, candidate.why, fallbacks)
                reason = f"{GATE_REFUSAL} {refusal}"
            logger.warning("backend %s %s not served: %s", backend, precision, reason)
            fallbacks.append({"backend": backend, "precision": precision, "reason": reason})
        refused = "; ".join(f"{f['backend']} {f['precision']}: {f['reason']}" for f in fallbacks)
        raise ConfigError(f"handler.backend: no candidate can serve on this worker ({refused})")

    def gate_similarity(self, loaded: Any, expected: Any, got: Any) -> float:
        """How close a candidate's reference output is to fp32 eager's, compared with handler.min_cosine: the smallest
        row cosine similarity (a text model uses its kind's measure, handlers/text/kinds/)."""
        return runtime.min_cosine_similarity(expected, got)

    def output_gate(self, fp32_model: torch.nn.Module, model: Any, loaded: Any, precision: str) -> str | None:
        """A family's own check of a candidate whose reference output passed the cosine gate, on what it serves
        rather than on one forward pass (the generator decodes fixed prompts: handlers/generation/precision.py).
        None passes; otherwise the refusal, with its figures. Not run for eager fp32 (the reference itself)."""
        return None

    def backend_candidates(self, loaded: Any, precision: str) -> list[Candidate]:
        """The configured backend at the wanted precision, then at fp32 (where the accuracy gate falls back to)."""
        backend = self.config["backend"]
        candidates = [Candidate(backend, precision, "configured")]
        if precision != "fp32":
            candidates.append(Candidate(backend, "fp32", f"fp32, because {precision} was refused"))
        return candidates

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: Any) -> Any:
        """The callable that serves ``backend`` at ``precision``; raises runtime.BackendUnavailable with the reason."""
        model = runtime.convert_model(fp32_model, precision)
        if backend == "jit":
            return runtime.compile_model(model)
        if backend == "eager":
            return model
        raise ConfigError(f"handler.backend: {self.family_name()} cannot serve {backend!r}")

    def family_name(self) -> str:
        """What refusals call this engine's family (a handler's engine says the handler's class)."""
        return type(self).__name__

    def describe(self) -> dict[str, Any]:
        """The choices this engine made at load."""
        return {
            "identity": self.identity,
            "backend": self.backend,
            "requested_backend": self.config["backend"],
            "backend_reason": self.backend_reason,
            "precision": self.precision,
            "requested_precision": self.config["precision"],
            "backend_min_cosine": round(self.min_cosine, 6),
            "backend_fallbacks": self.backend_fallbacks,
            "gate_rejected": self.gate_rejected,
            "device": str(self.device),
            "cpu_kind": runtime.cpu_kind(),  # what precision auto and the refusals were decided for (TS_CPU_AS)
            "threads": self.threads,
            "load_seconds": round(self.load_seconds, 2),
            "load_phases": self.load_phases.rounded(),
        }

    # ----------------------------------------------------------------------------------------------- family API
    def load_model(self, model_dir: str) -> Loaded:
        raise NotImplementedError

    def reference_batch(self, loaded: Any) -> Any:
        raise NotImplementedError

    def warmup_batches(self, loaded: Any) -> Sequence[Any]:
        return []

    def reference_output(self, model: Any, reference: Any) -> Any:
        """``model``'s output on the reference inputs, which the accuracy gate compares (one forward pass here)."""
        return self.forward(model, reference)

    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        """One forward pass of ``model`` (the fp32 or converted module, or a compiled callable) on ``batch``."""
        raise NotImplementedError
