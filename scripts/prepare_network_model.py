"""Stage a team's own PyTorch network for its archive: whatever the folder holds becomes one ``model.pt2``.

The prepare step of the network-model template (models/network-model). The folder holds one of:

1. ``model.pt2``: a ``torch.export`` program (``torch.export.save``), exported with a dynamic batch dimension. Copied
   as it is.
2. A TorchScript file (``model.pt``, or the one ``.pt``/``.pth`` file ``torch.jit.load`` reads). Its forward schema
   names the inputs, but a TorchScript file does not record their dtypes or ranks: the signature file's ``example``
   (one request in the native form, rows dimension included) says them, and without one the folder is refused. It is
   converted to an exported program (torch's TorchScript converter) and exported again with the rows dynamic.
3. Model code: a Python file (``model.py``, or the one ``.py`` file besides ``handler.py``) defining the
   ``nn.Module`` (the one ``nn.Module`` class it defines, built with no arguments, or a function ``build_model()``
   returning the module), its weights (a ``state_dict`` saved with ``torch.save`` as ``.pt``/``.pth``, loaded with
   ``weights_only``, or ``.safetensors``), and a signature file with an ``example``. Exported here.

Exports take dimension 0 of every input as the rows (``Dim("batch")``) and let torch decide the other dimensions
(``Dim.AUTO``: a dimension the code fixes, such as a Linear's width, stays static; a length it does not fix is
dynamic, from the example's size up). An example of one row is doubled, so that torch does not specialise the rows to
1. The exported program is checked against the module on the example (within 1e-4).

Then, whatever the source: the program is loaded back as a worker loads it (handlers/network/program.py): its
signature read, a program specialised to one batch size refused with the fix, the signature file checked, the
example computed, ``handler.py`` imported and its hooks found. ``signature.yaml`` and ``handler.py`` are staged beside
``model.pt2``, with the folder's data files (``.json``, ``.txt``, ``.csv``, ``.yaml``) a handler.py may read. A refusal
names the file and the fix, and nothing is staged (so nothing reaches model_store/).

Last, the compiled backends (scripts/build_backends.py, the network family): each candidate (AOTInductor, OpenVINO,
torch.compile; at fp32, and bf16 where this CPU has it natively) built from the staged program into backends/, gated
against eager per output (fp32 within 1e-5 relative, integer outputs exactly) and ranked by speed; the survivors are
recorded best first in backends/manifest.json, which a worker's ``backend: auto`` serves from. ``--backends none``
records none (workers serve eager); ``default`` builds every backend, since which one wins depends on the network.

    python -m scripts.prepare_network_model --source /path/to/folder --out build/my-net/model
    python -m scripts.prepare_network_model --source /path/to/folder --out build/my-net/model --backends openvino
Exit codes: 0 staged, 1 the folder was refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from scripts import build_backends
from scripts.build_backends import NETWORK_BACKENDS

PROGRAM = "model.pt2"
HOOKS = "handler.py"
SIGNATURES = ("signature.yaml", "signature.yml", "signature.json")
WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors")
DATA_SUFFIXES = (".json", ".txt", ".csv", ".yaml", ".yml")
PARITY = 1e-4


class NetworkFolderError(ValueError):
    """A folder that cannot be packaged: the file, the problem and the fix."""

    def __init__(self, file: str, problem: str, fix: str = "") -> None:
        super().__init__((f"{file}: " if file else "") + problem + (f". Fix: {fix}" if fix else ""))


def is_network_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether `make package` should use the network-model template: a program, TorchScript or model code, no
    transformers config (a text or image model's folder)."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "config.json").is_file():
        return False
    return (folder / PROGRAM).is_file() or any(p.suffix in (".py", ".pt", ".pth") for p in folder.iterdir())


def source_kind(folder: Path) -> str:
    """program | code | torchscript, as the folder's files say."""
    if (folder / PROGRAM).is_file():
        return "program"
    if code_files(folder):
        return "code"
    if any(p.suffix in (".pt", ".pth") for p in folder.iterdir()):
        return "torchscript"
    raise NetworkFolderError(
        str(folder),
        "holds no network: no model.pt2, no TorchScript file, no model code",
        "save the program with torch.export.save(torch.export.export(model, example_inputs, dynamic_shapes=...), "
        "'model.pt2') in the folder (docs/your-model.md, 'Your own network')",
    )


def code_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if p.name != HOOKS)


