"""The generation loop: accepted requests in, finished answers (and stream pieces) out, with no TorchServe in it.

Two ways to run it, as the model config chooses (handlers/generator.py adapts TorchServe's calls to them):

- **per step** (``continuousBatching: true``): :meth:`GenerationLoop.start` takes newly accepted requests (the
  similarity cache answers those it can at once, the others wait to decode), :meth:`GenerationLoop.step` runs one
  forward pass (:mod:`handlers.generation.scheduler`) and returns the requests that ended with their results and the
  new text of each open stream; :meth:`GenerationLoop.cancel_missing` drops requests whose clients went away;
- **whole batch**: :meth:`GenerationLoop.preprocess` -> :meth:`GenerationLoop.decode` (every step's stream pieces go
  to a callback) -> :meth:`GenerationLoop.postprocess`, one result per request.

Each request samples with its own seeded generator either way, so its tokens do not depend on what it shares steps
with; a stop sequence in the text finishes it at once; its answer is an :class:`Outcome` (or the ServerError that
stopped it), which the request's dialect frames (:mod:`handlers.generation.answers`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.core.errors import ServerError
from handlers.core.metrics import HandlerMetrics
from handlers.generation.answers import Outcome
from handlers.generation.choices import ChoiceGroup, choice_id, combined
from handlers.generation.decoding import FINISH_ERROR
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.model import LoadedGenerator
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.requests import (
    AcceptedGeneration,
    Generation,
    GenerationBatch,
    GenerationRequest,
    start_generations,
)
from handlers.generation.running import generate, new_batch
from handlers.generation.scheduler import DECODE, Active, Iteration, StepScheduler
from handlers.generation.semantic_cache.cache import SemanticCache, SemanticQuery
from handlers.generation.semantic_cache.store import StoredAnswer

# Stream pieces of one decoding step of a whole batch: each generation that has new text and its framed chunk.
SendPieces = Callable[[list[tuple[Generation, str]]], None]


@dataclass
class StepResult:
    """What one step did for its requests: those that ended (with their result) and each open stream's new text.

    Every piece must reach its client: the request counts as opened (its status is 200 already) from here on. A
    piece is the stream chunk as the request's API frames it (:meth:`Answers.piece`)."""

    ended: list[tuple[Active, Outcome | ServerError]] = field(default_factory=list)
    pieces: list[tuple[Active, str]] = field(default_factory=list)


