"""``handler.decode_step`` (``openvino``, or ``auto``): the decoding passes run by OpenVINO on the model converted to
paged attention.

**The conversion** (:func:`export` then :func:`to_paged`; :func:`convert` does both, reading the package-time export
of :mod:`handlers.generation.decoder_export` instead of tracing where the archive has one). The model's decoder is
traced by ``openvino.convert_model`` with its keys and values as explicit inputs and outputs; those pairs become the
model's state (``apply_make_stateful_transformation``), and OpenVINO's ``paged_attention_transformation`` then
replaces every attention by its paged-attention operation. The result takes one flattened token sequence per pass
(any rows, each with any number of new tokens) and keeps every row's keys and values in blocks of a pool this module
owns; a row's block table says which blocks hold its tokens. Two things are added to the traced decoder: a
``logits_rows`` input, so the output layer runs only at the tokens whose next token is chosen (the last of each row
in the pass, not every prompt token), and an initial value for each state (the transformation matches only states
that have one).

**The step** (:class:`PagedModel`): the compiled model, its block pool (per layer a keys and a values tensor of
``[blocks, kv heads, block size, head dim]``, allocated once at load) and :meth:`PagedModel.run`, one pass over
``(row, new tokens)`` parts. Rows' keys and values are read and written in place (:meth:`PagedModel.read` and
:meth:`PagedModel.write` copy a range of a row's tokens, for the prefix cache; :meth:`PagedModel.copy_row` a
row's blocks, for n choices of one prompt).

**The batch** (:class:`PagedBatch`) is :class:`handlers.generation.running.RunningBatch` for this step, with the same
operations, so the scheduler, sampling, logprobs, structured outputs, n choices, the prefix cache and cancellation
work unchanged on it. Rows join and leave as block bookkeeping (no tensor copies, no padding), and chunked prefill
always rides in the running rows' pass: a pass is just more tokens.

At load the step is chosen and gated (:func:`select`), at ``handler.precision`` then fp32 (bf16: OpenVINO's bf16
decoder and keys and values, the output layer compiled apart at fp32, :class:`Fp32OutputLayer`): greedy decoding of
the gate prompts, batched and alone, must give eager fp32's tokens with log probabilities within the precision
gate's threshold, or the next precision is tried, and with none left the handler decodes eagerly, with the reasons
logged and shown by describe. ``auto`` first leaves out what the package-time build refused
(``scripts/build_decode_steps.py``, decode/manifest.json).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from handlers.generation.batch import DecodingBatch, NewTokens
from handlers.generation.decoding import FINISH_ERROR, Sequence, append_tokens, distinct_prompts
from handlers.generation.prefix_cache import NO_HIT, PrefixCache

logger = logging.getLogger(__name__)

SETTINGS = ("auto", "eager", "openvino")
WEIGHT_SETTINGS = ("auto", "full", "int8")  # handler.decode_weights (:func:`walk_order`)


@dataclass(frozen=True)
class StepPrecision:
    """What a paged step's precision means: OpenVINO's inference precision, its keys' and values' element type, and
    whether the decoder's weights are int8 (:func:`int8_weights`)."""

    compute: str
    kv: str
    int8_weights: bool = False


STEP_PRECISIONS = {
    "fp32": StepPrecision("fp32", "f32"),
    "bf16": StepPrecision("bf16", "bf16"),
    # int8 weights, fp32 everything else: OpenVINO's CPU plugin multiplies by the int8 matrices as they are (it
    # widens them inside the matmul), so a step reads a quarter of the weight bytes fp32 reads
    "int8": StepPrecision("fp32", "f32", int8_weights=True),
}
PAGED_PRECISIONS = ", ".join(STEP_PRECISIONS)
INT8_SMALLEST = 8  # a matrix with a side under this is left as it is (nothing to gain; a scale per handful)
OUTPUTS = ("logits", "hidden")  # the converted decoder's: the output layer's rows, and the hidden rows it reads
RowKV = list[tuple[torch.Tensor, torch.Tensor]]


class Unconvertible(RuntimeError):
    """The model could not be converted to, or compiled as, a paged-attention model; the message says why."""


# ------------------------------------------------------------------------------------------------ conversion
@dataclass(frozen=True)
class CacheShape:
    layers: int
    kv_heads: int
    head_dim: int


def cache_shape(config: Any) -> CacheShape:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return CacheShape(int(text.num_hidden_layers), int(kv_heads), int(head_dim))


class TracedDecoder(torch.nn.Module):
    """The decoder as ``convert_model`` traces it: keys and values in and out as tensors, logits at chosen rows."""

    def __init__(self, model: Any, layers: int) -> None:
        super().__init__()
        self.decoder = model.base_model
        self.output_layer = model.get_output_embeddings()
        self.config = model.config
        self.layers = layers

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        beam_idx: torch.Tensor,
        logits_rows: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache: Any = DynamicCache(config=self.config)  # full-attention layers (kv_cache.check_mergeable's kind)
        for index in range(self.layers):
            # the gather by beam_idx is what the paged transformation expects to find between a state and its use
            keys, values = (tensor.index_select(0, beam_idx) for tensor in past[2 * index : 2 * index + 2])
            layer = cache.layers[index]
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        hidden = self.decoder(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True)[0]
        # After the transformation every token is a row of its own (dim 0), so this picks tokens.
        chosen = hidden.index_select(0, logits_rows)
        present = [tensor for layer in cache.layers[: self.layers] for tensor in (layer.keys, layer.values)]
        # Both are outputs: a reduced-precision step ends at the hidden rows and runs the output layer apart, at fp32
        return (self.output_layer(chosen), chosen, *present)


