"""What long inputs by windows cost and gain in retrieval, against truncation, on a labelled set built here.

The set (deterministic, no download): the city passages of scripts/embedding_quality.py (two seeds, so the details
differ), shuffled into long documents of --passages passages each (about 2 x minilm's 256-token limit at the
default 24). Each query is one passage of one document, and that document is its only relevant one. Queries are
split by where their passage starts in its document:

- ``tail``: past the model's token limit (truncation never embeds it; windows do);
- ``head``: inside the first window (truncation embeds it; windows dilute it with the rest of the document).

Documents are embedded by the archive's own worker in process (its ``handle()``, as served: backend and precision
``auto`` unless given), once with ``{"text": ..., "long_input": "windows"}`` and once truncated (``{"text": ...}``);
queries as ordinary short texts. Per mode and query group: recall@1 and MRR of the relevant document among all
documents, ranked by cosine similarity.

    python -m scripts.window_quality                        # model_store/minilm.mar
    python -m scripts.window_quality --archive model_store/my-embedder.mar --json

Writes build/reports/window-quality-<time>.{json,md}. Exit codes: 0 measured, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODES = ("truncate", "windows")


def documents(passages_per_document: int, seeds: tuple[int, ...] = (7, 8)) -> list[list[str]]:
    """The passages of every seed's set, shuffled into documents of ``passages_per_document`` passages."""
    from scripts.embedding_quality import labelled_set

    pool = [passage for seed in seeds for passage in labelled_set(seed)[1]]
    random.Random(11).shuffle(pool)
    count = len(pool) // passages_per_document
    return [pool[d * passages_per_document : (d + 1) * passages_per_document] for d in range(count)]


def queries(docs: list[list[str]], tokenizer: Any, max_tokens: int) -> list[dict[str, Any]]:
    """Per document two tail queries (passages starting past ``max_tokens``) and two head queries (passages ending
    inside the first ``max_tokens / 2`` tokens), as {text, document, group}."""
    chosen = []
    rng = random.Random(13)
    for number, passages in enumerate(docs):
        starts, position = [], 0
        for passage in passages:
            starts.append(position)
            position += len(tokenizer.encode(passage + " ", add_special_tokens=False).ids)
        tail = [p for p, start in enumerate(starts) if start > max_tokens]
        head = [p for p in range(len(passages) - 1) if starts[p + 1] <= max_tokens // 2]
        for group, candidates in (("tail", tail), ("head", head)):
            for p in rng.sample(candidates, min(2, len(candidates))):
                chosen.append({"text": passages[p], "document": number, "group": group})
    return chosen


def embed(handler: Any, context: Any, bodies: list[dict[str, Any]], batch: int = 8) -> tuple[np.ndarray, list]:
    """(vectors, answers) of native ``{"text"}`` bodies, ``batch`` requests per handle() call."""
    from scripts.ops.handler_loader import set_requests, statuses

    answers = []
    for start in range(0, len(bodies), batch):
        chunk = bodies[start : start + batch]
        set_requests(context, [{"Content-Type": "application/json"}] * len(chunk))
        out = handler.handle([{"body": body} for body in chunk], context)
        if set(statuses(context, len(chunk))) != {200}:
            raise RuntimeError(f"a request was refused: {out}")
        answers += [json.loads(answer) for answer in out]
    vectors = np.array([answer["embedding"] for answer in answers], dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), answers


def rank_scores(query_vectors: np.ndarray, doc_vectors: np.ndarray, relevant: list[int]) -> dict[str, float]:
    """recall@1 and MRR of each query's one relevant document."""
    scores = query_vectors @ doc_vectors.T
    ranks = [int((row > row[want]).sum()) + 1 for row, want in zip(scores, relevant, strict=True)]
    return {
        "recall@1": round(float(np.mean([rank == 1 for rank in ranks])), 4),
        "mrr": round(float(np.mean([1.0 / rank for rank in ranks])), 4),
    }


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.window_quality", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--archive", type=Path, default=REPO / "model_store" / "minilm.mar", help="an embedding .mar")
    parser.add_argument("--passages", type=int, default=24, help="passages per document (default 24)")
    parser.add_argument("--precision", default="auto", help="handler.precision of the worker (default: as served)")
    parser.add_argument("--backend", default="auto", help="handler.backend of the worker (default: as served)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "reports", help="folder for the report files")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if not args.archive.is_file():
        parser.error(f"{args.archive} is not a file (build it with: python -m scripts.package minilm)")
    if args.passages < 2:
        parser.error("--passages must be at least 2")
    return args


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Long inputs: windows against truncation ({report['model']}, {report['served']}; {report['set']}; "
        f"{report['machine']})",
        "",
        "| queries | mode | recall@1 | MRR |",
        "|---|---|---:|---:|",
    ]
    for row in report["quality"]:
        lines.append(
            f"| {row['group']} ({row['queries']}) | {row['mode']} | {row['recall@1']:.4f} | {row['mrr']:.4f} |"
        )
    return "\n".join(lines) + f"\n\n`{report['command']}`\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.WARNING)
    from scripts.bench_embeddings import unpack
    from scripts.ops import machine
    from scripts.ops.handler_loader import load_handler

    name = args.archive.stem
    model_dir = unpack(args.archive, REPO / "build" / "quality" / name)
    overrides = {"cache_size": 0, "precision": args.precision, "backend": args.backend}
    handler, context = load_handler(model_dir, name, overrides)
    tokenizer = handler.loaded.tokenizer.untruncated()
    docs = documents(args.passages)
    chosen = queries(docs, tokenizer, handler.loaded.max_tokens)
    texts = [" ".join(passages) for passages in docs]
    query_vectors, _ = embed(handler, context, [{"text": query["text"]} for query in chosen])
    quality, windows = [], []
    for mode in MODES:
        doc_vectors, answers = embed(handler, context, [{"text": text, "long_input": mode} for text in texts])
        if mode == "windows":
            windows = [answer["windows"] for answer in answers]
        for group in ("tail", "head"):
            picked = [q for q, query in enumerate(chosen) if query["group"] == group]
            relevant = [chosen[q]["document"] for q in picked]
            scores = rank_scores(query_vectors[picked], doc_vectors, relevant)
            quality.append({"group": group, "queries": len(picked), "mode": mode, **scores})
    doc_tokens = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    report = {
        "model": name,
        "served": f"{handler.backend} {handler.precision}",
        "set": (
            f"{len(docs)} documents of {args.passages} passages ({min(doc_tokens)}-{max(doc_tokens)} tokens, "
            f"{min(windows)}-{max(windows)} windows), {len(chosen)} queries"
        ),
        "machine": machine.describe(),
        "command": " ".join(["python -m scripts.window_quality", *(sys.argv[1:] if argv is None else argv)]),
        "quality": quality,
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"window-quality-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"window-quality-{stamp}.md").write_text(markdown(report))
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
