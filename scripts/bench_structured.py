"""What structured outputs cost: grammar compile time, and per-token decoding time constrained versus free.

Runs in this process (no server) on a generator model folder, through handlers.generation.running.generate with the
same grammar machinery the handler uses (handlers/generation/structured.py):

- the tokenizer's grammar vocabulary (built once per worker) and each schema's compile time, first and cached;
- per-token time of B rows decoding together, all free versus all under a JSON schema (the mask computed in the
  background beside the forward pass, and computed inline when each token is chosen), sampled with fixed seeds,
  no end-of-text token and a schema no row can complete within the budget: the median decoding step divided by its
  rows (the prefill left out).

    python -m scripts.bench_structured --quick                            # the demo model, a few seconds
    python -m scripts.bench_structured --model-dir build/generator-124m/lm --rows 1 8 --tokens 64

Prints a table and writes OUT_DIR/structured_bench.json. Exit codes: 0 done, 1 the model folder cannot be loaded,
2 bad arguments.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench_generator import DEFAULT_MODEL_DIR, load, prompt_ids

# The measured schemas: a Pydantic-style object, a nested one with $ref, and a long free array (a row that rarely
# completes early, so its tokens are all constrained ones).
SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        },
        "required": ["name", "age", "email", "tags"],
        "additionalProperties": False,
    },
    "nested": {
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "label": {"type": "string"}, "ok": {"type": "boolean"}},
                "required": ["id", "label", "ok"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
        "required": ["items"],
        "additionalProperties": False,
    },
    # At least 48 items of at least 3 tokens each: no row completes within the measured budget, so every step
    # decodes every row.
    "array": {"type": "array", "items": {"type": "string"}, "minItems": 48},
}
DECODE_SCHEMA = "array"


def compile_times(tokenizer, vocab_size):
    """Seconds to build the grammar vocabulary, then each schema's first and cached compile."""
    from handlers.generation import structured

    started = time.perf_counter()
    grammars = structured.Grammars(tokenizer, vocab_size)
    result: dict[str, Any] = {"vocabulary_s": time.perf_counter() - started, "schemas": {}}
    for name, schema in SCHEMAS.items():
        response_format = structured.ResponseFormat("json_schema", schema, name)
        times = []
        for _ in range(2):
            started = time.perf_counter()
            grammars.compile(response_format)
            times.append(time.perf_counter() - started)
        result["schemas"][name] = {"first_ms": times[0] * 1e3, "cached_ms": times[1] * 1e3}
    return result, grammars


def decode_time(model, prompt, rows, tokens, compiled, background):
    """(seconds per generated token, tokens generated) of ``rows`` sequences decoding together: the median decoding
    step (the prefill left out) divided by the rows it decoded."""
    import torch

    from handlers.generation import structured
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import generate

    structured.BACKGROUND_MASKS = background
    sequences = [
        Sequence(
            list(prompt),
            SamplingSettings(max_new_tokens=tokens, temperature=1.0, seed=row),
            constraint=compiled.start() if compiled is not None else None,
        )
        for row in range(rows)
    ]
    stamps: list[tuple[float, int]] = []  # (time, rows that got a token) after each forward pass

    def on_step(new_tokens):
        stamps.append((time.perf_counter(), len(new_tokens)))

    with torch.inference_mode():
        # no end-of-text token: every row runs its whole budget
        generate(model, sequences, stop_token_ids=[], pad_token_id=0, on_step=on_step)
    structured.BACKGROUND_MASKS = True
    per_token = [
        (stamp - before) / count for (before, _), (stamp, count) in zip(stamps, stamps[1:], strict=False) if count
    ]
    generated = sum(len(sequence.token_ids) for sequence in sequences)
    return statistics.median(per_token), generated


def measure(model, tokenizer, rows_list, tokens, repeats):
    from handlers.generation import structured

    vocab_size = model.config.vocab_size
    compiles, grammars = compile_times(tokenizer, vocab_size)
    compiled = grammars.compile(structured.ResponseFormat("json_schema", SCHEMAS[DECODE_SCHEMA], DECODE_SCHEMA))
    prompt = prompt_ids(tokenizer, 16)
    decode_time(model, prompt, 1, 4, None, True)  # warm-up
    results = []
    for rows in rows_list:
        row = {"rows": rows}
        for mode, format_, background in (
            ("free", None, True),
            ("constrained", compiled, True),
            ("constrained_inline", compiled, False),
        ):
            runs = [decode_time(model, prompt, rows, tokens, format_, background) for _ in range(repeats)]
            row[f"{mode}_ms_per_token"] = statistics.median(seconds for seconds, _ in runs) * 1e3
            row[f"{mode}_tokens"] = runs[0][1]
        row["ratio"] = row["constrained_ms_per_token"] / row["free_ms_per_token"]
        row["ratio_inline"] = row["constrained_inline_ms_per_token"] / row["free_ms_per_token"]
        results.append(row)
    return compiles, results


def table(compiles, results):
    lines = [f"grammar vocabulary built in {compiles['vocabulary_s'] * 1e3:.0f} ms", ""]
    lines += ["| schema | first compile ms | cached ms |", "|---|---|---|"]
    for name, times in compiles["schemas"].items():
        lines.append(f"| {name} | {times['first_ms']:.2f} | {times['cached_ms']:.3f} |")
    lines += [
        "",
        "| rows | free ms/token | constrained ms/token | ratio | mask inline ms/token | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for row in results:
        lines.append(
            f"| {row['rows']} | {row['free_ms_per_token']:.3f} | {row['constrained_ms_per_token']:.3f} | "
            f"{row['ratio']:.2f}x | {row['constrained_inline_ms_per_token']:.3f} | {row['ratio_inline']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="a Hugging Face causal LM folder")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="rows decoding together (each a run)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row at most")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="rows 1 and 4, 32 tokens, 1 repeat")
    parser.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.tokens, args.repeats = [1, 4], 32, 1
    if min(args.rows) < 1 or args.tokens < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--rows, --tokens, --repeats and --threads must be at least 1")

    import torch

    torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load(str(args.model_dir))
    except (OSError, ValueError) as error:
        print(f"cannot load {args.model_dir}: {error}", file=sys.stderr)
        return 1
    compiles, results = measure(model, tokenizer, args.rows, args.tokens, args.repeats)
    print(table(compiles, results))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "structured_bench.json"
    record = {
        "model_dir": str(args.model_dir),
        "threads": args.threads,
        "tokens": args.tokens,
        "cpu": platform.processor() or platform.machine(),
        "compile": compiles,
        "decode": results,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
