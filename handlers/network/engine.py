"""The network engine: a team's own program computed in process for a batch of requests, with no TorchServe in it.

:meth:`NetworkEngine.infer` takes each request's input tensors as they came (:class:`WireTensor`, from any dialect,
handlers/network/oip.py) and returns, per request, its outputs by name or its own :class:`RequestError`:

1. each request is checked alone against the signature (handlers/network/inputs.py): a refusal is that request's
   answer and touches no other;
2. the accepted requests are grouped by their inputs' sizes beyond the rows (a sequence model's requests of one
   length together), and each group's tensors are concatenated along the rows;
3. each group is computed in passes of at most ``max_rows_per_pass`` rows (a pass with fewer rows than the program
   was exported for is padded with copies of its last row, and the padding is dropped);
4. each request's rows are sliced back out of its group's outputs, so its answer is what it would get alone.

A pass that raises fails only its own group; when several requests shared it, each is computed again alone, so a
request that trips the program is the only one answered with the failure (500; 507 for out of memory).

Limits: ``max_rows_per_request`` (413 beyond it) and ``max_rows_per_pass`` are the engine's options; a signature file
and the rows range the program was exported for can only lower them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from handlers.core.config import Option, validate
from handlers.core.errors import RequestError, server_failure
from handlers.network.inputs import Checked, WireTensor, check_request, native_tensor
from handlers.network.signature import Signature, SignatureError

logger = logging.getLogger(__name__)

NETWORK_OPTIONS: dict[str, Option] = {
    "max_rows_per_request": Option(
        int, 1024, minimum=1, help="rows one request may hold (413 beyond); a signature file may set a lower ceiling"
    ),
    "max_rows_per_pass": Option(
        int,
        256,
        minimum=1,
        help="rows one forward pass may hold (larger groups are split); the program's exported "
        "rows range and a signature file may lower it",
    ),
}

Outputs = dict[str, torch.Tensor]


class NetworkEngine:
    def __init__(
        self,
        program: Callable[..., Any],
        signature: Signature,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.program = program
        self.signature = signature
        self.config = validate(options, NETWORK_OPTIONS)
        limits, rows = signature.limits, signature.rows
        self.max_rows_per_request = lowest(self.config["max_rows_per_request"], limits.max_rows_per_request)
        self.max_rows_per_pass = lowest(self.config["max_rows_per_pass"], limits.max_rows_per_pass, rows.high)
        self.min_rows_per_pass = max(1, rows.low)
        if self.max_rows_per_pass < self.min_rows_per_pass:
            raise SignatureError(
                f"max_rows_per_pass {self.max_rows_per_pass} is below the {self.min_rows_per_pass} rows the program "
                "was exported for at least"
            )
        if signature.example is not None:
            self.check_example(signature.example)

    def check_example(self, example: Mapping[str, Any]) -> None:
        """The signature file's example must be a request the program answers."""
        [answer] = self.infer([{name: native_tensor(name, data) for name, data in example.items()}])
        if isinstance(answer, RequestError):
            raise SignatureError(f"signature example: {answer.message}")

    def infer(self, requests: Sequence[Mapping[str, WireTensor]]) -> list[Outputs | RequestError]:
        """Each request's outputs (its rows only; without the rows dimension where it sent one row without it), or
        its error."""
        results: list[Outputs | RequestError | None] = [None] * len(requests)
        groups: dict[Any, list[tuple[int, Checked]]] = {}
        for index, wires in enumerate(requests):
            try:
                checked = check_request(wires, self.signature, self.max_rows_per_request)
            except RequestError as error:
                results[index] = error
                continue
            groups.setdefault(checked.group_key(), []).append((index, checked))
        with torch.inference_mode():
            for members in groups.values():
                answers = self.compute_group([checked for _, checked in members])
                for (index, _), answer in zip(members, answers, strict=True):
                    results[index] = answer
        return [result for result in results if result is not None]

    def compute_group(self, members: Sequence[Checked]) -> list[Outputs | RequestError]:
        """One group's answers; when its computation fails and it holds several requests, each is computed alone."""
        try:
            outputs = self.compute([torch.cat(parts) for parts in zip(*(m.tensors for m in members), strict=True)])
        except Exception as error:  # a failing program must fail its own requests, not the worker
            if len(members) > 1:
                return [answer for member in members for answer in self.compute_group([member])]
            logger.warning("the program failed on a request of %d rows", members[0].rows, exc_info=True)
            return [server_failure(error)]
        answers: list[Outputs | RequestError] = []
        start = 0
        for member in members:
            stop = start + member.rows
            answers.append({name: cut(tensor, start, stop, member.one_row) for name, tensor in outputs.items()})
            start = stop
        return answers

    def compute(self, tensors: Sequence[torch.Tensor]) -> Outputs:
        """The program's outputs for these rows, in passes of at most max_rows_per_pass."""
        rows = tensors[0].shape[0]
        passes: list[Outputs] = []
        for start in range(0, rows, self.max_rows_per_pass):
            part = [t[start : start + self.max_rows_per_pass] for t in tensors]
            passes.append(self.one_pass(part))
        if len(passes) == 1:
            return passes[0]
        return {name: torch.cat([p[name] for p in passes]) for name in passes[0]}

    def one_pass(self, tensors: Sequence[torch.Tensor]) -> Outputs:
        rows = tensors[0].shape[0]
        missing = self.min_rows_per_pass - rows
        if missing > 0:  # the program was exported for more rows than this pass has: pad with the last row
            tensors = [torch.cat([t, t[-1:].expand(missing, *t.shape[1:])]) for t in tensors]
        outputs = self.signature.call(self.program, tensors)
        for name, tensor in outputs.items():
            if tensor.dim() == 0 or tensor.shape[0] != rows + max(missing, 0):
                raise RuntimeError(f"output {name!r} has shape {list(tensor.shape)}; expected one row per input row")
        return {name: tensor[:rows] for name, tensor in outputs.items()}


def cut(tensor: torch.Tensor, start: int, stop: int, one_row: bool) -> torch.Tensor:
    return tensor[start] if one_row else tensor[start:stop]


def lowest(*limits: int | None) -> int:
    return min(limit for limit in limits if limit is not None)