def signature_path(folder: Path) -> Path | None:
    found = [folder / name for name in SIGNATURES if (folder / name).is_file()]
    if len(found) > 1:
        raise NetworkFolderError(found[1].name, f"is there beside {found[0].name}", "keep one signature file")
    return found[0] if found else None


def example_inputs(folder: Path, why: str) -> dict[str, torch.Tensor]:
    """The signature file's example as tensors (rows dimension included; JSON integers -> int64, numbers with a
    fraction -> float32, booleans -> bool), doubled when it has one row."""
    from handlers.network.signature import SignatureError, read_file

    path = signature_path(folder)
    fix = (
        "add signature.yaml with an example request, rows dimension included, e.g.\n  example:\n    x: [[0.5, 1.0, "
        "2.0]]\nwrite float inputs with a decimal point (1.0): integers make an int64 input"
    )
    if path is None:
        raise NetworkFolderError("signature.yaml", f"is missing: {why}", fix)
    try:
        settings = read_file(path)
    except SignatureError as error:
        raise NetworkFolderError(path.name, str(error), "correct the key it names") from None
    if not settings.example:
        raise NetworkFolderError(path.name, f"has no example: {why}", fix)
    tensors = {}
    for name, data in settings.example.items():
        tensor = example_tensor(path.name, str(name), data)
        tensors[str(name)] = torch.cat([tensor, tensor]) if tensor.shape[0] == 1 else tensor
    return tensors


def example_tensor(where: str, name: str, data: Any) -> torch.Tensor:
    try:
        tensor = torch.tensor(data)
    except (TypeError, ValueError, RuntimeError) as error:
        raise NetworkFolderError(where, f"example.{name} is not a tensor ({error})", "give nested lists") from None
    if tensor.dim() == 0:
        raise NetworkFolderError(
            where, f"example.{name} is a single value", "give the rows dimension too: [[...]] for one row"
        )
    return tensor.float() if tensor.is_floating_point() else tensor


def export_module(module: torch.nn.Module, example: dict[str, torch.Tensor], source: str) -> Any:
    """The module exported with dimension 0 of every input as the shared rows, other dimensions as torch decides."""
    names = list(example)
    batch = torch.export.Dim("batch")
    shapes = {name: {0: batch, **{i: torch.export.Dim.AUTO for i in range(1, t.dim())}} for name, t in example.items()}
    try:
        return torch.export.export(module, tuple(example[n] for n in names), dynamic_shapes=shapes)
    except Exception as error:
        text = str(error).strip().splitlines()
        raise NetworkFolderError(
            source,
            f"torch.export could not export it with a dynamic batch dimension ({type(error).__name__}: "
            f"{text[0][:300] if text else ''})",
            "make forward exportable (torch.export: no data-dependent Python control flow on tensor values, every "
            "input a tensor with the rows first), or export it yourself and put model.pt2 in the folder",
        ) from None


def check_parity(module: torch.nn.Module, program: Any, example: dict[str, torch.Tensor], source: str) -> float:
    with torch.inference_mode():
        expected = torch.utils._pytree.tree_leaves(module(*example.values()))
        got = torch.utils._pytree.tree_leaves(program.module()(*example.values()))
    worst = max((float((a.double() - b.double()).abs().max()) for a, b in zip(expected, got, strict=True)), default=0)
    if worst > PARITY:
        raise NetworkFolderError(source, f"the exported program differs from the module by {worst:g}", "report it")
    return worst