def export(model: Any) -> Any:
    """The model's decoder traced as a stateful OpenVINO model (keys and values as state, each with an initial
    value): what the package-time build saves (:mod:`handlers.generation.decoder_export`) and :func:`to_paged`
    turns into the paged model; raises Unconvertible."""
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    shape = cache_shape(model.config)
    rows, past, new = 2, 3, 4
    example = (
        torch.zeros((rows, new), dtype=torch.long),
        torch.arange(past, past + new).expand(rows, new).contiguous(),
        torch.arange(rows, dtype=torch.int32),
        torch.tensor([1], dtype=torch.long),
        *[torch.zeros((rows, shape.kv_heads, past, shape.head_dim)) for _ in range(2 * shape.layers)],
    )
    names = ["input_ids", "position_ids", "beam_idx", "logits_rows"]
    pairs = {f"past.{layer}.{kind}": f"present.{layer}.{kind}" for layer in range(shape.layers)
             for kind in ("key", "value")}  # fmt: skip
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it fixes: they are fixed here
            converted = ov.convert_model(TracedDecoder(model, shape.layers).eval(), example_input=example)
        for port, name in zip(converted.inputs, names + list(pairs), strict=True):
            port.get_tensor().set_names({name})
        for port, name in zip(converted.outputs, [*OUTPUTS, *pairs.values()], strict=True):
            port.get_tensor().set_names({name})
        apply_make_stateful_transformation(converted, pairs)
        give_states_initial_values(converted, shape, ops)
    except Exception as error:  # the tracer or a transformation refused the model: it decodes eagerly
        raise Unconvertible(f"{type(error).__name__}: {first_line(error)}") from None
    return converted


def to_paged(stateful: Any) -> Any:
    """The stateful decoder (:func:`export`) with every attention replaced by OpenVINO's paged attention; raises
    Unconvertible."""
    from openvino._offline_transformations import paged_attention_transformation

    try:
        paged_attention_transformation(stateful)
    except Exception as error:
        raise Unconvertible(f"{type(error).__name__}: {first_line(error)}") from None
    kinds = {op.get_type_name() for op in stateful.get_ops()}
    if "PagedAttentionExtension" not in kinds or "ScaledDotProductAttention" in kinds:
        raise Unconvertible("the model's attention was not recognised by OpenVINO's paged-attention transformation")
    return stateful


def convert(model: Any, folder: Any = None) -> tuple[Any, CacheShape, str]:
    """The model as an OpenVINO paged-attention model (not compiled), its cache's shape, and where the decoder came
    from: ``folder``'s package-time export (:mod:`handlers.generation.decoder_export`) when it has one that fits
    the model, else traced now; raises Unconvertible."""
    from handlers.generation import decoder_export

    source = "traced at load"
    stateful = None
    if folder is not None and decoder_export.exported(folder):
        try:
            stateful = decoder_export.read(model, folder)
            source = f"read from the archive's {decoder_export.FOLDER}/{decoder_export.IR}"
        except decoder_export.ExportError as error:
            logger.warning("the archive's exported decoder is not used: %s; tracing the model instead", error)
            source = f"traced at load (the archive's export: {error})"
        except Exception as error:  # noqa: BLE001 - OpenVINO's reader refused it: the trace is the way that works
            logger.warning("the archive's exported decoder does not read: %s; tracing the model instead", error)
            source = f"traced at load (the archive's export does not read: {first_line(error)})"
    if stateful is None:
        stateful = export(model)
    return to_paged(stateful), cache_shape(model.config), source


@dataclass(frozen=True)
class Int8Weights:
    """What :func:`int8_weights` made int8: how many matrices, their fp32 bytes and their int8 bytes (scales too)."""

    matrices: int
    fp32_bytes: int
    int8_bytes: int

    def describe(self) -> str:
        return (f"int8, one scale per output channel: {self.matrices} decoder matrices, "
                f"{self.fp32_bytes / 2**20:.1f} MiB as fp32 -> {self.int8_bytes / 2**20:.1f} MiB; the output layer "
                "fp32")  # fmt: skip


