"""One row per architecture family: what packaging a model of that family gives on this machine.

    python -m loadtests.architectures [--families mpnet,qwen3,...] [--size minilm] [--tokens 256] [--rank-seconds 30]

For each family a random-weight folder of the layout teams bring is written (``python -m scripts.tiny_text_models``: the
same builders the tests use, at a measuring size), packaged with the documented command (``python -m scripts.package
text-model ... --var backends=all``: every compiled backend attempted, gated and ranked), and loaded once as a worker
loads it. The row says: fp32 parity with the reference library (model_source.json), which backend won the build's
ranking and its in-process gain over eager at the same precision (on 16-token rows, and on the README mix; the
build's own ranking benchmark, backends/manifest.json), the candidates refused and why, and the load time of a fresh
worker process (imports included) with the backend it then serves.

Writes build/bench/architectures-<time>/architectures.json and architectures.md (the table for docs/your-model.md),
and prints the table. Exit codes: 0 measured (a family that failed is a row saying why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from scripts.ops import machine

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "bench"
FAMILIES = (
    "mpnet",
    "bert-dense",
    "xlm-roberta",
    "qwen3",
    "deberta-v2",
    "modernbert",
    "electra",
    "splade",
    "multi-vector",
)
# A fresh worker: import, load, the accuracy gate, warm-up; timed from the interpreter's start.
LOAD_PROBE = """
import json, sys, time
started = time.perf_counter()
from scripts.ops.handler_loader import load_handler
handler, _ = load_handler(sys.argv[1], sys.argv[2], {"shared_cache": {"url": ""}})
print(json.dumps({"seconds": round(time.perf_counter() - started, 2), "backend": handler.backend,
                  "precision": handler.precision, "load_seconds": round(handler.load_seconds, 2)}))
"""


def run(command: list[str], timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def ratio(eager: float | None, served: float | None) -> float | None:
    return round(eager / served, 2) if eager and served else None


def backend_row(manifest: dict) -> dict:
    """The ranking's winner, its gain over eager at its precision, and what was refused (manifest.json)."""
    ranking = manifest.get("ranking_benchmark") or {}
    refused = [f"{r['backend']}/{r['precision']}: {r.get('reason', '')}" for r in manifest.get("refused") or []]
    if not manifest.get("candidates"):
        return {"winner": "eager (no compiled candidate passed)", "refused": refused}
    best = manifest["candidates"][0]
    precision = best["precision"]
    eager_buckets = (ranking.get("eager_ms_per_bucket") or {}).get(precision) or {}
    shortest = min(best["ms_per_bucket"], key=int)
    return {
        "winner": f"{best['backend']}/{precision}",
        "gain_short": ratio(eager_buckets.get(shortest), best["ms_per_bucket"][shortest]),
        "short_tokens": int(shortest),
        "gain_mix": ratio((ranking.get("eager_ms_per_text") or {}).get(precision), best["ms_per_text"]),
        "ms_per_text": best["ms_per_text"],
        "eager_buckets": best.get("eager_buckets") or [],
        "refused": refused,
    }


def measure(family: str, size: str, tokens: int, rank_seconds: float, work: Path, log) -> dict:
    folder, store, name = work / family / "source", work / "store", f"arch-{family}"
    made = run([sys.executable, "-m", "scripts.tiny_text_models", "--out", str(folder), "--architecture", family,
                "--size", size, "--tokens", str(tokens)])  # fmt: skip
    if made.returncode != 0:
        return {"family": family, "error": f"could not write the folder: {made.stderr[-400:]}"}
    started = time.perf_counter()
    packaged = run(
        [sys.executable, "-m", "scripts.package", "text-model", "--name", name, "--var", f"model_dir={folder}",
         "--var", "backends=all", "--var", f"rank_seconds={rank_seconds:g}", "--store", str(store), "--force"]
    )  # fmt: skip
    package_seconds = round(time.perf_counter() - started, 1)
    if packaged.returncode != 0:
        return {"family": family, "error": f"packaging failed: {packaged.stderr.strip()[-600:]}"}
    with zipfile.ZipFile(store / f"{name}.mar") as archive:
        source = json.loads(archive.read("model_source.json"))
        manifest = json.loads(archive.read("backends/manifest.json"))
        unpacked = work / family / "archive"
        archive.extractall(unpacked)
    loaded = run([sys.executable, "-c", LOAD_PROBE, str(unpacked), name], timeout=900)
    load = json.loads(loaded.stdout.strip().splitlines()[-1]) if loaded.returncode == 0 else {}
    row = {
        "family": family,
        "architecture": source["architecture"],
        "kind": source["kind"],
        "body": source["body"],
        "parity": source["parity"]["fp32_agreement"],
        "package_seconds": package_seconds,
        **backend_row(manifest),
        "worker_load_seconds": load.get("seconds"),
        "served": f"{load.get('backend')}/{load.get('precision')}" if load else loaded.stderr[-300:],
    }
    log(f"{family}: {json.dumps(row)}")
    return row


def render(rows: list[dict], settings: dict) -> str:
    lines = [
        f"Random-weight models of the {settings['size']} size, {settings['tokens']} tokens, on {settings['cpu']} "
        f"({settings['flags']}); {settings['date']}; `python -m loadtests.architectures --size {settings['size']} "
        f"--tokens {settings['tokens']}`.",
        "",
        "| family | kind | served as | fp32 parity | ranking's winner | gain over eager, 16-token rows | gain over "
        "eager, README mix | worker load | refused at build |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['family']} | | | | {row['error'][:120]} | | | | |")
            continue
        refused = "; ".join(r[:90] for r in row.get("refused") or []) or "none"
        lines.append(
            f"| {row['family']} | {row['kind']} | {row['body']} | {row['parity']:.6f} | {row['winner']} | "
            f"{row.get('gain_short') or '-'}x | {row.get('gain_mix') or '-'}x | {row['worker_load_seconds']} s "
            f"({row['served']}) | {refused} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.architectures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--size", choices=("tiny", "minilm", "base"), default="minilm", help="model size (minilm)")
    parser.add_argument("--tokens", type=int, default=256, help="the models' token limit (256)")
    parser.add_argument("--rank-seconds", type=float, default=30.0, help="each build's ranking budget (30)")
    parser.add_argument("--out", type=Path, help="report folder (default build/bench/architectures-<time>)")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        parser.error(f"--families: unknown {unknown}; choose from {', '.join(FAMILIES)}")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or OUT / f"architectures-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "size": args.size,
        "tokens": args.tokens,
        "cpu": machine.cpu_model(),
        "flags": " ".join(sorted(machine.cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})),
        "date": datetime.date.today().isoformat(),
    }
    rows = [measure(f, args.size, args.tokens, args.rank_seconds, out, print) for f in families]
    (out / "architectures.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    table = render(rows, settings)
    (out / "architectures.md").write_text(table)
    print(table)
    print(f"report: {out}/architectures.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