# ------------------------------------------------------------------------------------------------- model code
def load_code(folder: Path) -> torch.nn.Module:
    files = code_files(folder)
    path = folder / "model.py" if (folder / "model.py").is_file() else files[0]
    if len(files) > 1 and path.name != "model.py":
        raise NetworkFolderError(
            ", ".join(p.name for p in files), "several Python files, none named model.py", "name the model's model.py"
        )
    sys.path.insert(0, str(folder))  # the model's own imports of its sibling files
    try:
        spec = importlib.util.spec_from_file_location("user_network_model", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["user_network_model"] = module
        spec.loader.exec_module(module)
    except Exception as error:
        raise NetworkFolderError(path.name, f"does not import ({type(error).__name__}: {error})", "fix it") from None
    finally:
        sys.path.remove(str(folder))
    return build_module(module, path.name)


def build_module(code: Any, where: str) -> torch.nn.Module:
    factory = getattr(code, "build_model", None)
    if callable(factory):
        built = factory()
        if not isinstance(built, torch.nn.Module):
            raise NetworkFolderError(where, f"build_model() returned {type(built).__name__}", "return the nn.Module")
        return built
    classes = [
        value
        for value in vars(code).values()
        if inspect.isclass(value) and issubclass(value, torch.nn.Module) and value.__module__ == code.__name__
    ]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise NetworkFolderError(
            where, f"defines {len(classes)} nn.Module classes ({found})", "define build_model() returning the module"
        )
    try:
        return classes[0]()
    except TypeError as error:
        raise NetworkFolderError(
            where, f"{classes[0].__name__}() needs arguments ({error})", "define build_model() returning the module"
        ) from None


def weights_file(folder: Path) -> Path:
    found = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    if len(found) != 1:
        raise NetworkFolderError(
            str(folder),
            f"has {len(found)} weight files ({', '.join(p.name for p in found) or 'none'}) beside the model code",
            "keep one state_dict file: torch.save(model.state_dict(), 'weights.pt') or a .safetensors file",
        )
    return found[0]


def load_weights(module: torch.nn.Module, path: Path) -> None:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:
        raise NetworkFolderError(
            path.name,
            f"does not load as a state_dict ({type(error).__name__}: {str(error)[:200]})",
            "save the weights with torch.save(model.state_dict(), path) (a pickled whole model is not read)",
        ) from None
    if not isinstance(state, dict):
        raise NetworkFolderError(path.name, f"holds a {type(state).__name__}", "save model.state_dict()")
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise NetworkFolderError(
            path.name, f"does not fit the module: {str(error)[:400]}", "save its weights"
        ) from None


def from_code(folder: Path) -> tuple[Any, str]:
    module = load_code(folder)
    load_weights(module, weights_file(folder))
    module.eval()
    example = example_inputs(folder, "model code does not say its inputs' dtypes and shapes")
    names = list(inspect.signature(module.forward).parameters)
    if names[: len(example)] != list(example):
        raise NetworkFolderError(
            "signature.yaml", f"example names {list(example)}; forward takes {names}", "name every input, in order"
        )
    program = export_module(module, example, "model code")
    worst = check_parity(module, program, example, "model code")
    return program, f"exported from {module.__class__.__name__} with its weights (max difference {worst:g})"


# ------------------------------------------------------------------------------------------------- TorchScript
def torchscript_file(folder: Path) -> Path:
    if (folder / "model.pt").is_file():
        return folder / "model.pt"
    found = sorted(p for p in folder.iterdir() if p.suffix in (".pt", ".pth"))
    if len(found) > 1:
        raise NetworkFolderError(", ".join(p.name for p in found), "several model files", "name it model.pt")
    return found[0]


def from_torchscript(folder: Path) -> tuple[Any, str]:
    path = torchscript_file(folder)
    try:
        with warnings.catch_warnings():  # torch deprecates TorchScript; reading one to convert it is the way out
            warnings.simplefilter("ignore", DeprecationWarning)
            scripted = torch.jit.load(str(path), map_location="cpu")
    except Exception as error:
        raise NetworkFolderError(
            path.name,
            f"is not a TorchScript file torch.jit.load reads ({type(error).__name__}: {first_line(error)})",
            "save model.pt2 with torch.export.save, or torch.jit.save a scripted/traced module; weights alone need "
            "the model code beside them (model.py)",
        ) from None
    names = [a.name for a in scripted.forward.schema.arguments[1:]]
    example = example_inputs(
        folder, f"a TorchScript file names its inputs ({', '.join(names)}) but not their dtypes and shapes"
    )
    if list(example) != names:
        raise NetworkFolderError(
            "signature.yaml", f"example names {list(example)}; forward takes {names}", "name every input, in order"
        )
    from torch._export.converter import TS2EPConverter

    try:
        converted = TS2EPConverter(scripted, tuple(example.values())).convert()
    except Exception as error:
        raise NetworkFolderError(
            path.name,
            f"torch's TorchScript converter cannot read it ({type(error).__name__}: {str(error)[:200]})",
            "export the model with torch.export instead and put model.pt2 in the folder",
        ) from None
    module = named_forward(converted.module(), names)
    program = export_module(module, example, path.name)
    worst = check_parity(scripted, program, example, path.name)
    return program, f"converted from TorchScript {path.name} (max difference {worst:g})"


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""


def named_forward(inner: torch.nn.Module, names: list[str]) -> torch.nn.Module:
    """A module whose forward takes the TorchScript forward's argument names (torch.export names inputs by them)."""
    if any(not name.isidentifier() for name in names):
        raise NetworkFolderError("model.pt", f"forward's arguments {names} are not Python names", "rename them")
    scope: dict[str, Any] = {}
    arguments = ", ".join(names)
    exec(f"def forward(self, {arguments}):\n    return self.inner({arguments})\n", scope)  # noqa: S102 -- names checked
    wrapper = type("NamedForward", (torch.nn.Module,), {"forward": scope["forward"]})()
    wrapper.inner = inner
    return wrapper


# ------------------------------------------------------------------------------------------------- staging
def stage(source: str | Path, out: Path) -> str:
    folder = Path(source)
    if not folder.is_dir():
        raise NetworkFolderError(str(folder), "is not a folder", "pass the folder that holds the network")
    kind = source_kind(folder)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if kind == "program":
        shutil.copy2(folder / PROGRAM, out / PROGRAM)
        how = "torch.export program"
    else:
        program, how = from_code(folder) if kind == "code" else from_torchscript(folder)
        torch.export.save(program, str(out / PROGRAM))
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.name == HOOKS or path.suffix in DATA_SUFFIXES):
            shutil.copy2(path, out / path.name)
    return f"{how}; {verify(out)}"


