"""What every reliability check shares: the report Row, the CheckFailed that carries one, and verify (count lost,
failed and wrong answers against a reference).

Every check judges every part of its own target and fails with the reason when one is missed or cannot be measured
(nothing answered, no worker to kill, an empty corpus): a check that cannot fail proves nothing.
tests/unit/test_reliability_checks.py feeds each one fabricated bad outcomes and sees it fail.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Row:
    check: str
    figure: str
    target: str
    passed: bool
    details: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


class CheckFailed(Exception):
    """A measurement later checks depend on (the capacity estimate) failed: carries the failing Row for the report,
    so the suite reports it instead of going on with a made-up figure."""

    def __init__(self, row):
        super().__init__(f"{row.check}: {row.figure}")
        self.row = row


def verify(reference, outcomes):
    """Count answers that are missing, not 200, or not equal to that input's own reference answer (an answer that is
    not strict JSON, e.g. with NaN in it, is wrong: a strict client could not read it)."""
    lost = sum(1 for o in outcomes if o is None or o.status == 0)
    errors = sum(1 for o in outcomes if o is not None and o.status not in (0, 200))
    mismatches = 0
    for outcome in outcomes:
        if outcome is not None and outcome.status == 200:
            try:
                ok = reference.matches(outcome.index, outcome.json())
            except (ValueError, KeyError, TypeError, IndexError):
                ok = False
            mismatches += 0 if ok else 1
    return lost, errors, mismatches


def fmt_ms(value):
    return "-" if value is None else f"{value:.0f} ms"


def write_rows(path, rows):
    """The rows as a JSON list (the fuzzer's --out)."""
    Path(path).write_text(json.dumps([r.as_dict() for r in rows], indent=2, default=str) + "\n")
