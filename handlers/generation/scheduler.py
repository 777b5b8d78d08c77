"""Per-step scheduling: which requests decode in the next forward pass, and what each pass was.

TorchServe's ``continuousBatching`` frontend hands the worker, at every step, the requests it is serving: the ones
already decoding (by request id) and newly arrived ones, up to ``batchSize``; a request whose client has gone is no
longer among them. :class:`StepScheduler` keeps each request's decoding state between those calls and decides what the
next forward pass does:

- newly arrived requests wait for room (:attr:`StepScheduler.max_batch_tokens`), then their prompts are
  **prefilled** together. With chunked prefill (``RunningBatch.chunk_tokens``, the handler's
  ``prefill_chunk_tokens``) at most that many prompt tokens are computed per pass, inside the running requests'
  decoding pass (:mod:`handlers.generation.mixed_pass`): a long prompt is spread over several steps and no step
  stalls the streams for a whole prompt; the last chunk gives each its first token. Without it (0) they are
  prefilled whole in a pass of their own, which gives each its first token while the running requests wait;
- otherwise (and beside the chunks) every running request **steps** once (one new token each).

A request leaves as soon as it is finished (length, end-of-text, a stop sequence, an error) or missing (cancelled), so
its answer goes out at once and its rows stop costing steps. The room a request needs is counted at its longest
(prompt + max_new_tokens) for every row of the batch, as the batch's cache is as wide as its longest row: the running
batch never holds more than ``max_batch_tokens`` tokens' worth of keys and values. Nothing here knows about HTTP or
TorchServe's messages (handlers/generation/loop.py drives it, handlers/generator.py adapts TorchServe to that); each
piece can be tested in-process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from handlers.generation.batch import DecodingBatch, NewTokens
from handlers.generation.decoding import FINISH_ERROR, Sequence
from handlers.generation.requests import AcceptedGeneration, Generation

logger = logging.getLogger(__name__)

PREFILL = "prefill"
DECODE = "decode"
IDLE = "idle"


@dataclass
class Active:
    """One request the worker is serving, from its arrival to its answer."""

    request_id: str
    generation: Generation  # its sequence, text and request
    arrived: float  # perf_counter when the worker first saw it
    reserve: int  # tokens it may need: prompt + max_new_tokens
    payload: AcceptedGeneration  # the accepted request: what its answer is framed from
    # Where the similarity cache keeps its answer when it is done (the group and prompt vector it was looked up
    # with); None: the cache did not look it up.
    remember: tuple[bytes, Any] | None = None
    opened: bool = False  # a piece of its stream went out: its status is 200 already, its end closes the stream
    first_token_at: float | None = None
    admitted: bool = False
    # n > 1: choices 1.. of a request are rows of their own with ids of their own; this is the request's id (what
    # TorchServe hands over), which its choice 0 has as request_id.
    choice_of: str | None = None

    @property
    def sequence(self) -> Sequence:
        return self.generation.sequence

    @property
    def client_id(self) -> str:
        """The id of the request TorchServe serves (shared by a request's choices)."""
        return self.choice_of or self.request_id


@dataclass
class Iteration:
    """What one call did: ``kind`` (prefill, decode or idle), the tokens it produced, and which requests failed."""

    kind: str
    new_tokens: dict[str, int] = field(default_factory=dict)  # request id -> token
    failed: dict[str, str] = field(default_factory=dict)  # request id -> why its pass failed
    rows: int = 0  # sequences in the forward pass
    seconds: float = 0.0


class StepScheduler:
    def __init__(self, batch: DecodingBatch, max_batch_tokens: int) -> None:
        self.batch = batch
        self.max_batch_tokens = max_batch_tokens
        self.active: dict[str, Active] = {}  # by request id, in arrival order
        self.decode_steps = 0
        self.prefills = 0

    def knows(self, request_id: str) -> bool:
        return request_id in self.active

    def add(self, active: Active) -> None:
        self.active[active.request_id] = active

    @property
    def running(self) -> list[Active]:
        return [active for active in self.active.values() if active.admitted]

    @property
    def waiting(self) -> list[Active]:
        return [active for active in self.active.values() if not active.admitted]

    def cancel_missing(self, present: Iterable[str]) -> list[Active]:
        """Forget the requests TorchServe no longer sends (their clients went away); returns them."""
        present = set(present)
        gone = [active for active in self.active.values() if active.client_id not in present]
        self.release(gone)
        return gone

    def release(self, leaving: list[Active]) -> None:
        """Take requests out: their rows leave the batch, their state is dropped."""
        if not leaving:
            return
        self.batch.remove(active.sequence for active in leaving if active.admitted)
        for active in leaving:
            self.active.pop(active.request_id, None)

    def finished(self) -> list[Active]:
        """The requests whose sequences are finished; they are released."""
        done = [active for active in self.active.values() if active.sequence.finished]
        self.release(done)
        return done

    def admissible(self) -> list[Active]:
        """The waiting requests that fit beside the running ones, in arrival order (the first that does not fit
        stops the scan, so a long request is not passed by ever more short ones). A request's n choices are admitted
        together (their prompt is prefilled once for all of them), as n rows."""
        running = self.running
        rows = len(running)
        longest = max((active.reserve for active in running), default=0)
        admitted: list[Active] = []
        for unit in requests_of(self.waiting):
            widest = max(longest, *(active.reserve for active in unit))
            if (rows + len(unit)) * widest > self.max_batch_tokens and rows > 0:
                break
            rows, longest = rows + len(unit), widest
            admitted += unit
        return admitted

    def iterate(self) -> Iteration:
        """One forward pass: prefill the requests that can join, else step the running ones (with chunked
        prefill: the running ones' step and the next chunk of the joining ones' prompts)."""
        started = time.perf_counter()
        if self.batch.chunk_tokens:
            iteration = self.advance()
        else:
            joining = self.admissible()
            if joining:
                iteration = self.prefill(joining)
            elif self.batch.rows:
                iteration = self.step()
            else:
                iteration = Iteration(IDLE)
        iteration.seconds = time.perf_counter() - started
        now = time.perf_counter()
        for request_id in iteration.new_tokens:
            active = self.active[request_id]
            if active.first_token_at is None:
                active.first_token_at = now
        return iteration

    def prefill(self, joining: list[Active]) -> Iteration:
        self.prefills += 1
        by_sequence = {active.sequence: active for active in joining}
        iteration = Iteration(PREFILL, rows=len(joining))
        try:
            new_tokens = self.batch.prefill([active.sequence for active in joining])
        except Exception as error:
            units = requests_of(joining)
            if len(units) == 1 or any(active.sequence.token_ids for active in joining):
                self.fail(joining, error, iteration)
                return iteration
            # Whatever broke the pass may be one prompt's doing: each request alone (its n choices still share
            # their prompt's pass), so only that one fails.
            logger.warning("prefill of %d requests failed; prefilling them one at a time", len(units), exc_info=True)
            new_tokens = {}
            for unit in units:
                single = self.prefill(unit)
                iteration.new_tokens.update(single.new_tokens)
                iteration.failed.update(single.failed)
            self.prefills -= len(units)
        for active in joining:
            active.admitted = True
        iteration.new_tokens.update(self.by_request(new_tokens, by_sequence))
        return iteration

    def advance(self) -> Iteration:
        """Chunked prefill: the requests that can join start their prompts (when no group is being computed), then
        one pass of :meth:`RunningBatch.advance`. A pass that fails with a chunk in it is done again as it would be
        without chunks (the group prefilled whole, one prompt at a time if that fails, then the running rows'
        step), so an error stays with the request that causes it."""
        if self.batch.filling is None:
            joining = self.admissible()
            if joining:
                self.prefills += 1
                self.batch.begin_filling([active.sequence for active in joining])
                for active in joining:
                    active.admitted = True
        if self.batch.filling is None and not self.batch.rows:
            return Iteration(IDLE)
        running = self.running
        by_sequence = {active.sequence: active for active in running}
        try:
            new_tokens = self.batch.advance()
        except Exception as error:
            if self.batch.filling is None:  # a decoding step alone: no one request's parameters can break it
                self.decode_steps += 1
                iteration = Iteration(DECODE, rows=len(running))
                self.fail(running, error, iteration)
                return iteration
            logger.warning("a pass with a prompt chunk failed; prefilling its prompts alone", exc_info=True)
            group = [by_sequence[sequence] for sequence in self.batch.abandon_filling()]
            for active in group:
                active.admitted = False  # not among the rows the step below fails, if it does
            iteration = self.step() if self.batch.rows else Iteration(PREFILL)
            self.prefills -= 1  # counted again by prefill
            again = self.prefill(group)
            iteration.new_tokens.update(again.new_tokens)
            iteration.failed.update(again.failed)
            iteration.rows = len(running)
            return iteration
        if self.batch.decoded:
            self.decode_steps += 1
        iteration = Iteration(DECODE if self.batch.decoded else PREFILL, rows=len(running))
        iteration.new_tokens = self.by_request(new_tokens, by_sequence)
        return iteration

    def step(self) -> Iteration:
        self.decode_steps += 1
        running = self.running
        iteration = Iteration(DECODE, rows=len(running))
        try:
            new_tokens = self.batch.step()
        except Exception as error:  # no one request's parameters can break a step: the pass failed for all in it
            self.fail(running, error, iteration)
            return iteration
        iteration.new_tokens = self.by_request(new_tokens, {active.sequence: active for active in running})
        return iteration

    @staticmethod
    def by_request(new_tokens: NewTokens, by_sequence: dict[Sequence, Active]) -> dict[str, int]:
        return {by_sequence[sequence].request_id: token for sequence, token in new_tokens.items()}

    @staticmethod
    def fail(actives: list[Active], error: Exception, iteration: Iteration) -> None:
        logger.error("a forward pass of %d request(s) failed", len(actives), exc_info=error)
        for active in actives:
            sequence = active.sequence
            sequence.finish_reason = FINISH_ERROR
            sequence.error = f"{type(error).__name__}: {error}"
            active.admitted = True  # its rows (if any) leave with it
            iteration.failed[active.request_id] = sequence.error


def requests_of(actives: list[Active]) -> list[list[Active]]:
    """``actives`` (in arrival order) grouped by the request they belong to: a request's choices are consecutive."""
    units: list[list[Active]] = []
    for active in actives:
        if units and units[-1][0].client_id == active.client_id:
            units[-1].append(active)
        else:
            units.append([active])
    return units