def verify(out: Path) -> str:
    """Load the staged folder as a worker does; the example (or generated rows) computed through the engine."""
    from handlers.core.errors import RequestError
    from handlers.network.engine import NetworkEngine
    from handlers.network.handler import reference_tensors
    from handlers.network.hooks import load_hooks
    from handlers.network.program import ProgramModule, load_program
    from handlers.network.signature import SignatureError

    try:
        loaded = load_program(out)
        hooks = load_hooks(out)
        engine = NetworkEngine(ProgramModule(loaded), loaded.signature)
        with torch.inference_mode():
            engine.compute(reference_tensors(loaded.signature))
    except (SignatureError, RequestError) as error:
        message = error.message if isinstance(error, RequestError) else str(error)
        # The signature's refusals say the fix; those about a file name it first.
        raise NetworkFolderError(
            "" if message.startswith(("signature", HOOKS, PROGRAM)) else PROGRAM, message
        ) from None
    signature = loaded.signature
    shown = ", ".join(f"{s.name} {s.datatype.name}{list(s.metadata()['shape'])}" for s in signature.inputs)
    hooked = [name for name in ("preprocess", "postprocess") if getattr(hooks, name) is not None]
    return f"inputs {shown}; outputs {', '.join(s.name for s in signature.outputs)}" + (
        f"; handler.py {' and '.join(hooked)}" if hooked else ""
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_network_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--source", required=True, help="the network's folder")
    parser.add_argument("--out", type=Path, required=True, help="folder to stage the archive's model files in")
    parser.add_argument(
        "--backends",
        default="default",
        help="compiled backends to build: default (all of them), none, or a comma-separated list of "
        f"{', '.join(NETWORK_BACKENDS)} (scripts/build_backends.py)",
    )
    parser.add_argument("--rank-seconds", type=float, default=30.0, help="backend ranking budget (default 30 s)")
    parser.add_argument(
        "--keep-slower",
        choices=("true", "false"),
        default="false",
        help="true: pack a candidate that ranked slower than eager at its precision too (default false: refused)",
    )
    args = parser.parse_args(argv)
    backends = parse_backends(parser, args.backends)
    if args.rank_seconds <= 0:
        parser.error("--rank-seconds must be positive")
    try:
        summary = stage(args.source, args.out)
    except NetworkFolderError as error:
        print(f"error: {args.source}: {error}", file=sys.stderr)
        shutil.rmtree(args.out, ignore_errors=True)
        return 1
    print(f"staged network {args.source} -> {args.out}: {summary}", flush=True)
    try:
        build_backends.build(args.out, backends, rank_seconds=args.rank_seconds, beat_eager=args.keep_slower == "false")
    except build_backends.BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        shutil.rmtree(args.out, ignore_errors=True)
        return 1
    return 0


def parse_backends(parser: argparse.ArgumentParser, text: str) -> list[str] | None:
    """default (None: every network backend), none ([]), or a comma-separated list of them."""
    if text in ("default", "none"):
        return None if text == "default" else []
    values = [value.strip() for value in text.split(",") if value.strip()]
    unknown = [value for value in values if value not in NETWORK_BACKENDS]
    if unknown or not values:
        parser.error(f"--backends: choose default, none, or from {', '.join(NETWORK_BACKENDS)} (comma-separated)")
    return values


if __name__ == "__main__":
    sys.exit(main())
