"""What a network takes and returns, read from its exported program, plus the little a signature file adds.

A :class:`Signature` holds one :class:`TensorSpec` per input and per output: its name, torch dtype and shape, each
dimension static or dynamic with the range the program was exported for. It is read from a ``torch.export``
ExportedProgram (:func:`from_exported`):

- input names are the forward method's argument names (the graph signature's user inputs), each a tensor; positional
  and keyword arguments are both kept, as the program was exported;
- dtypes and ranks come from the placeholders' fake tensors (``meta["val"]``), dynamic dimensions from their symbolic
  sizes and ``range_constraints``; dimensions that share a symbol must be equal in a request;
- output names are the keys when forward returns a dict, else ``output0``, ``output1``, ... (or the names the
  signature file gives, in order);
- dimension 0 of every input and output is the rows (one shared dynamic dimension, ``Dim("batch")``): a program
  specialised to a fixed number of rows cannot batch requests and is refused with the fix;
- an integer input that feeds an ``nn.Embedding`` (or ``EmbeddingBag``) directly takes ids in ``[0, num_embeddings
  - 1]``: any other id would fail inside the model, so it is refused by name instead.

The signature file (``signature.yaml``; JSON is YAML too, so ``signature.json`` is read the same way) says only what the
program cannot; every key is optional::

    inputs:
      user_ids:
        range: [0, 9999]            # integer input: smallest and largest id accepted (within an embedding's rows)
      features:
        allow_nan: true             # NaN and Infinity accepted in this float input (refused by default)
    outputs:                        # for a program returning a tensor or a tuple: every output, in order, named here
      scores:
        labels: [cat, dog, bird]    # one per entry of the last dimension (a class output)
    max_rows_per_request: 256       # a request with more rows is refused (413)
    max_rows_per_pass: 64           # larger batches are computed in several passes
    example:                        # one request in the native form (checked against the program at load)
      user_ids: [[1, 2, 3]]
      features: [[0.5, 0.1]]

Every value is checked, and a refusal names its key (``signature.yaml: inputs.user_ids.range: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils import _pytree as pytree

from handlers.core.config import ConfigError
from handlers.network.datatypes import DataType, of_dtype

UNBOUNDED = 2**62  # an exported upper bound at or above this is no bound at all (torch writes int_oo)
FILE_KEYS = {"inputs", "outputs", "max_rows_per_request", "max_rows_per_pass", "example"}
INPUT_KEYS = {"range", "allow_nan"}
OUTPUT_KEYS = {"labels"}
EMBEDDING_OPS = ("aten.embedding.default", "aten.embedding_bag.default", "aten._embedding_bag.default")


class SignatureError(ConfigError):
    """A program or signature file that cannot be served; the message names the input, output or key."""


@dataclass(frozen=True)
class DimSpec:
    """One dimension: static (``size``) or dynamic (``symbol``, with the range the program was exported for)."""

    size: int | None  # None: dynamic
    symbol: str | None = None  # dynamic dimensions sharing a symbol must be equal
    low: int = 0
    high: int | None = None  # None: unbounded

    def admits(self, size: int) -> bool:
        if self.size is not None:
            return size == self.size
        return self.low <= size and (self.high is None or size <= self.high)

    def describe(self) -> str:
        if self.size is not None:
            return str(self.size)
        return f"{self.low}..{'' if self.high is None else self.high}"


@dataclass(frozen=True)
class ValueRange:
    """The integer values an input accepts, and where that range comes from (said in refusals)."""

    low: int
    high: int
    source: str


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    dims: tuple[DimSpec, ...]
    value_range: ValueRange | None = None
    allow_nan: bool = False
    labels: tuple[str, ...] | None = None

    @property
    def datatype(self) -> DataType:
        return of_dtype(self.dtype)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def metadata(self) -> dict[str, Any]:
        """As the protocol's model metadata lists a tensor: -1 for each dynamic dimension."""
        shape = [-1 if d.size is None else d.size for d in self.dims]
        return {"name": self.name, "datatype": self.datatype.name, "shape": shape}