class GenerationLoop:
    def __init__(
        self,
        loaded: LoadedGenerator,
        max_batch_tokens: int,
        prefix_cache: PrefixCache | None = None,
        semantic: SemanticCache | None = None,
        prefill_chunk_tokens: int = 0,
        paged: Any = None,
    ) -> None:
        self.loaded = loaded
        self.prefix_cache = prefix_cache
        self.semantic = semantic
        self.paged = paged  # handlers.generation.paged_openvino.PagedModel: runs the passes instead of the model
        batch = new_batch(
            loaded.model, loaded.pad_token_id, loaded.stop_token_ids, prefix_cache, prefill_chunk_tokens, paged
        )
        self.scheduler = StepScheduler(batch, max_batch_tokens)
        self.groups: dict[str, ChoiceGroup] = {}  # per step: requests with n > 1, by request id, until all end

    def cache_query(self, request: GenerationRequest) -> SemanticQuery | str | None:
        """Where the similarity cache looks this request up (or why it does not: a reason); None: no cache."""
        if self.semantic is None:
            return None
        if request.settings.logprobs is not None:  # a stored answer keeps its text, not its tokens' logprobs
            return "logprobs"
        if request.n > 1:  # a stored answer is one choice
            return "n"
        return self.semantic.query(request.settings, request.stop, request.lookup)

    # ----------------------------------------------------------------------------------------------- per step
    def knows(self, request_id: str) -> bool:
        return request_id in self.groups or self.scheduler.knows(request_id)

    def cancel_missing(self, request_ids: list[str]) -> list[Active]:
        """Requests no longer handed over (their clients went away): their rows (every choice's) are freed; returns
        one Active per request."""
        gone = self.scheduler.cancel_missing(request_ids)
        present = set(request_ids)
        for request_id in [request_id for request_id in self.groups if request_id not in present]:
            del self.groups[request_id]
        return list({active.client_id: active for active in reversed(gone)}.values())[::-1]

    def start(
        self, accepted: list[tuple[str, AcceptedGeneration]], arrived: float
    ) -> list[tuple[AcceptedGeneration, Outcome]]:
        """New accepted requests, by request id: those the similarity cache answers are returned with their answer,
        the others wait to decode."""
        if not accepted:
            return []
        payloads = [payload for _, payload in accepted]
        looked = self.semantic.look_up_batch([p.cache for p in payloads]) if self.semantic is not None else None
        generations = iter(start_generations(payloads, self.loaded.tokenizer).generations)
        answered = []
        for position, (request_id, payload) in enumerate(accepted):
            request = payload.request
            choices = [next(generations) for _ in range(request.n)]
            item = looked[position] if looked is not None else None
            if item is not None and item.hit is not None:
                answered.append((payload, self.cached_result(request, item.hit)))
                continue
            actives = [
                Active(
                    request_id=choice_id(request_id, generation.choice),
                    generation=generation,
                    arrived=arrived,
                    reserve=request.reserve,
                    payload=payload,
                    remember=(item.group, item.vector) if item is not None and item.vector is not None else None,
                    choice_of=request_id if generation.choice else None,
                )
                for generation in choices
            ]
            for active in actives:
                self.scheduler.add(active)
            if request.n > 1:
                self.groups[request_id] = ChoiceGroup(actives)
        return answered

    def step(
        self,
        arrived: float,
        metrics: HandlerMetrics,
        budget_s: float = 0.0,
        send_pieces: Callable[[list[tuple[Active, str]]], None] | None = None,
    ) -> StepResult:
        """One forward pass: prefill the requests that can join, else step the running ones; then the requests that
        ended leave (the similarity cache keeps their answers) and each open stream's new text is returned.

        With ``budget_s`` more decoding passes follow in the same call while :meth:`goes_on` allows (the call has
        lasted less than ``budget_s``, counting the next pass as long as the last, and nothing needs the frontend):
        TorchServe's round trip is then paid once for several tokens. Each pass's stream pieces but the last go to
        ``send_pieces`` as they come (the patched frontend sends them on at once); without it each stream gets the
        call's text in one piece."""
        started = time.perf_counter()
        result = StepResult()
        iterations: list[Iteration] = []
        streaming: dict[str, Active] = {}  # requests that got tokens in this call, in the order they got them
        first: list[Active] = []  # requests that got their first token in this call
        while True:
            with torch.inference_mode():
                iteration = self.scheduler.iterate()
            iterations.append(iteration)
            for request_id, token in iteration.new_tokens.items():
                active = self.scheduler.active[request_id]
                push_token(active.generation, token)
                streaming[request_id] = active
                if len(active.sequence.token_ids) == 1 and active.choice_of is None:
                    first.append(active)
            finished = self.end_finished(result)
            if finished or first or not self.goes_on(iteration, started, budget_s):
                break
            if send_pieces is not None:  # this pass's text goes now; the call goes on
                sent = self.stream_pieces(streaming)
                if sent:
                    send_pieces(sent)
                streaming = {}
        result.pieces = self.stream_pieces(streaming)
        self.record_steps(iterations, first, metrics)
        return result

    def stream_pieces(self, streaming: dict[str, Active]) -> list[tuple[Active, str]]:
        """The new text of each stream that got tokens, as its chunk (its stream is then open)."""
        pieces = []
        for request_id, active in streaming.items():
            # One that ended sends the rest of its text in its last chunk; a stream without new text this call is
            # left out of the answer, as a plain request is.
            piece = unsent_text(active.generation) if request_id in self.scheduler.active else ""
            if piece:
                pieces.append((active, stream_chunk(active.generation, piece)))
                active.opened = True
        return pieces

    def goes_on(self, iteration: Iteration, started: float, budget_s: float) -> bool:
        """Whether another decoding pass may run in this call (the caller stops it first when a generation ended
        or a request got its first token: those go out at once): only running rows decode (no prompt is being
        computed or waits for room, the pass did not fail), and the call, with a pass as long as the last one,
        stays within ``budget_s``. A request TorchServe received meanwhile is handed over at the next call, so it
        waits at most ``budget_s`` more to join."""
        if budget_s <= 0 or iteration.kind != DECODE or iteration.failed or not self.scheduler.batch.rows:
            return False
        if self.scheduler.batch.filling is not None or self.scheduler.waiting:
            return False
        return time.perf_counter() - started + iteration.seconds <= budget_s

    def end_finished(self, result: StepResult) -> bool:
        """The generations that finished leave; each request (all its choices done) goes to ``result``. Returns
        whether any generation finished."""
        finished = self.scheduler.finished()
        for active in finished:
            outcome = self.decoded_result(active.generation)
            group = self.groups.get(active.client_id)
            if group is not None:  # one of n choices: the request ends with its last choice
                group.ended[active.generation.choice] = outcome
                if not group.done:
                    continue
                del self.groups[active.client_id]
                active = group.actives[0]
                active.opened = group.opened
                outcome = combined([group.ended[choice] for choice in range(len(group.actives))])
            if isinstance(outcome, Outcome) and active.remember is not None:
                self.remember([(*active.remember, outcome)])
            result.ended.append((active, outcome))
        return bool(finished)

    def record_steps(self, iterations: list[Iteration], first: list[Active], metrics: HandlerMetrics) -> None:
        """One call's passes, recorded once (each counter as the call's sum, one metric line each): the worker prints
        every record for TorchServe's frontend to parse, so fewer lines cost it less per token."""
        now = time.perf_counter()
        for active in first:
            metrics.record("TimeToFirstTokenSeconds", now - active.arrived)
        produced = sum(len(iteration.new_tokens) for iteration in iterations)
        if produced:
            metrics.record("GeneratedTokens", produced)
        decoded = sum(iteration.kind == DECODE for iteration in iterations)
        if decoded:
            metrics.record("DecodeSteps", decoded)
        for iteration in iterations:  # a histogram: one value per pass
            metrics.record("InferenceSeconds", iteration.seconds)
        metrics.record("BatchRows", sum(iteration.rows for iteration in iterations))
        metrics.record("Batches", len(iterations))
        metrics.record("RunningRequests", len(self.scheduler.running))
        metrics.record("WaitingRequests", len(self.scheduler.waiting))
        self.record_caches(metrics)

    def record_caches(self, metrics: HandlerMetrics) -> None:
        """What the prefix and similarity caches counted since they were last recorded."""
        if self.prefix_cache is not None:
            pending = self.prefix_cache.stats.drain()
            for name, metric in (("hits", "PrefixCacheHits"), ("misses", "PrefixCacheMisses")):
                if pending.get(name):
                    metrics.record(metric, pending[name])
            if pending.get("reused_tokens"):
                metrics.record("PrefixCacheTokens", pending["reused_tokens"])
        computed = self.scheduler.batch.computed_prompt_tokens
        if computed:
            metrics.record("PrefillTokens", computed)
            self.scheduler.batch.computed_prompt_tokens = 0
        if self.semantic is not None:
            self.semantic.record(metrics)

    # ----------------------------------------------------------------------------------------------- whole batch
    def preprocess(self, payloads: list[AcceptedGeneration]) -> GenerationBatch:
        """The requests to decode; with the similarity cache on, those it answers are set aside first."""
        if self.semantic is None:
            return start_generations(payloads, self.loaded.tokenizer)
        looked = self.semantic.look_up_batch([payload.cache for payload in payloads])
        answered = {position: item.hit for position, item in enumerate(looked) if item.hit is not None}
        to_decode = [position for position in range(len(payloads)) if position not in answered]
        batch = start_generations([payloads[position] for position in to_decode], self.loaded.tokenizer)
        first_generation: dict[int, int] = {}  # a request's position among the generations: that of its choice 0
        for index, generation in enumerate(batch.generations):
            if generation.choice == 0:
                first_generation[len(first_generation)] = index
        remember = {
            first_generation[order]: (looked[position].group, looked[position].vector)
            for order, position in enumerate(to_decode)
            if looked[position].vector is not None
        }
        return dataclasses.replace(batch, answered=answered, remember=remember)

    def decode(self, batch: GenerationBatch, metrics: HandlerMetrics, send: SendPieces) -> GenerationBatch:
        """Decode the whole batch; streaming requests' new text goes to ``send`` after every step."""
        generations = batch.generations
        if not generations:  # every request was answered from the similarity cache
            return batch
        started = time.perf_counter()

        def on_step(new_tokens: dict[int, int]) -> None:
            now = time.perf_counter()
            pieces = []
            for index, token in new_tokens.items():
                generation = generations[index]
                if not generation.sequence.token_ids[:-1] and not generation.choice:  # its first token, from arrival
                    metrics.record("TimeToFirstTokenSeconds", now - started)
                piece = advance(generation, token)
                if piece:
                    pieces.append((generation, stream_chunk(generation, piece)))
            if pieces:
                send(pieces)

        generate(
            self.loaded.model,
            [g.sequence for g in generations],
            self.loaded.stop_token_ids,
            self.loaded.pad_token_id,
            use_cache=True,
            on_step=on_step,
            prefix_cache=self.prefix_cache,
            paged=self.paged if self.pool_fits(generations) else None,
        )
        metrics.record("GeneratedTokens", sum(len(g.sequence.token_ids) for g in generations))
        return batch  # its generations now hold their tokens and text

    def pool_fits(self, generations: list[Generation]) -> bool:
        """Whether a whole batch fits the paged step's block pool at its longest (each row's prompt and max new
        tokens, and a partly filled block); a batch that does not decodes eagerly."""
        if self.paged is None:
            return False
        paged = self.paged
        longest = [len(g.sequence.prompt_ids) + g.sequence.settings.max_new_tokens for g in generations]
        return sum(paged.blocks_for(tokens) for tokens in longest) <= paged.free_blocks

    def postprocess(self, batch: GenerationBatch, payloads: list[AcceptedGeneration]) -> list[Any]:
        """One result per accepted request, in order: its answer from the cache, or its decoded one (which the
        similarity cache keeps when it looked the request up)."""
        decoded = iter(enumerate(batch.generations))
        results: list[Any] = []
        remember = []
        for position, payload in enumerate(payloads):
            hit = batch.answered.get(position)
            if hit is not None:
                results.append(self.cached_result(payload.request, hit))
                continue
            choices = [next(decoded) for _ in range(payload.request.n)]
            index = choices[0][0]
            result = combined([self.decoded_result(generation) for _, generation in choices])
            results.append(result)
            if index in batch.remember and isinstance(result, Outcome):
                remember.append((*batch.remember[index], result))
        self.remember(remember)
        return results

    # ----------------------------------------------------------------------------------------------- answers
    def cached_result(self, request: GenerationRequest, hit: Any) -> Outcome:
        """The answer of a request the similarity cache answers."""
        return Outcome(
            text=hit.answer.text,
            rest=hit.answer.text if request.stream else "",
            finish_reason=hit.answer.finish_reason,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=hit.answer.completion_tokens,
            seed=request.settings.seed if request.seed_reported else None,
            model=self.loaded.info,
            cached={"similarity": round(hit.similarity, 4), "age_s": round(hit.age_s, 1)},
        )

    def decoded_result(self, generation: Generation) -> Outcome | ServerError:
        """The answer of a finished generation (or the error that stopped it)."""
        sequence, request = generation.sequence, generation.request
        if sequence.finish_reason == FINISH_ERROR:
            stopped = f"generation stopped after {len(sequence.token_ids)} token(s): {sequence.error}"
            if sequence.error_status < 500:  # the request's own doing (its grammar): a client error, one type for all
                return ServerError(stopped, code=sequence.error_status, error_type="InvalidRequest")
            return ServerError(stopped)
        generation.text.finish()
        if generation.text.stopped:  # a stop sequence completed by the text held back until the end
            sequence.stop()
        return Outcome(
            text=generation.text.text,
            rest=generation.text.rest() if request.stream else "",
            finish_reason=sequence.finish_reason,
            prompt_tokens=len(sequence.prompt_ids),
            completion_tokens=len(sequence.token_ids),
            seed=request.settings.seed if request.seed_reported else None,
            model=self.loaded.info,
            logprobs=tuple(sequence.logprobs) if request.settings.logprobs is not None else None,
            rest_logprobs=unsent_logprobs(generation) if request.stream else None,
        )

    def remember(self, answers: list[tuple[bytes, Any, Outcome]]) -> None:
        """Give the similarity cache new answers, each with the group and prompt vector it was looked up with."""
        kept = [
            (group, vector, StoredAnswer(outcome.text, outcome.finish_reason, outcome.completion_tokens))
            for group, vector, outcome in answers
            if outcome.finish_reason is not None
        ]
        if kept and self.semantic is not None:
            self.semantic.remember(kept)


