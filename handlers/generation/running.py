"""The batch of sequences decoding together, which sequences join and leave between steps.

:class:`RunningBatch` holds the running sequences, their shared key/value cache and its attention mask
(:mod:`handlers.generation.kv_cache`). Two operations advance it, one forward pass each:

- :meth:`RunningBatch.prefill` runs the prompts of joining sequences (together, left-padded; with the prefix cache,
  only the part of each prompt not found there), gives each its first token, and merges the ones that go on into the
  running batch;
- :meth:`RunningBatch.step` feeds the newest token of every running sequence and gives each its next one.

:meth:`RunningBatch.remove` takes sequences out (finished: length, end-of-text, a stop sequence found in the text, an
error; or cancelled) and frees the cache columns no remaining row uses. Each sequence samples with its own seeded
generator and its rows compute exactly what they would alone, so its tokens do not depend on what it shares steps
with. Whole-batch decoding (:func:`generate`) is a prefill followed by steps; per-step scheduling
(:mod:`handlers.generation.scheduler`) interleaves prefills of new requests with the steps of running ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from handlers.generation import kv_cache
from handlers.generation.decoding import Sequence, StepCallback, append_tokens, left_pad, model_step, recompute
from handlers.generation.prefix_cache import NO_HIT, PrefixCache

NewTokens = dict[Sequence, int]  # the token each sequence got in one forward pass


class RunningBatch:
    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        stop_token_ids: Iterable[int] | None,
        prefix_cache: PrefixCache | None = None,
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

    @property
    def rows(self) -> int:
        return len(self.sequences)

    @property
    def width(self) -> int:
        """Columns of the cache: the longest row, gaps included."""
        return int(self.mask.shape[1])

    def prefill(self, joining: list[Sequence]) -> NewTokens:
        """Run the prompts of ``joining`` and give each its first token; those not finished by it join the batch."""
        joining = [sequence for sequence in joining if not sequence.finished]
        if not joining:
            return {}
        # Equal prompts (a request's n choices) are run once: their row's keys, values and logits are copied.
        computing, source = distinct_prompts(joining)
        prefix_cache = self.prefix_cache
        hits = [prefix_cache.lookup(s.prompt_ids) if prefix_cache is not None else NO_HIT for s in computing]
        cache, prefix_mask = kv_cache.from_rows(self.model, [hit.kv for hit in hits], self.device)
        rest = [sequence.prompt_ids[hit.length :] for sequence, hit in zip(computing, hits, strict=True)]
        input_ids, rest_mask, positions = left_pad(rest, self.pad_token_id, self.device)
        positions = positions + torch.tensor([[hit.length] for hit in hits], device=self.device)
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        logits, cache = model_step(self.model, input_ids, mask, positions, cache)
        self.computed_prompt_tokens += sum(len(tokens) for tokens in rest)
        if prefix_cache is not None:
            self.remember_prompts(computing, cache, mask)
        if len(computing) < len(joining):
            logits = logits.index_select(0, torch.tensor(source, device=logits.device))
            mask = self.select_rows(cache, mask, source)
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

    def remove_finished(self) -> list[Sequence]:
        finished = [sequence for sequence in self.sequences if sequence.finished]
        self.remove(finished)
        return finished


def distinct_prompts(sequences: list[Sequence]) -> tuple[list[Sequence], list[int]]:
    """(the first sequence of each distinct prompt, for each sequence the position of its prompt among those)."""
    first: dict[tuple[int, ...], int] = {}
    source = [first.setdefault(tuple(sequence.prompt_ids), len(first)) for sequence in sequences]
    computing = [sequences[source.index(position)] for position in range(len(first))]
    return computing, source


def generate(
    model: Any,
    sequences: list[Sequence],
    stop_token_ids: Iterable[int] | None,
    pad_token_id: int,
    use_cache: bool = True,
    on_step: StepCallback | None = None,
    prefix_cache: Any = None,
) -> list[Sequence]:
    """Decode every sequence until it stops or reaches its max_new_tokens; returns ``sequences`` (filled in place).

    ``stop_token_ids``: the end-of-text token id(s) that finish a sequence (empty: only the length limit does);
    ``prefix_cache``: a :class:`handlers.generation.prefix_cache.PrefixCache` the prompts reuse and fill.
    """
    if not use_cache:
        return recompute(model, sequences, frozenset(stop_token_ids or ()), pad_token_id, on_step)
    index = {sequence: position for position, sequence in enumerate(sequences)}
    batch = RunningBatch(model, pad_token_id, stop_token_ids, prefix_cache)
    new_tokens = batch.prefill(list(sequences))
    while True:
        if on_step is not None:
            on_step({index[sequence]: token for sequence, token in new_tokens.items()})
        batch.remove_finished()
        if not batch.rows:
            return sequences
        new_tokens = batch.step()