@dataclass(frozen=True)
class Limits:
    max_rows_per_request: int | None = None
    max_rows_per_pass: int | None = None


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    keyword_inputs: tuple[str, ...] = ()  # inputs passed by keyword (the rest positionally, in order)
    limits: Limits = field(default_factory=Limits)
    example: Mapping[str, Any] | None = None  # one request in the native form

    @property
    def rows(self) -> DimSpec:
        """The rows dimension every input and output shares."""
        return self.inputs[0].dims[0]

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)

    def call(self, program: Callable[..., Any], tensors: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run ``program`` on one tensor per input (in this signature's order); its outputs by name."""
        positional = [t for spec, t in zip(self.inputs, tensors, strict=True) if spec.name not in self.keyword_inputs]
        keywords = {
            spec.name: t for spec, t in zip(self.inputs, tensors, strict=True) if spec.name in self.keyword_inputs
        }
        leaves = pytree.tree_leaves(program(*positional, **keywords))
        if len(leaves) != len(self.outputs):
            raise RuntimeError(f"the program returned {len(leaves)} tensors; its signature has {len(self.outputs)}")
        return {spec.name: leaf for spec, leaf in zip(self.outputs, leaves, strict=True)}


# ------------------------------------------------------------------------------------------- reading a program
def load(path: str | Path, signature_file: str | Path | None = None) -> tuple[Callable[..., Any], Signature]:
    """A saved ExportedProgram (``torch.export.save``) as a callable module and its signature."""
    program = torch.export.load(str(path))
    settings = read_file(signature_file) if signature_file is not None else None
    return program.module(), from_exported(program, settings)


def from_exported(program: torch.export.ExportedProgram, settings: SignatureFile | None = None) -> Signature:
    """The signature of an exported program, with what a signature file adds."""
    settings = settings or SignatureFile()
    ranges = {str(symbol): bounds(value) for symbol, value in program.range_constraints.items()}
    names, keyword_inputs = input_names(program)
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    inputs = tuple(tensor_spec(name, placeholders[name].meta.get("val"), ranges, "input") for name in names)
    check_rows(inputs)
    derived = embedding_ranges(program, set(names))
    inputs = tuple(replace(spec, value_range=derived.get(spec.name)) for spec in inputs)
    outputs = output_specs(program, ranges, settings)
    check_output_rows(outputs, inputs[0].dims[0])
    return settings.apply(Signature(inputs=inputs, outputs=outputs, keyword_inputs=keyword_inputs))


def bounds(value_range: Any) -> tuple[int, int | None]:
    """An exported symbol's [low, high] as ints (high None when unbounded: torch's int_oo)."""
    return finite_int(value_range.lower) or 0, finite_int(value_range.upper)


def finite_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):  # int_oo and sympy's oo do not convert
        return None
    return number if abs(number) < UNBOUNDED else None


def input_names(program: torch.export.ExportedProgram) -> tuple[list[str], tuple[str, ...]]:
    """The user inputs' names in call order, and those passed by keyword; refuses non-tensor and nested inputs."""
    names = []
    for spec in program.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.USER_INPUT:
            continue
        if not isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
            raise SignatureError(
                f"forward argument {getattr(spec.arg, 'name', spec.arg)!r} is not a tensor; only tensor inputs can be "
                "served (make other values constants of the model)"
            )
        names.append(spec.arg.name)
    args_spec, kwargs_spec = program.call_spec.in_spec.children()
    leaves = [*args_spec.children(), *kwargs_spec.children()]
    if any(not leaf.is_leaf() for leaf in leaves) or len(leaves) != len(names):
        raise SignatureError(
            "the program takes nested inputs (a tuple, list or dict argument); export forward with one tensor per "
            "argument, so that each input has a name"
        )
    keyword_inputs = tuple(names[len(args_spec.children()) :])
    return names, keyword_inputs


def dim_spec(size: Any, ranges: Mapping[str, tuple[int, int | None]], where: str) -> DimSpec:
    if isinstance(size, int):
        return DimSpec(size=size)
    expression = size.node.expr
    if not expression.is_Symbol:
        raise SignatureError(
            f"{where} is the expression {expression}, derived from other dimensions; only static dimensions and "
            "dynamic ones of their own (torch.export.Dim) can be served"
        )
    low, high = ranges.get(str(expression), (0, None))
    return DimSpec(size=None, symbol=str(expression), low=low, high=high)


def tensor_spec(name: str, value: Any, ranges: Mapping[str, tuple[int, int | None]], what: str) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise SignatureError(f"{what} {name!r} is not a tensor ({type(value).__name__}); only tensors can be served")
    try:
        of_dtype(value.dtype)
    except ValueError as error:
        raise SignatureError(f"{what} {name!r}: {error}") from None
    dims = tuple(dim_spec(size, ranges, f"{what} {name!r} dimension {i}") for i, size in enumerate(value.shape))
    return TensorSpec(name=name, dtype=value.dtype, dims=dims)


def check_rows(inputs: Sequence[TensorSpec]) -> None:
    """Dimension 0 of every input is the rows, one dynamic dimension they all share: the fix when it is not."""
    if not inputs:
        raise SignatureError("the program takes no input")
    names = ", ".join(repr(spec.name) for spec in inputs)
    fix = (
        f'export with a dynamic batch dimension: batch = torch.export.Dim("batch"); torch.export.export(model, '
        f"example_inputs, dynamic_shapes={{{', '.join(f'{s.name!r}: {{0: batch}}' for s in inputs)}}})"
    )
    scalars = [spec.name for spec in inputs if spec.rank == 0]
    if scalars:
        raise SignatureError(f"input {scalars[0]!r} is a scalar: each input needs the rows as its dimension 0; {fix}")
    first = [spec.dims[0] for spec in inputs]
    if all(d.size is not None for d in first):
        rows = sorted({d.size for d in first if d.size is not None})
        raise SignatureError(
            f"the program was exported for batch size {rows[0] if len(rows) == 1 else rows} only (dimension 0 of "
            f"{names} is static), so requests cannot be batched; {fix}"
        )
    symbols = {d.symbol for d in first}
    if len(symbols) != 1:
        odd = next(spec.name for spec in inputs if spec.dims[0] != first[0])
        raise SignatureError(
            f"dimension 0 of input {odd!r} is not the same dynamic dimension as that of {inputs[0].name!r}: every "
            f"input's dimension 0 must be the one batch dimension; {fix}"
        )


def check_output_rows(outputs: Sequence[TensorSpec], rows: DimSpec) -> None:
    for spec in outputs:
        if spec.rank == 0 or spec.dims[0].symbol != rows.symbol:
            raise SignatureError(
                f"output {spec.name!r} (shape [{', '.join(d.describe() for d in spec.dims)}]) does not have one row "
                "per input row in its dimension 0, so a batched answer cannot be split back into each request's"
            )


def output_specs(
    program: torch.export.ExportedProgram, ranges: Mapping[str, tuple[int, int | None]], settings: SignatureFile
) -> tuple[TensorSpec, ...]:
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    values = [arg.meta.get("val") if hasattr(arg, "meta") else arg for arg in pytree.tree_leaves(output_node.args[0])]
    user = [
        value
        for value, spec in zip(values, program.graph_signature.output_specs, strict=True)
        if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT
    ]
    names = output_names(program.call_spec.out_spec, len(user), settings)
    return tuple(tensor_spec(name, value, ranges, "output") for name, value in zip(names, user, strict=True))


def output_names(out_spec: Any, count: int, settings: SignatureFile) -> list[str]:
    """The dict's keys, else the signature file's names (all of them, in order), else output0, output1, ..."""
    if out_spec.type is dict:
        if any(not child.is_leaf() for child in out_spec.children()):
            raise SignatureError("the program returns a dict holding more than tensors; return one tensor per key")
        return [str(key) for key in out_spec.context]
    if not out_spec.is_leaf() and any(not child.is_leaf() for child in out_spec.children()):
        raise SignatureError("the program returns nested outputs; return a tensor, a tuple of tensors or a dict")
    if settings.outputs:
        if len(settings.outputs) != count:
            raise SignatureError(
                f"{settings.where}: outputs names {len(settings.outputs)} outputs ({', '.join(settings.outputs)}); "
                f"the program returns {count}: name every output, in order"
            )
        return list(settings.outputs)
    return [f"output{i}" for i in range(count)]


def embedding_ranges(program: torch.export.ExportedProgram, names: set[str]) -> dict[str, ValueRange]:
    """Inputs that index an embedding table directly: ids in [0, rows - 1] (the smallest table, if several)."""
    found: dict[str, ValueRange] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or str(node.target) not in EMBEDDING_OPS or len(node.args) < 2:
            continue
        weight, indices = node.args[0], node.args[1]
        if getattr(indices, "name", None) not in names or not hasattr(weight, "meta"):
            continue
        rows = weight.meta["val"].shape[0]
        if not isinstance(rows, int):
            continue
        known = found.get(indices.name)
        if known is None or rows - 1 < known.high:
            found[indices.name] = ValueRange(0, rows - 1, f"it indexes an embedding of {rows} rows")
    return found


# ------------------------------------------------------------------------------------------- the signature file
@dataclass(frozen=True)
class InputSettings:
    range: tuple[int, int] | None = None
    allow_nan: bool = False


@dataclass(frozen=True)
class SignatureFile:
    """What a signature file says, checked key by key (:func:`read_file`, :func:`parse_file`)."""

    where: str = "signature"
    inputs: Mapping[str, InputSettings] = field(default_factory=dict)
    outputs: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)  # name -> labels
    limits: Limits = field(default_factory=Limits)
    example: Mapping[str, Any] | None = None

    def apply(self, signature: Signature) -> Signature:
        """The program's signature with this file's additions; refuses names the program does not have."""
        where = self.where
        inputs = tuple(self.input_spec(spec) for spec in signature.inputs)
        known = {spec.name for spec in signature.inputs}
        for name in self.inputs:
            if name not in known:
                raise SignatureError(f"{where}: inputs.{name}: the program has no input {name!r} ({sorted(known)})")
        outputs = tuple(self.output_spec(spec) for spec in signature.outputs)
        unknown = set(self.outputs) - {spec.name for spec in outputs}
        if unknown:
            name = sorted(unknown)[0]
            raise SignatureError(
                f"{where}: outputs.{name}: the program has no output {name!r} ({[s.name for s in outputs]})"
            )
        if self.example is not None:
            for name in self.example:
                if name not in known:
                    raise SignatureError(
                        f"{where}: example.{name}: the program has no input {name!r} ({sorted(known)})"
                    )
        return replace(signature, inputs=inputs, outputs=outputs, limits=self.limits, example=self.example)

    def input_spec(self, spec: TensorSpec) -> TensorSpec:
        settings = self.inputs.get(spec.name)
        if settings is None:
            return spec
        key = f"{self.where}: inputs.{spec.name}"
        if settings.allow_nan and spec.datatype.kind != "f":
            raise SignatureError(f"{key}.allow_nan: input {spec.name!r} is {spec.datatype.name}, which holds no NaN")
        spec = replace(spec, allow_nan=settings.allow_nan)
        if settings.range is None:
            return spec
        if spec.datatype.kind not in "ui":
            raise SignatureError(f"{key}.range: input {spec.name!r} is {spec.datatype.name}; a range is for ids")
        low, high = settings.range
        derived = spec.value_range
        if derived is not None and (low < derived.low or high > derived.high):
            raise SignatureError(
                f"{key}.range: [{low}, {high}] goes beyond [{derived.low}, {derived.high}] ({derived.source})"
            )
        return replace(spec, value_range=ValueRange(low, high, f"{key}.range"))

    def output_spec(self, spec: TensorSpec) -> TensorSpec:
        labels = self.outputs.get(spec.name)
        if labels is None:
            return spec
        width = spec.dims[-1].size if spec.rank >= 2 else None
        if width != len(labels):
            raise SignatureError(
                f"{self.where}: outputs.{spec.name}.labels: {len(labels)} labels; output {spec.name!r} has "
                f"{'no static last dimension' if width is None else f'{width} entries in its last dimension'}"
            )
        return replace(spec, labels=labels)