def int8_weights(converted: Any) -> tuple[Any, Int8Weights]:
    """A copy of the converted decoder whose matmul weights are int8 with one fp32 scale per output channel
    (symmetric: the channel's largest magnitude maps to 127), dequantised in the graph (Convert, Multiply), a
    pattern OpenVINO's CPU plugin runs on the int8 matrix itself. The output layer (the matmul that makes the
    logits) keeps its fp32 weights: log probabilities, sampling and structured outputs' masks read its numbers, as
    bf16 keeps it. ``converted`` is left as it is (the fp32 and bf16 steps compile it); raises Unconvertible when
    the decoder has no matmul weight to make int8."""
    import openvino as ov
    import openvino.opset13 as ops

    model = converted.clone()
    output_layer = logits_matmul(model)
    matrices = fp32_bytes = int8_bytes = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or op is output_layer:
            continue
        weight = op.input(1).get_source_output().get_node()
        if weight.get_type_name() != "Constant" or weight.get_output_element_type(0) != ov.Type.f32:
            continue
        values = weight.get_data()
        if values.ndim != 2 or min(values.shape) < INT8_SMALLEST:
            continue
        across = 1 if op.get_attributes()["transpose_b"] else 0  # the input side: one scale per output channel
        scale = np.abs(values).max(axis=across, keepdims=True) / 127.0
        scale[scale == 0] = 1.0  # an all-zero channel stays zero
        quantised = np.clip(np.rint(values / scale), -127, 127).astype(np.int8)
        scale = scale.astype(np.float32)
        widened = ops.multiply(ops.convert(ops.constant(quantised), ov.Type.f32), ops.constant(scale))
        op.input(1).replace_source_output(widened.output(0))
        matrices += 1
        fp32_bytes += values.nbytes
        int8_bytes += quantised.nbytes + scale.nbytes
    if not matrices:
        raise Unconvertible("int8 weights: the decoder has no matmul weight to make int8")
    return model, Int8Weights(matrices, fp32_bytes, int8_bytes)


def logits_matmul(model: Any) -> Any:
    """The matmul that makes the converted decoder's logits (its output layer), or None."""
    node = model.output(OUTPUTS[0]).get_node()
    while node.get_type_name() != "MatMul" and node.get_input_size() > 0:
        node = node.input_value(0).get_node()
    return node if node.get_type_name() == "MatMul" else None


def give_states_initial_values(converted: Any, shape: CacheShape, ops: Any) -> None:
    """Every state read gets an initial value (empty keys/values for the pass's rows), and nothing but the gathers
    uses beam_idx: what the paged transformation needs to find and then remove them."""
    parameters = {
        name: parameter for parameter in converted.get_parameters() for name in parameter.output(0).get_names()
    }
    input_ids = parameters["input_ids"]

    def rows() -> Any:
        return ops.gather(ops.shape_of(input_ids), ops.constant([0]), ops.constant(0))

    variables = {variable.get_info().variable_id: variable for variable in converted.get_variables()}
    for op in converted.get_ordered_ops():
        if op.get_type_name() == "ReadValue" and op.get_input_size() == 0:
            dims = ops.constant(np.array([shape.kv_heads, 0, shape.head_dim], dtype=np.int64))
            empty = ops.broadcast(ops.constant(np.float32(0)), ops.concat([rows(), dims], 0))
            op.output(0).replace(ops.read_value(empty, variables[op.get_variable_id()]).output(0))
    for target in list(parameters["beam_idx"].output(0).get_target_inputs()):
        user = target.get_node()
        if user.get_type_name() == "ShapeOf":
            user.output(0).replace(ops.convert(rows(), user.get_output_element_type(0)).output(0))


def first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


# ------------------------------------------------------------------------------------------------ the step
class Fp32OutputLayer:
    """A torch Linear (the output layer) compiled by OpenVINO on its own at fp32: [rows, hidden] -> [rows, vocab].
    With torch's fp32 Linear instead, the 124 M model's bf16 paged step was slower than its fp32 one (25.1 against
    21.6 ms a row, package-time ranking, docs/results.md); compiled apart it is faster (17.6 against 21.4)."""

    def __init__(self, layer: torch.nn.Module, threads: int) -> None:
        import openvino as ov
        import openvino.opset13 as ops

        from handlers.core.openvino_settings import openvino_config

        if not isinstance(layer, torch.nn.Linear):
            raise Unconvertible(f"the output layer is {type(layer).__name__}, not a Linear: it cannot run apart")
        weight = layer.weight.detach().float().numpy()
        hidden = ops.parameter([-1, weight.shape[1]], ov.Type.f32)
        logits = ops.matmul(hidden, ops.constant(weight), False, True)
        if layer.bias is not None:
            logits = ops.add(logits, ops.constant(layer.bias.detach().float().numpy()))
        model = ov.Model([ops.result(logits)], [hidden], "output_layer")
        try:
            self.compiled = ov.Core().compile_model(model, "CPU", openvino_config("fp32", threads))
        except Exception as error:
            raise Unconvertible(f"compiling the output layer failed: {first_line(error)}") from None
        self.request = self.compiled.create_infer_request()

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        self.request.infer({0: hidden})
        return np.array(self.request.get_output_tensor(0).data, dtype=np.float32)


class StepFailed(RuntimeError):
    """A pass gave what it cannot have given right (fewer rows of logits than asked for)."""


class PoolExhausted(RuntimeError):
    """The block pool has no room for a pass (the scheduler's token budget should prevent it)."""


