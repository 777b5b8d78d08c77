"""The kinds of CPU this machine can be run as (TS_CPU_AS, handlers/core/cpu.py), and what each one picks.

    python -m scripts.cpu_kinds              # each kind: runnable here or why not, and what it serves
    python -m scripts.cpu_kinds --runnable   # just the names this machine can be run as (make test-cpu-kinds)
    python -m scripts.cpu_kinds --json

Running as a kind masks the CPU features every choice of the project reads (precision auto, the bf16 candidates a
worker refuses, the backends built at package time) and caps torch's and OpenVINO's instruction sets to it. Masking
only removes features: a kind this CPU lacks is listed with the reason, and asking for it is refused.
"""

from __future__ import annotations

import argparse
import json
import sys

from handlers.core import cpu


def kinds() -> list[dict[str, object]]:
    """One entry per kind: name, runnable here, why not, what it serves, the library caps it sets."""
    flags = cpu.machine_flags()
    own = cpu.kind_of(flags)
    return [
        {
            "kind": kind.name,
            "runnable": cpu.why_not(kind, flags) is None,
            "this_machine": kind.name == own,
            "why_not": cpu.why_not(kind, flags),
            "picks": kind.picks,
            "environment": {"ATEN_CPU_CAPABILITY": kind.aten_capability, "ONEDNN_MAX_CPU_ISA": kind.onednn_isa},
        }
        for kind in cpu.CPU_KINDS.values()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.cpu_kinds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runnable", action="store_true", help="print only the kinds this machine can be run as")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    listed = kinds()
    if args.json:
        print(json.dumps(listed, indent=2))
    elif args.runnable:
        print(" ".join(str(entry["kind"]) for entry in listed if entry["runnable"]))
    else:
        for entry in listed:
            where = "this machine" if entry["this_machine"] else "runnable" if entry["runnable"] else "not runnable"
            print(f"{entry['kind']:<12} {where:<13} {entry['why_not'] or entry['picks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