def read_file(path: str | Path) -> SignatureFile:
    """Read and check a signature file (YAML, or JSON, which YAML reads too)."""
    where = Path(path).name
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise SignatureError(f"{where}: cannot read it: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SignatureError(f"{where}: not valid YAML or JSON: {error}") from None
    return parse_file({} if data is None else data, where)


def parse_file(data: Any, where: str = "signature") -> SignatureFile:
    """A signature file's content (already parsed) checked key by key."""
    mapping(data, where)
    refuse_unknown(data, FILE_KEYS, where, "")
    inputs = {
        str(name): input_settings(value, f"{where}: inputs.{name}") for name, value in items(data, "inputs", where)
    }
    outputs = {
        str(name): output_labels(value, f"{where}: outputs.{name}") for name, value in items(data, "outputs", where)
    }
    limits = Limits(
        max_rows_per_request=positive(data.get("max_rows_per_request"), f"{where}: max_rows_per_request"),
        max_rows_per_pass=positive(data.get("max_rows_per_pass"), f"{where}: max_rows_per_pass"),
    )
    example = data.get("example")
    if example is not None:
        mapping(example, f"{where}: example")
    return SignatureFile(where=where, inputs=inputs, outputs=outputs, limits=limits, example=example)


def mapping(value: Any, key: str) -> None:
    if not isinstance(value, dict):
        raise SignatureError(f"{key}: expected a mapping of keys to values, got {type(value).__name__}")


def refuse_unknown(value: Mapping[str, Any], known: set[str], where: str, prefix: str) -> None:
    unknown = sorted(str(key) for key in set(value) - known)
    if unknown:
        raise SignatureError(f"{where}: {prefix}{unknown[0]}: unknown key; known keys are {sorted(known)}")


def items(data: Mapping[str, Any], key: str, where: str) -> list[tuple[Any, Any]]:
    value = data.get(key)
    if value is None:
        return []
    mapping(value, f"{where}: {key}")
    return list(value.items())


def input_settings(value: Any, key: str) -> InputSettings:
    if value is None:
        return InputSettings()
    mapping(value, key)
    refuse_unknown(value, INPUT_KEYS, key, "")
    allow_nan = value.get("allow_nan", False)
    if not isinstance(allow_nan, bool):
        raise SignatureError(f"{key}.allow_nan: expected true or false, got {allow_nan!r}")
    low_high = value.get("range")
    if low_high is None:
        return InputSettings(allow_nan=allow_nan)
    if (
        not isinstance(low_high, list)
        or len(low_high) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in low_high)
        or low_high[0] > low_high[1]
    ):
        raise SignatureError(
            f"{key}.range: expected [smallest, largest] integers (smallest <= largest), got {low_high!r}"
        )
    return InputSettings(range=(low_high[0], low_high[1]), allow_nan=allow_nan)


def output_labels(value: Any, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    mapping(value, key)
    refuse_unknown(value, OUTPUT_KEYS, key, "")
    labels = value.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, list) or not labels or any(not isinstance(label, str) for label in labels):
        raise SignatureError(f"{key}.labels: expected a non-empty list of strings, got {labels!r}")
    if len(set(labels)) != len(labels):
        raise SignatureError(f"{key}.labels: labels repeat; each class needs its own")
    return tuple(labels)


def positive(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SignatureError(f"{key}: expected a positive integer, got {value!r}")
    return value
