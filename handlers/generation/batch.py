"""What the scheduler (:mod:`handlers.generation.scheduler`) and whole-batch decoding
(:func:`handlers.generation.running.generate`) drive: the running sequences of one decoding step, whatever runs their
passes. Two steps implement it: :class:`handlers.generation.running.RunningBatch` (the model's eager passes over a
right-aligned key/value cache) and :class:`handlers.generation.paged_openvino.PagedBatch` (OpenVINO paged attention
over a block pool). The bookkeeping they share lives here; each pass is theirs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from handlers.generation.decoding import Sequence

NewTokens = dict[Sequence, int]  # the token each sequence got in one forward pass


class DecodingBatch:
    """The running sequences and the group of joining ones whose prompts are being computed (``filling``)."""

    sequences: list[Sequence]  # the running rows, in their order
    filling: Any  # the joining group being computed (chunk by chunk), or None
    chunk_tokens: int  # prompt tokens a joining group computes per pass (0: whole prompts in a pass of their own)
    mixable: bool  # whether a chunk rides in the running rows' pass
    decoded: bool  # whether the last advance() stepped the running rows
    computed_prompt_tokens: int  # prompt tokens run through the model (what prefix reuse saves)

    @property
    def rows(self) -> int:
        return len(self.sequences)

    def start_filling(self, joining: list[Sequence]) -> Any:
        """The joining sequences' prompts ready to compute; None when every one is finished already."""
        raise NotImplementedError

    def prefill(self, joining: list[Sequence]) -> NewTokens:
        """Run the prompts of ``joining`` and give each its first token; those not finished by it join the batch."""
        raise NotImplementedError

    def begin_filling(self, joining: list[Sequence]) -> None:
        """Start computing the prompts of ``joining`` (chunk by chunk in the next :meth:`advance` calls)."""
        if self.filling is not None:
            raise RuntimeError("a group of prompts is being computed already")
        self.filling = self.start_filling(joining)

    def abandon_filling(self) -> list[Sequence]:
        """Drop the group being computed (its pass failed); returns its sequences, to be prefilled again."""
        raise NotImplementedError

    def step(self) -> NewTokens:
        """One decoding step of every running sequence: feed its newest token, choose its next."""
        raise NotImplementedError

    def advance(self) -> NewTokens:
        """One pass with chunked prefill: the running rows' step and/or the next chunk of the joining group."""
        raise NotImplementedError

    def remove(self, leaving: Iterable[Sequence]) -> None:
        """Take sequences out of the batch (finished or cancelled) and free what only they used."""
        raise NotImplementedError

    def remove_finished(self) -> list[Sequence]:
        finished = [sequence for sequence in self.sequences if sequence.finished]
        self.remove(finished)
        return finished