def advance(generation: Generation, token: int) -> str:
    """Add one new token to a generation's text; returns the text its stream may send now ('' for none).

    A stop sequence in the text finishes the generation at once (it leaves the batch before the next step). A
    finished request's last text goes in its final chunk, which closes its stream."""
    push_token(generation, token)
    return unsent_text(generation)


def push_token(generation: Generation, token: int) -> None:
    """Add one new token to a generation's text (a stop sequence in it finishes the generation)."""
    generation.text.push(token)
    if generation.text.stopped:
        generation.sequence.stop()


def unsent_text(generation: Generation) -> str:
    """The text a generation's stream may send now ('' for none, and for a plain or finished request)."""
    if not generation.request.stream or not generation.request.send_pieces or generation.sequence.finished:
        return ""
    return generation.text.take()


def unsent_logprobs(generation: Generation) -> tuple[TokenLogprob, ...] | None:
    """The log probabilities of the tokens since the generation's last stream chunk (None: it did not ask)."""
    if generation.request.settings.logprobs is None:
        return None
    logprobs = generation.sequence.logprobs
    unsent = tuple(logprobs[generation.logprobs_sent :])
    generation.logprobs_sent = len(logprobs)
    return unsent


def stream_chunk(generation: Generation, piece: str) -> str:
    """A stream's new text framed by its API, with the log probabilities of the tokens it came from when asked."""
    return generation.request.answers.piece(piece, unsent_logprobs(generation), generation.choice)