@dataclass
class PagedRow:
    """One row's keys and values: its blocks, in order, and how many of its tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    cached: int = 0


class PagedModel:
    """The compiled paged model, its block pool and one pass at a time (see the module's docstring)."""

    def __init__(
        self,
        converted: Any,
        shape: CacheShape,
        threads: int,
        tokens: int,
        rows: int,
        vocab: int,
        precision: str = "fp32",
        output_layer: torch.nn.Module | None = None,
        weights: Int8Weights | None = None,
    ) -> None:
        """``tokens``: the keys and values the rows may hold together (the scheduler's budget); ``rows``: how many
        rows there may be at once, each of which may leave one block partly empty; ``vocab``: the model's input
        embeddings (a token id past them would read zeros here, where torch raises); ``precision``: what the
        passes compute in, fp32 or bf16 (OpenVINO's inference precision; its paged attention then keeps keys and
        values in bf16 too), or int8 (``converted`` is then :func:`int8_weights`'s copy, whose ``weights`` are
        described; the passes compute in fp32); ``output_layer``: when given (a torch Linear), the compiled model
        ends at the hidden rows and this layer, compiled on its own at fp32 (:class:`Fp32OutputLayer`), computes
        the logits from them: an fp32 output layer under a bf16 decoder, as eager bf16 has (OpenVINO's precision
        hint would round its inputs too, and the CPU plugin takes no per-layer exception to it)."""
        import openvino as ov

        from handlers.core.openvino_settings import openvino_config

        self.vocab = vocab
        self.precision = precision
        self.weights = weights
        kind = STEP_PRECISIONS[precision]
        self.bf16_pool = kind.kv == "bf16"
        self.gate: dict[str, Any] | None = None  # its decoding gate's figures, once gated (compile_gated)
        self.output_layer = None if output_layer is None else Fp32OutputLayer(output_layer, threads)
        self.output = OUTPUTS[0] if output_layer is None else OUTPUTS[1]
        ending = ov.Model([converted.output(self.output).get_node()], converted.get_parameters(), "paged_decoder")
        config = {**openvino_config(kind.compute, threads), "KV_CACHE_PRECISION": kind.kv}
        try:
            self.compiled = ov.Core().compile_model(ending, "CPU", config)
        except Exception as error:
            raise Unconvertible(f"compiling the paged model failed: {first_line(error)}") from None
        self.shape = shape
        port = next(port for port in self.compiled.inputs if port.get_any_name() == "key_cache.0")
        self.block_size = int(port.get_partial_shape()[2].get_length())
        self.blocks = self.blocks_for(tokens) + rows
        self.request = self.compiled.create_infer_request()
        self.pool: list[tuple[np.ndarray, np.ndarray]] = []
        kind_of_value = getattr(ov.Type, kind.kv)
        for layer in range(shape.layers):
            tensors = []
            for cache in ("key_cache", "value_cache"):
                tensor = ov.Tensor(kind_of_value, [self.blocks, shape.kv_heads, self.block_size, shape.head_dim])
                self.request.set_tensor(f"{cache}.{layer}", tensor)
                # bf16 shows in numpy as float16 (same width): kept as raw 16-bit words, converted by torch
                tensors.append(tensor.data.view(np.uint16) if self.bf16_pool else tensor.data)
            self.pool.append((tensors[0], tensors[1]))
        self.free = list(range(self.blocks - 1, -1, -1))
        self.passes = 0

    @property
    def free_blocks(self) -> int:
        return len(self.free)

    def describe(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "output_layer": "compiled" if self.output_layer is None else "fp32, compiled apart",
            "weights": "as the model's" if self.weights is None else self.weights.describe(),
            "block_size": self.block_size,
            "blocks": self.blocks,
            "free_blocks": self.free_blocks,
        }

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens of one row."""
        return -(-tokens // self.block_size)

    def reserve(self, row: PagedRow, tokens: int) -> None:
        """Give ``row`` blocks for ``tokens`` tokens in all."""
        needed = self.blocks_for(tokens) - len(row.blocks)
        if needed > len(self.free):
            raise PoolExhausted(f"the key/value block pool is full ({self.blocks} blocks of {self.block_size} tokens)")
        for _ in range(max(needed, 0)):
            row.blocks.append(self.free.pop())

    def release(self, row: PagedRow) -> None:
        self.free.extend(reversed(row.blocks))
        row.blocks, row.cached = [], 0

    def run(self, parts: list[tuple[PagedRow, list[int], bool]]) -> torch.Tensor:
        """One pass: each part is (row, its new tokens, whether its last token's logits are wanted). Returns those
        logits, in the parts' order, as a ``[wanted, vocab]`` fp32 tensor; the rows then hold the new tokens."""
        for row, tokens, _ in parts:
            self.reserve(row, row.cached + len(tokens))
        counts = [len(tokens) for _, tokens, _ in parts]
        ends = np.cumsum([0, *counts])
        tables = [row.blocks for row, _, _ in parts]
        inputs = {
            "input_ids": np.fromiter(
                (t for _, tokens, _ in parts for t in tokens), dtype=np.int64, count=int(ends[-1])
            ),
            "position_ids": np.concatenate(
                [np.arange(row.cached, row.cached + len(tokens), dtype=np.int64) for row, tokens, _ in parts]
            ),
            "logits_rows": np.array([ends[i + 1] - 1 for i, part in enumerate(parts) if part[2]], dtype=np.int64),
            "past_lens": np.array([row.cached for row, _, _ in parts], dtype=np.int32),
            "subsequence_begins": ends.astype(np.int32),
            "block_indices": np.array([block for table in tables for block in table], dtype=np.int32),
            "block_indices_begins": np.cumsum([0, *(len(table) for table in tables)]).astype(np.int32),
            "max_context_len": np.array(max(row.cached + len(tokens) for row, tokens, _ in parts), dtype=np.int32),
        }
        if not len(inputs["logits_rows"]):  # the output layer always runs on something: one row, discarded
            inputs["logits_rows"] = np.array([0], dtype=np.int64)
        self.request.infer(inputs)
        self.passes += 1
        for row, tokens, _ in parts:
            row.cached += len(tokens)
        computed = self.request.get_tensor(self.output).data
        wanted = sum(1 for part in parts if part[2])
        rows = np.array(computed.reshape(-1, computed.shape[-1])[:wanted], dtype=np.float32)
        if len(rows) != wanted:  # seen: OpenVINO's int8 matmuls under an emulated AVX2 cap gave no rows at all
            raise StepFailed(f"the paged step computed {len(rows)} rows of logits for {wanted} rows")
        return torch.from_numpy(rows if self.output_layer is None else self.output_layer(rows))

    def positions(self, row: PagedRow, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.arange(start, stop)
        return np.asarray(row.blocks, dtype=np.int64)[tokens // self.block_size], tokens % self.block_size

    def read(self, row: PagedRow, start: int, stop: int) -> RowKV:
        """Keys and values of the row's tokens ``start``..``stop``-1, per layer ``[kv heads, tokens, head dim]``."""
        blocks, offsets = self.positions(row, start, stop)
        return [
            (self.from_pool(keys[blocks, :, offsets]), self.from_pool(values[blocks, :, offsets]))
            for keys, values in self.pool
        ]

    def from_pool(self, words: np.ndarray) -> torch.Tensor:
        """``[tokens, kv heads, head dim]`` of the pool as ``[kv heads, tokens, head dim]`` fp32."""
        tensor = torch.from_numpy(words.transpose(1, 0, 2).copy())
        return tensor.view(torch.bfloat16).float() if self.bf16_pool else tensor

    def to_pool(self, tensor: torch.Tensor) -> np.ndarray:
        """``[kv heads, tokens, head dim]`` as the pool holds it, ``[tokens, kv heads, head dim]``."""
        if self.bf16_pool:
            tensor = tensor.to(torch.bfloat16).view(torch.uint16)
        return tensor.numpy().transpose(1, 0, 2)

    def write(self, row: PagedRow, kv: RowKV) -> None:
        """Put ``kv`` (a prefix: tokens 0..n-1) into the row's blocks; the row then holds those n tokens."""
        tokens = int(kv[0][0].shape[-2])
        self.reserve(row, tokens)
        blocks, offsets = self.positions(row, 0, tokens)
        for (keys, values), (new_keys, new_values) in zip(self.pool, kv, strict=True):
            keys[blocks, :, offsets] = self.to_pool(new_keys)
            values[blocks, :, offsets] = self.to_pool(new_values)
        row.cached = tokens

    def copy_row(self, source: PagedRow) -> PagedRow:
        """A new row holding the same tokens as ``source`` (blocks of its own)."""
        row = PagedRow()
        self.reserve(row, source.cached)
        used = len(row.blocks)
        for keys, values in self.pool:
            keys[row.blocks] = keys[source.blocks[:used]]
            values[row.blocks] = values[source.blocks[:used]]
        row.cached = source.cached
        return row


# ------------------------------------------------------------------------------------------------ the batch
@dataclass
class PagedFilling:
    """A group of joining sequences whose prompts are being computed; equal prompts are one row (``source``)."""

    sequences: list[Sequence]
    source: list[int]  # per sequence: its prompt's row
    rows: list[PagedRow]  # per distinct prompt
    prompts: list[list[int]]
    first_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # row -> its prompt's last logits, once done

    def remaining(self, row: int) -> int:
        return len(self.prompts[row]) - self.rows[row].cached

    @property
    def left(self) -> int:
        return max(self.remaining(row) for row in range(len(self.rows)))

    @property
    def computing(self) -> list[Sequence]:
        return [self.sequences[self.source.index(row)] for row in range(len(self.rows))]


class PagedBatch(DecodingBatch):
    """:class:`handlers.generation.running.RunningBatch`'s operations on a :class:`PagedModel`."""

    def __init__(
        self,
        paged: PagedModel,
        stop_token_ids: Iterable[int] | None,
        prefix_cache: PrefixCache | None = None,
        chunk_tokens: int = 0,
    ) -> None:
        self.paged = paged
        self.stop_token_ids = frozenset(stop_token_ids or ())
        self.prefix_cache = prefix_cache
        self.chunk_tokens = chunk_tokens
        self.mixable = bool(chunk_tokens)  # a chunk is more tokens of the running rows' pass
        self.sequences: list[Sequence] = []
        self.row_of: dict[int, PagedRow] = {}  # id(sequence) -> its row
        self.filling: PagedFilling | None = None
        self.decoded = False
        self.computed_prompt_tokens = 0

    # -------------------------------------------------------------------------------------------- joining
    def start_filling(self, joining: list[Sequence]) -> PagedFilling | None:
        joining = [sequence for sequence in joining if not sequence.finished and self.embeds(sequence)]
        if not joining:
            return None
        computing, source = distinct_prompts(joining)
        rows = []
        try:
            for sequence in computing:
                row = PagedRow()
                rows.append(row)
                hit = self.prefix_cache.lookup(sequence.prompt_ids) if self.prefix_cache is not None else NO_HIT
                if hit.length and hit.kv is not None:
                    self.paged.write(row, hit.kv)
        except PoolExhausted:
            for row in rows:
                self.paged.release(row)
            raise
        return PagedFilling(joining, source, rows, [list(sequence.prompt_ids) for sequence in computing])

    def embeds(self, sequence: Sequence) -> bool:
        """Whether the model embeds every prompt token; a prompt it does not (a tokenizer with more ids than the
        model's embeddings) ends with its own error instead of reading zeros."""
        outside = [token for token in sequence.prompt_ids if not 0 <= token < self.paged.vocab]
        if outside:
            sequence.finish_reason, sequence.error_status = FINISH_ERROR, 500
            sequence.error = (
                f"prompt token id {outside[0]} is outside the model's {self.paged.vocab} input embeddings: the "
                "tokenizer and the model folder disagree"
            )
        return not outside

    def prefill(self, joining: list[Sequence]) -> NewTokens:
        filling = self.start_filling(joining)
        if filling is None:
            return {}
        try:
            self.pass_with(filling, filling.left, decode=False)
        except Exception:
            self.release_filling(filling)
            raise
        return self.finish_filling(filling)

    def abandon_filling(self) -> list[Sequence]:
        filling, self.filling = self.filling, None
        if filling is None:
            return []
        self.release_filling(filling)
        return filling.sequences

    def release_filling(self, filling: PagedFilling) -> None:
        for row in filling.rows:
            self.paged.release(row)

    # -------------------------------------------------------------------------------------------- passes
    def pass_with(self, filling: PagedFilling | None, columns: int, decode: bool) -> torch.Tensor:
        """One pass: the running rows' newest tokens (``decode``) and up to ``columns`` more prompt tokens of each
        row of ``filling``. Returns the running rows' logits; a filling row's last logits are kept in the filling."""
        parts: list[tuple[PagedRow, list[int], bool]] = []
        if decode:
            for sequence in self.sequences:
                row = self.row_of[id(sequence)]  # it holds the whole prompt: what it lacks are its newest tokens
                parts.append((row, sequence.token_ids[row.cached - len(sequence.prompt_ids) :], True))
        chunk_rows = self.chunk_parts(filling, columns, parts)
        if not parts:
            return torch.zeros((0, 0))
        logits = self.paged.run(parts)  # a failed pass leaves every row's count as it was (blocks are reused)
        running = len(self.sequences) if decode else 0
        position = running
        for index, taken, done in chunk_rows:
            self.computed_prompt_tokens += taken
            if done:
                assert filling is not None
                filling.first_logits[index] = logits[position]
                position += 1
        return logits[:running]

    @staticmethod
    def chunk_parts(
        filling: PagedFilling | None, columns: int, parts: list[tuple[PagedRow, list[int], bool]]
    ) -> list[tuple[int, int, bool]]:
        """Add each filling row's next ``columns`` prompt tokens to ``parts``; returns (row, tokens, last) for each."""
        chunk_rows: list[tuple[int, int, bool]] = []
        if filling is None:
            return chunk_rows
        for index, row in enumerate(filling.rows):
            taken = min(columns, filling.remaining(index))
            if taken > 0:
                done = taken == filling.remaining(index)
                parts.append((row, filling.prompts[index][row.cached : row.cached + taken], done))
                chunk_rows.append((index, taken, done))
        return chunk_rows

    def finish_filling(self, filling: PagedFilling) -> NewTokens:
        """The group's first tokens (its prompts are computed: their logits are kept in the filling); those that go
        on join the running rows."""
        if self.prefix_cache is not None:
            self.remember_prompts(filling)
        first = torch.stack([filling.first_logits[row] for row in range(len(filling.rows))])
        rows_for: list[PagedRow] = []
        used: set[int] = set()
        for position in filling.source:
            if position in used:  # another choice of the same prompt: blocks of its own with the same contents
                rows_for.append(self.paged.copy_row(filling.rows[position]))
            else:
                used.add(position)
                rows_for.append(filling.rows[position])
        new_tokens = append_tokens(first.index_select(0, torch.tensor(filling.source)), filling.sequences,
                                   self.stop_token_ids)  # fmt: skip
        for sequence, row in zip(filling.sequences, rows_for, strict=True):
            if sequence.finished:
                self.paged.release(row)
            else:
                self.sequences.append(sequence)
                self.row_of[id(sequence)] = row
        return new_tokens

    def remember_prompts(self, filling: PagedFilling) -> None:
        assert self.prefix_cache is not None
        for prompt, row in zip(filling.prompts, filling.rows, strict=True):
            missing = self.prefix_cache.missing(prompt)
            if missing:
                self.prefix_cache.store(prompt, missing.start, self.paged.read(row, missing.start, missing.stop))

    def step(self) -> NewTokens:
        if not self.sequences:
            return {}
        logits = self.pass_with(None, 0, decode=True)
        return append_tokens(logits, self.sequences, self.stop_token_ids)

    def advance(self) -> NewTokens:
        """The running rows' step with the next chunk of the group being computed riding in the same pass."""
        filling = self.filling
        self.decoded = bool(self.sequences)
        if filling is None:
            return self.step()
        columns = min(filling.left, max(1, self.chunk_tokens // len(filling.rows)))
        logits = self.pass_with(filling, columns, decode=self.decoded)
        new_tokens = append_tokens(logits, self.sequences, self.stop_token_ids) if self.decoded else {}
        if filling.left == 0:
            self.filling = None
            new_tokens.update(self.finish_filling(filling))
        return new_tokens

    # -------------------------------------------------------------------------------------------- leaving
    def remove(self, leaving: Iterable[Sequence]) -> None:
        leaving_ids = {id(sequence) for sequence in leaving}
        filling = self.filling
        if filling is not None:
            keep = [p for p, sequence in enumerate(filling.sequences) if id(sequence) not in leaving_ids]
            if not keep:
                self.abandon_filling()
            elif len(keep) < len(filling.sequences):
                self.keep_filling(filling, keep)
        staying = []
        for sequence in self.sequences:
            if id(sequence) in leaving_ids:
                self.paged.release(self.row_of.pop(id(sequence)))
            else:
                staying.append(sequence)
        self.sequences = staying

    def keep_filling(self, filling: PagedFilling, keep: list[int]) -> None:
        needed = sorted({filling.source[position] for position in keep})
        for row in range(len(filling.rows)):
            if row not in needed:
                self.paged.release(filling.rows[row])
        renumbered = {row: new for new, row in enumerate(needed)}
        filling.sequences = [filling.sequences[position] for position in keep]
        filling.source = [renumbered[filling.source[position]] for position in keep]
        filling.rows = [filling.rows[row] for row in needed]
        filling.prompts = [filling.prompts[row] for row in needed]
        filling.first_logits = {renumbered[r]: v for r, v in filling.first_logits.items() if r in renumbered}


# ------------------------------------------------------------------------------------------------ selection
@dataclass
class BackendOutcome:
    """What load made of ``handler.decode_step`` (describe shows it)."""

    setting: str
    serving: str
    reason: str
    seconds: float = 0.0
    paged: PagedModel | None = None
    refused: list[dict[str, str]] = field(default_factory=list)  # paged precisions tried and refused, with why
    decoder: str = ""  # where the serving paged step's decoder came from: the archive's export, or traced at load
    built: dict[str, Any] | None = None  # the package-time build's figures (decoder_export.summary), if any
    untried: dict[str, str] = field(default_factory=dict)  # precisions left out unmeasured (walk_order), with why

    def describe(self) -> dict[str, Any]:
        shown = {"setting": self.setting, "serving": self.serving, "reason": self.reason,
                 "seconds": round(self.seconds, 1)}  # fmt: skip
        if self.paged is not None:
            shown.update(self.paged.describe(), passes=self.paged.passes, gate=self.paged.gate, decoder=self.decoder)
        if self.refused:
            shown["refused"] = self.refused
        if self.untried:
            shown["untried"] = self.untried
        shown["package_time"] = self.built
        return shown


class Figures(Protocol):
    """A decoding gate's verdict (:class:`handlers.generation.precision.GateFigures`)."""

    @property
    def passed(self) -> bool: ...

    def summary(self) -> str: ...

    def describe(self) -> dict[str, Any]: ...


Gate = Callable[["PagedModel", str], Figures]  # (a paged step, its precision) -> its decoding against eager fp32's


def walk_order(precision: str, weights: str) -> tuple[list[str], set[str]]:
    """The paged step's precisions in the order tried, for ``handler.precision`` resolved to ``precision`` and
    ``handler.decode_weights`` ``weights``: (the order, those tried only where the package-time build ranked them).
    ``precision`` first, then fp32; int8 weights ahead of both unless ``weights`` is ``full``, and with ``auto`` only
    where the package-time build gated and timed them (a load-time gate alone would not say whether they pay)."""
    order = [precision] + (["fp32"] if precision != "fp32" else [])
    if weights == "full":
        return order, set()
    return ["int8", *order], ({"int8"} if weights == "auto" else set())


def select(
    model: Any,
    setting: str,
    threads: int,
    pool: tuple[int, int],
    precisions: list[str],
    gate: Gate,
    folder: Any = None,
    ranked_only: Iterable[str] = (),
) -> BackendOutcome:
    """Apply ``handler.decode_step``: ``eager``, or ``openvino`` when ``model`` (fp32) converts and the paged step
    passes ``gate`` (greedy decoding of the gate prompts against eager fp32's: the same tokens, log probabilities
    within the threshold) at the first of ``precisions`` that does (:data:`STEP_PRECISIONS`: bf16 only where the CPU
    computes it natively, with the output layer compiled apart at fp32; int8 weights on any); otherwise eager, with
    the reasons. ``auto`` is ``openvino``
    minus what the package-time build (``folder``'s decode/manifest.json) refused: a precision whose gate or
    conversion failed there, or that ran slower than eager on a CPU like this one. ``pool``: (tokens, rows) the
    block pool must hold (:class:`PagedModel`); ``ranked_only``: precisions tried only where that build ranked them
    (:func:`walk_order`). With a build made on a CPU of this kind, the precisions are tried fastest first, as it
    ranked them."""
    from handlers.core import runtime
    from handlers.generation import decoder_export

    manifest = decoder_export.read_manifest(folder) if folder is not None else None
    built = decoder_export.summary(manifest)
    if setting == "eager":
        return BackendOutcome(setting, "eager", "handler.decode_step is eager", built=built)
    started = time.perf_counter()
    refused: list[dict[str, str]] = []

    def eager(reason: str) -> BackendOutcome:
        logger.warning("decode_step %s: decoding stays eager: %s", setting, reason)
        return BackendOutcome(setting, "eager", reason, time.perf_counter() - started, refused=refused, built=built,
                              untried=untried)  # fmt: skip

    precisions, untried = leave_out_unranked(manifest, precisions, ranked_only, refused)
    if setting == "auto" and manifest is not None:
        precisions, denied = decoder_export.planned(manifest, precisions, runtime.cpu_kind())
        refused += denied
        if not precisions:
            return eager("; ".join(f"{entry['precision']}: {entry['reason']}" for entry in refused))
    try:
        converted, shape, source = convert(model, folder)
    except Unconvertible as error:
        refused.append({"precision": "any", "kind": "convert", "reason": str(error)})
        return eager(f"the model does not convert to OpenVINO paged attention: {error}")
    for precision in precisions:
        paged, kind, reason = compile_gated(model, converted, shape, threads, pool, precision, gate)
        if paged is not None and not kind:
            outcome = BackendOutcome(setting, "openvino", reason, time.perf_counter() - started, paged, refused,
                                     source, built, untried)  # fmt: skip
            logger.info("decode_step openvino: the %s paged-attention step serves (%s; decoder %s; %.0f s, %d blocks "
                        "of %d tokens)", precision, reason, source, outcome.seconds, paged.blocks,
                        paged.block_size)  # fmt: skip
            return outcome
        refused.append({"precision": precision, "kind": kind, "reason": reason})
        logger.warning("decode_step openvino %s refused: %s", precision, reason)
    return eager("; ".join(f"{entry['precision']}: {entry['reason']}" for entry in refused))


def leave_out_unranked(
    manifest: dict[str, Any] | None, precisions: list[str], ranked_only: Iterable[str], refused: list[dict[str, str]]
) -> tuple[list[str], dict[str, str]]:
    """``precisions`` without those of ``ranked_only`` the package-time build did not rank: one it refused is added
    to ``refused`` with its reason; one it did not measure is returned as untried (no verdict on the model)."""
    from handlers.generation import decoder_export

    untried: dict[str, str] = {}
    only = set(ranked_only)
    for precision in [wanted for wanted in precisions if wanted in only]:
        if decoder_export.ranked(manifest, "openvino", precision):
            continue
        precisions = [kept for kept in precisions if kept != precision]
        if entry := decoder_export.refusal(manifest, "openvino", precision):
            refused.append({"precision": precision, "kind": "package", "reason": f"at package time: {entry['reason']}"})
        else:
            why = "the archive has no package-time build" if manifest is None else "its build did not rank it"
            untried[precision] = f"tried only where the package-time build ranked it, and {why}"
    return precisions, untried


def compile_gated(
    model: Any, converted: Any, shape: CacheShape, threads: int, pool: tuple[int, int], precision: str, gate: Gate
) -> tuple[PagedModel | None, str, str]:
    """The paged step at ``precision`` gated by ``gate`` (its figures then on ``.gate``): (the step, or None where
    it cannot run here; "" if it passed, else what refused it: step, machine, convert, compile, run (it failed on
    the gate prompts) or gate; the reason). A step the gate refused is returned too (the package-time build times
    it all the same)."""
    from handlers.core import runtime

    kind = STEP_PRECISIONS.get(precision)
    if kind is None:
        return None, "step", f"the paged step computes {PAGED_PRECISIONS}"
    if kind.compute != "fp32" and (why := runtime.machine_can_run(kind.compute, torch.device("cpu"))):
        return None, "machine", why
    weights = None
    if kind.int8_weights:
        try:
            converted, weights = int8_weights(converted)
        except Unconvertible as error:
            return None, "convert", str(error)
    head = model.get_output_embeddings() if kind.compute != "fp32" else None
    vocab = int(model.get_input_embeddings().num_embeddings)
    try:
        paged = PagedModel(converted, shape, threads, *pool, vocab, precision, head, weights)
    except Unconvertible as error:
        return None, "compile", str(error)
    try:
        figures = gate(paged, precision)
    except Exception as error:  # noqa: BLE001 - a step that cannot decode the gate prompts is refused, not fatal
        return None, "run", f"the {precision} paged step failed on the gate prompts: {first_line(error)}"
    paged.gate = figures.describe()
    if not figures.passed:
        return paged, "gate", f"decoding gate: {figures.summary()}"
    return paged, "", f"passed the decoding gate: {figures.summary()}"
