"""The batch of sequences decoding together, which sequences join and leave between steps.

:class:`RunningBatch` holds the running sequences, their shared key/value cache and its attention mask
(:mod:`handlers.generation.kv_cache`). Each of these operations is one forward pass:

- :meth:`RunningBatch.prefill` runs the prompts of joining sequences (together, left-padded; with the prefix cache,
  only the part of each prompt not found there), gives each its first token, and merges the ones that go on into the
  running batch;
- :meth:`RunningBatch.step` feeds the newest token of every running sequence and gives each its next one;
- :meth:`RunningBatch.advance` (chunked prefill, per-step scheduling) does both at once: the running sequences'
  step and the next chunk of the joining group's prompts (:meth:`RunningBatch.begin_filling`) in one pass
  (:mod:`handlers.generation.mixed_pass`), or, for a model whose attention cannot be split that way, chunks in
  passes of their own alternating with steps.

:meth:`RunningBatch.remove` takes sequences out (finished: length, end-of-text, a stop sequence found in the text, an
error; or cancelled) and frees the cache columns no remaining row uses. Each sequence samples with its own seeded
generator and its rows compute exactly what they would alone, so its tokens do not depend on what it shares steps
with. Whole-batch decoding (:func:`generate`) is a prefill followed by steps; per-step scheduling
(:mod:`handlers.generation.scheduler`) interleaves prefills of new requests with the steps of running ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from handlers.generation import kv_cache, mixed_pass
from handlers.generation.batch import DecodingBatch, NewTokens
from handlers.generation.decoding import (
    Sequence,
    StepCallback,
    append_tokens,
    distinct_prompts,
    left_pad,
    model_step,
    recompute,
)
from handlers.generation.prefix_cache import NO_HIT, PrefixCache


@dataclass
class Filling:
    """A group of joining sequences whose prompts are being computed, possibly over several passes (chunks).

    Equal prompts (a request's n choices) are one row of the tensors here, computed once: ``source`` says which row
    each sequence's prompt is, and :meth:`RunningBatch.finish_filling` copies the row to each of them."""

    sequences: list[Sequence]
    source: list[int]  # per sequence: its prompt's row in the tensors below
    cache: Any  # the rows' keys and values so far: prefixes from the prefix cache, then the chunks computed
    mask: torch.Tensor  # [rows, columns of cache]
    input_ids: torch.Tensor  # [rows, width]: the part of each prompt to compute, left-padded
    rest_mask: torch.Tensor  # [rows, width]
    positions: torch.Tensor  # [rows, width]
    done: int = 0  # columns of input_ids computed

    @property
    def left(self) -> int:
        return int(self.input_ids.shape[1]) - self.done

    @property
    def rows(self) -> int:
        """Rows being computed: one per distinct prompt."""
        return int(self.input_ids.shape[0])

    @property
    def computing(self) -> list[Sequence]:
        """A sequence for each row (the first that has its prompt)."""
        return [self.sequences[self.source.index(row)] for row in range(self.rows)]

    def keep_rows(self, keep: list[int]) -> None:
        """Keep the sequences at positions ``keep``, and only the rows their prompts still need."""
        rows = sorted({self.source[position] for position in keep})
        renumbered = {row: new for new, row in enumerate(rows)}
        self.sequences = [self.sequences[position] for position in keep]
        self.source = [renumbered[self.source[position]] for position in keep]
        if len(rows) == self.rows:
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask = kv_cache.select_rows(self.cache, self.mask, rows)
        self.input_ids, self.rest_mask, self.positions = (
            tensor.index_select(0, index) for tensor in (self.input_ids, self.rest_mask, self.positions)
        )


class RunningBatch(DecodingBatch):
    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        stop_token_ids: Iterable[int] | None,
        prefix_cache: PrefixCache | None = None,
        chunk_tokens: int = 0,
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.stop_token_ids = frozenset(stop_token_ids or ())
        # Rows join a running batch, reuse prefixes and free columns only in a full-attention cache; another kind
        # (sliding window) decodes one whole batch at a time, its leaving rows dropped as before.
        self.mergeable = not kv_cache.unsupported_layers(model)
        self.prefix_cache = prefix_cache if self.mergeable else None
        self.device = next(model.parameters()).device
        self.sequences: list[Sequence] = []  # row order of the cache
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.computed_prompt_tokens = 0  # prompt tokens run through the model (what prefix reuse saves)
        # Chunked prefill (advance): a joining group's prompts are computed at most chunk_tokens tokens per pass,
        # inside the running rows' decoding passes where the model allows (mixed_pass), else in passes of their own
        # that alternate with decoding steps. 0: whole prompts in a pass of their own (prefill).
        self.chunk_tokens = chunk_tokens if self.mergeable else 0
        self.mixable = bool(self.chunk_tokens) and mixed_pass.enable(model)
        self.filling: Filling | None = None  # the group whose prompts are being computed
        self.decoded = False  # whether the last advance() stepped the running rows
        self.chunk_was_last = False  # alternating: the last pass was a chunk of its own

    @property
    def width(self) -> int:
        """Columns of the cache: the longest row, gaps included."""
        return int(self.mask.shape[1])

    def prefill(self, joining: list[Sequence]) -> NewTokens:
        """Run the prompts of ``joining`` and give each its first token; those not finished by it join the batch."""
        filling = self.start_filling(joining)
        if filling is None:
            return {}
        logits = self.fill(filling, filling.left)
        return self.finish_filling(filling, logits)

    def start_filling(self, joining: list[Sequence]) -> Filling | None:
        """The joining sequences' prompts ready to compute (prefixes found in the prefix cache already in their
        cache, the rest left-padded); None when every one is finished already."""
        joining = [sequence for sequence in joining if not sequence.finished]
        if not joining:
            return None
        # Equal prompts (a request's n choices) are computed once: finish_filling copies their row.
        computing, source = distinct_prompts(joining)
        prefix_cache = self.prefix_cache
        hits = [prefix_cache.lookup(s.prompt_ids) if prefix_cache is not None else NO_HIT for s in computing]
        cache, prefix_mask = kv_cache.from_rows(self.model, [hit.kv for hit in hits], self.device)
        rest = [sequence.prompt_ids[hit.length :] for sequence, hit in zip(computing, hits, strict=True)]
        input_ids, rest_mask, positions = left_pad(rest, self.pad_token_id, self.device)
        positions = positions + torch.tensor([[hit.length] for hit in hits], device=self.device)
        return Filling(joining, source, cache, prefix_mask, input_ids, rest_mask, positions)

    def fill(self, filling: Filling, columns: int) -> torch.Tensor:
        """A pass of its own over the next ``columns`` prompt columns of ``filling``; returns the last column's
        logits (the first tokens' when it was the last chunk), one row per distinct prompt."""
        taken = slice(filling.done, filling.done + columns)
        mask = torch.cat([filling.mask, filling.rest_mask[:, taken]], dim=1)
        logits, filling.cache = model_step(
            self.model, filling.input_ids[:, taken], mask, filling.positions[:, taken], filling.cache
        )
        filling.mask, filling.done = mask, filling.done + columns
        self.computed_prompt_tokens += int(filling.rest_mask[:, taken].sum())
        return logits

    def finish_filling(self, filling: Filling, logits: torch.Tensor) -> NewTokens:
        """The first tokens of a group whose prompts are computed (``logits``: their last column's, one row per
        distinct prompt); those that go on join the running batch."""
        joining, cache, mask = filling.sequences, filling.cache, filling.mask
        if self.prefix_cache is not None:
            self.remember_prompts(filling.computing, cache, mask)
        if filling.rows < len(joining):  # a prompt's row copied to each sequence that has it (n choices)
            logits = logits.index_select(0, torch.tensor(filling.source, device=logits.device))
            mask = self.select_rows(cache, mask, filling.source)
        new_tokens = append_tokens(logits, joining, self.stop_token_ids)
        staying = [row for row, sequence in enumerate(joining) if not sequence.finished]
        if not staying:
            return new_tokens
        if len(staying) < len(joining):
            mask = self.select_rows(cache, mask, staying)
        if self.mergeable:
            mask = kv_cache.drop_dead_columns(cache, mask)
        if self.cache is None or not self.sequences:
            self.cache, self.mask = cache, mask
        elif not self.mergeable:
            raise kv_cache.UnsupportedCache("this model's cache cannot take rows into a running batch")
        else:
            self.cache, self.mask = kv_cache.merge(self.cache, self.mask, cache, mask)
        self.sequences += [joining[row] for row in staying]
        return new_tokens

    def abandon_filling(self) -> list[Sequence]:
        """Drop the group being computed (its pass failed); returns its sequences, to be prefilled again."""
        filling, self.filling = self.filling, None
        return filling.sequences if filling is not None else []

    def advance(self) -> NewTokens:
        """One forward pass with chunked prefill: the running rows' decoding step and/or the next chunk (at most
        ``chunk_tokens`` prompt tokens) of the group being computed; after its last chunk the group has its first
        tokens and joins the batch. With :mod:`mixed_pass` both ride in one pass; otherwise a chunk gets a pass of
        its own, alternating with decoding steps, so a stream waits at most one chunk between two of its tokens."""
        filling = self.filling
        self.decoded = False
        if filling is None:
            self.decoded = bool(self.sequences)
            return self.step()
        columns = min(filling.left, max(1, self.chunk_tokens // filling.rows))
        if self.sequences and self.mixable:
            self.decoded = True
            return self.mixed(filling, columns)
        if self.sequences and self.chunk_was_last:
            self.chunk_was_last, self.decoded = False, True
            return self.step()
        self.chunk_was_last = True
        logits = self.fill(filling, columns)
        if filling.left:
            return {}
        self.filling = None
        return self.finish_filling(filling, logits)

    def mixed(self, filling: Filling, columns: int) -> NewTokens:
        """One pass (mixed_pass) of the running rows' decoding step and ``columns`` prompt columns of ``filling``."""
        rows, joining = self.rows, filling.rows
        taken = slice(filling.done, filling.done + columns)
        last = columns == filling.left
        decode_mask = torch.cat([self.mask, self.mask.new_ones((rows, 1))], dim=1)
        chunk_mask = torch.cat([filling.mask, filling.rest_mask[:, taken]], dim=1)
        before = int(filling.mask.shape[1])
        allowed = chunk_mask.bool()[:, None, None, :].repeat(1, 1, columns, 1)  # [k, 1, c, before + c]
        square = torch.ones((columns, columns), dtype=torch.bool, device=self.device)
        allowed[..., before:] &= square.tril()  # causal within the chunk
        # A padding column sees itself: a query that sees nothing would make NaN, which its masked-out key and
        # value would carry into every later query's weighted sum (0 x NaN).
        allowed[..., before:] |= torch.eye(columns, dtype=torch.bool, device=self.device)
        plan = mixed_pass.MixedPlan(rows, joining, columns, decode_mask.bool()[:, None, None, :], allowed)
        newest = torch.tensor([s.token_ids[-1] for s in self.sequences], device=self.device)
        input_ids = torch.cat([newest, filling.input_ids[:, taken].flatten()])[None]
        positions = torch.cat([self.mask.sum(dim=1), filling.positions[:, taken].flatten()])[None]
        keep = torch.arange(rows, device=self.device)
        if last:  # the last column of each joining row: its first token
            keep = torch.cat([keep, rows + torch.arange(joining, device=self.device) * columns + columns - 1])
        saved = kv_cache.snapshot(self.cache)
        try:
            logits = mixed_pass.forward(self.model, input_ids, positions, plan, keep, self.cache, filling.cache)
        except Exception:
            kv_cache.restore(self.cache, saved)  # the running rows as they were; the group is computed again
            raise
        self.mask, filling.mask, filling.done = decode_mask, chunk_mask, filling.done + columns
        self.computed_prompt_tokens += int(filling.rest_mask[:, taken].sum())
        new_tokens = append_tokens(logits[:rows], self.sequences, self.stop_token_ids)
        if last:
            self.filling = None
            new_tokens.update(self.finish_filling(filling, logits[rows:]))
        return new_tokens

    def remember_prompts(self, joining: list[Sequence], cache: Any, mask: torch.Tensor) -> None:
        """Give the prefix cache the whole blocks of each prompt it does not hold yet."""
        assert self.prefix_cache is not None
        for row, sequence in enumerate(joining):
            missing = self.prefix_cache.missing(sequence.prompt_ids)
            if missing:
                kv = kv_cache.row_columns(cache, mask, row, missing.start, missing.stop)
                self.prefix_cache.store(sequence.prompt_ids, missing.start, kv)

    def step(self) -> NewTokens:
        """One decoding step of every running sequence: feed its newest token, choose its next."""
        if not self.sequences:
            return {}
        input_ids = torch.tensor([[s.token_ids[-1]] for s in self.sequences], device=self.device)
        positions = self.mask.sum(dim=1, keepdim=True)  # the new token's position: the real tokens before it
        mask = torch.cat([self.mask, self.mask.new_ones((self.rows, 1))], dim=1)
        saved = kv_cache.snapshot(self.cache)
        try:
            logits, _ = model_step(self.model, input_ids, mask, positions, self.cache)
        except Exception:
            kv_cache.restore(self.cache, saved)  # a failed step leaves the batch as it was
            raise
        self.mask = mask
        return append_tokens(logits, self.sequences, self.stop_token_ids)

    def remove(self, leaving: Iterable[Sequence]) -> None:
        """Take sequences out of the batch (finished or cancelled) and free what only they used."""
        leaving_ids = {id(sequence) for sequence in leaving}
        filling = self.filling
        if filling is not None:  # cancelled while its prompt was being computed
            staying = [row for row, sequence in enumerate(filling.sequences) if id(sequence) not in leaving_ids]
            if not staying:
                self.filling = None
            elif len(staying) < len(filling.sequences):
                filling.keep_rows(staying)
        keep = [row for row, sequence in enumerate(self.sequences) if id(sequence) not in leaving_ids]
        if len(keep) == self.rows:
            return
        self.sequences = [self.sequences[row] for row in keep]
        if not keep:
            self.cache = None
            self.mask = self.mask.new_zeros((0, 0))
            return
        self.mask = self.select_rows(self.cache, self.mask, keep)
        if self.mergeable:
            self.mask = kv_cache.drop_dead_columns(self.cache, self.mask)

    def select_rows(self, cache: Any, mask: torch.Tensor, keep: list[int]) -> torch.Tensor:
        if self.mergeable:
            return kv_cache.select_rows(cache, mask, keep)
        index = torch.tensor(keep, device=mask.device)
        cache.batch_select_indices(index)  # the cache's own row selection, whatever its layers keep
        return mask.index_select(0, index)


def new_batch(
    model: Any,
    pad_token_id: int,
    stop_token_ids: Iterable[int] | None,
    prefix_cache: PrefixCache | None,
    chunk_tokens: int,
    paged: Any = None,
) -> DecodingBatch:
    """The running batch for ``model``'s eager passes, or for a paged OpenVINO step (``paged``)."""
    if paged is not None:
        from handlers.generation.paged_openvino import PagedBatch

        return PagedBatch(paged, stop_token_ids, prefix_cache, chunk_tokens)
    return RunningBatch(model, pad_token_id, stop_token_ids, prefix_cache, chunk_tokens)


def generate(
    model: Any,
    sequences: list[Sequence],
    stop_token_ids: Iterable[int] | None,
    pad_token_id: int,
    use_cache: bool = True,
    on_step: StepCallback | None = None,
    prefix_cache: Any = None,
    paged: Any = None,
) -> list[Sequence]:
    """Decode every sequence until it stops or reaches its max_new_tokens; returns ``sequences`` (filled in place).

    ``stop_token_ids``: the end-of-text token id(s) that finish a sequence (empty: only the length limit does);
    ``prefix_cache``: a :class:`handlers.generation.prefix_cache.PrefixCache` the prompts reuse and fill;
    ``paged``: a :class:`handlers.generation.paged_openvino.PagedModel` that runs the passes instead of ``model``.
    """
    if not use_cache:
        return recompute(model, sequences, frozenset(stop_token_ids or ()), pad_token_id, on_step)
    index = {sequence: position for position, sequence in enumerate(sequences)}
    batch = new_batch(model, pad_token_id, stop_token_ids, prefix_cache, 0, paged)
    new_tokens = batch.prefill(list(sequences))
    while True:
        if on_step is not None:
            on_step({index[sequence]: token for sequence, token in new_tokens.items()})
        batch.remove_finished()
        if not batch.rows:
            return sequences
        new_tokens = batch.step()
