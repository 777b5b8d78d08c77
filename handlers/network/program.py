"""A packaged network as a worker loads it: ``model.pt2`` (a ``torch.export`` program, whatever the team handed over:
packaging exports TorchScript files and model code with weights to one, scripts/prepare_network_model.py) plus the
optional ``signature.yaml``, read into a :class:`Signature`, and the program's callable.

The callable is what computes (:class:`ProgramModule`, an ``nn.Module`` around the program's module): the backend walk
of handlers/network/handler.py starts from it, and a compiled backend replaces it there, behind the same signature.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handlers.network.signature import Signature, SignatureError, from_exported, read_file

PROGRAM_FILE = "model.pt2"
SIGNATURE_FILES = ("signature.yaml", "signature.yml", "signature.json")


@dataclass(frozen=True)
class LoadedProgram:
    program: torch.export.ExportedProgram
    signature: Signature


def signature_file(folder: Path) -> Path | None:
    """The folder's signature file, if it has one; two of them is ambiguous and refused."""
    found = [folder / name for name in SIGNATURE_FILES if (folder / name).is_file()]
    if len(found) > 1:
        raise SignatureError(f"{found[0].name} and {found[1].name}: keep one signature file")
    return found[0] if found else None


def load_program(folder: str | Path) -> LoadedProgram:
    """The folder's exported program and its signature (the signature file's additions applied); a refusal names
    the file and what to do."""
    folder = Path(folder)
    path = folder / PROGRAM_FILE
    if not path.is_file():
        raise SignatureError(f"{PROGRAM_FILE} is missing from {folder}: save the program with torch.export.save")
    export_log = logging.getLogger("torch.export")
    level = export_log.level
    export_log.setLevel(logging.ERROR)  # torch logs the traceback of a file it cannot read; the refusal says it
    try:
        program = torch.export.load(str(path))
    except Exception as error:  # a truncated, foreign or newer-torch file: say so instead of a traceback
        raise SignatureError(
            f"{PROGRAM_FILE} does not load with torch.export.load ({type(error).__name__}: {str(error)[:200]}); "
            f"save it with torch.export.save(torch.export.export(model, example_inputs, dynamic_shapes=...), "
            f"'{PROGRAM_FILE}') under torch {torch.__version__.split('+')[0]}"
        ) from None
    finally:
        export_log.setLevel(level)
    settings_path = signature_file(folder)
    settings = read_file(settings_path) if settings_path is not None else None
    return LoadedProgram(program=program, signature=from_exported(program, settings))


class ProgramModule(torch.nn.Module):
    """The program's module as the engine calls it: one tensor per input, in the signature's order, to the outputs
    by name. The unlifted graph module is held outside the module tree: torch.export's module refuses eval(), which
    the load path calls on what it serves (an exported program has no training mode to leave anyway)."""

    def __init__(self, loaded: LoadedProgram) -> None:
        super().__init__()
        self.signature = loaded.signature
        self.runs = [loaded.program.module()]  # a list: not a registered submodule

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.signature.call(self.runs[0], tensors)
