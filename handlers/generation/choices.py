"""A request's n choices (OpenAI's ``n``): n rows decoding one prompt, answered together.

Each choice is a generation of its own (choice i samples with seed + i: :func:`handlers.generation.requests.
choice_seed`) and, under per-step scheduling, a row of its own in the scheduler (choices 1.. get ids of their own,
:func:`choice_id`; choice 0 keeps the request's). The prompt is prefilled once for all of them
(:func:`handlers.generation.decoding.distinct_prompts`: the row's keys and values are copied n times), and the
scheduler admits them together, as n rows of its room. A choice that ends early waits here (its rows are freed at
once) until every choice has ended; the request's answer then carries them all (:func:`combined`): usage counts the
prompt once and the tokens of every choice, each choice has its own finish reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from handlers.core.errors import ServerError
from handlers.generation.answers import Outcome
from handlers.generation.scheduler import Active


def choice_id(request_id: str, choice: int) -> str:
    """The scheduler's id of a request's choice (choice 0: the request's own id)."""
    return request_id if choice == 0 else f"{request_id}#choice-{choice}"


@dataclass
class ChoiceGroup:
    """The choices of one request with n > 1 while they decode."""

    actives: list[Active]  # in choice order; actives[0] has the request's own id
    ended: dict[int, Outcome | ServerError] = field(default_factory=dict)  # by choice

    @property
    def done(self) -> bool:
        return len(self.ended) == len(self.actives)

    @property
    def opened(self) -> bool:
        return any(active.opened for active in self.actives)


def combined(results: list[Outcome | ServerError]) -> Outcome | ServerError:
    """One answer from every choice's result (in choice order): the first error fails the request."""
    for result in results:
        if isinstance(result, ServerError):
            return result
    outcomes = [result for result in results if isinstance(result, Outcome)]
    if len(outcomes) == 1:
        return outcomes[0]
    total = sum(outcome.completion_tokens for outcome in outcomes)
    return dataclasses.replace(outcomes[0], completion_tokens=total, choices=tuple(outcomes))
