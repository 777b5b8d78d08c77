"""How much retrieval quality each compressed embedding type keeps, and what it costs the server.

A labelled set is built here, deterministically (no download): passages about cities, each on one aspect (weather,
food, transport, ...) in three wordings with details of their own, and a question per city and aspect whose relevant
passages are that city's three passages on that aspect. Every other passage of the same city (other aspects) and of
the same aspect (other cities) is a near miss, so a ranking has to get both right.

The passages and questions are embedded by the archive's own worker, in-process through its ``handle()`` (minilm by
default, as it is served: backend and precision ``auto``), with Cohere's ``/v2/embed`` body asking for every type at
once, so each type is exactly what a client receives. Per type, recall@10 (the share of a question's relevant
passages among its first 10) is averaged over the questions:

- ``float``: cosine similarity of the float32 vectors (the reference);
- ``int8`` and ``uint8``: Euclidean distance of the quantized vectors. Each dimension's 0 sits at its calibration
  range's middle, not at 0.0, so a dot product of the integers adds every dimension's offset times the other
  vector's values; a distance does not (vector stores' int8 scalar quantization ranks by distance). The dot product
  of the int8 vectors is reported too, as ``int8 (dot product)``;
- ``binary``: Hamming distance of the packed bits;
- ``binary + rescore``: the first 4 x 10 passages by Hamming distance, re-ranked by the float32 question vector's dot
  product with each passage's bits read as +1/-1 (the passages are stored as bits only).

Server time: the same 16-text request answered as float, int8, binary and every type at once, each timed through
``handle()`` (cache off) and the median of the repeats reported, with the answer's size.

    python -m scripts.embedding_quality                       # model_store/minilm.mar
    python -m scripts.embedding_quality --archive model_store/my-embedder.mar --json

Writes build/reports/embedding-quality-<time>.{json,md}; exit 0 when the targets hold (int8 >= 0.98 of float's
recall, binary >= 0.85, binary with rescoring >= 0.97), 1 when one does not, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
TARGETS = {"int8": 0.98, "binary": 0.85, "binary + rescore": 0.97}  # recall@10 relative to float's
K = 10
RESCORE_FACTOR = 4

CITIES = [
    "Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Krakow", "Montreal", "Osaka", "Accra", "Bogota",
    "Tallinn", "Perth", "Porto", "Seville", "Quito", "Dakar", "Bergen", "Cusco", "Leeds", "Tbilisi",
    "Valletta", "Zagreb", "Riga", "Kyoto", "Santiago", "Havana", "Marrakesh", "Dublin", "Ghent", "Bilbao",
]  # fmt: skip
# aspect -> (question, three passage wordings); {c} is the city, {n} a number, {w} a detail word of the passage's own.
ASPECTS = {
    "weather": (
        "What is the weather like in {c} during the year?",
        [
            "In {c} the summers are warm and dry, while winter brings around {n} days of rain and a cool {w} wind.",
            "The climate of {c} is mild: rarely freezing, often sunny, with showers from November to {w}.",
            "Pack a light jacket for {c}: evenings cool down quickly and the {w} season lasts about {n} weeks.",
        ],
    ),
    "food": (
        "Which local dishes should I eat in {c}?",
        [
            "Street stalls in {c} sell grilled fish, {w} stew and sweet pastries for less than {n} coins.",
            "The cuisine of {c} is known for slow-cooked beans, fresh bread and a spicy {w} sauce.",
            "Food lovers in {c} queue at the market hall, where {n} vendors serve the {w} speciality every morning.",
        ],
    ),
    "transport": (
        "How do I get around {c} by public transport?",
        [
            "{c} has {n} tram lines and a metro that runs until midnight; a day pass covers the {w} ferry too.",
            "Buses in {c} leave every {n} minutes from the central station, bikes are rented by the {w} square.",
            "Getting around {c} is easy: the {w} line links the airport to the old town in about {n} minutes.",
        ],
    ),
    "museums": (
        "Which museums are worth visiting in {c}?",
        [
            "The national gallery of {c} holds {n} paintings, and the {w} museum covers the city's maritime past.",
            "Art fans in {c} should see the modern collection in the former {w} factory, open daily except Monday.",
            "{c} has a small science museum where children can build {w} machines; entry is free on Sundays.",
        ],
    ),
    "history": (
        "What is the history of {c}?",
        [
            "{c} was founded as a trading post around the year {n} and grew rich on the {w} trade.",
            "Much of old {c} burned in a great fire and was rebuilt in stone by {w} architects.",
            "The walls of {c} date from the middle ages, when the town changed hands {n} times in a century.",
        ],
    ),
    "nightlife": (
        "Where can I go out at night in {c}?",
        [
            "Nightlife in {c} centres on the harbour, where {w} bars stay open until {n} in the morning.",
            "After dark the students of {c} fill the jazz clubs and the rooftop {w} terraces.",
            "{c} wakes up late: dinner starts at ten, and dancing in the {w} district goes on until dawn.",
        ],
    ),
    "hiking": (
        "Are there good hiking trails near {c}?",
        [
            "A marked trail leaves {c} for the {w} hills, a climb of {n} metres with views over the coast.",
            "Walkers near {c} follow the river gorge for a day, sleeping in the {w} mountain hut.",
            "The national park an hour from {c} has {n} kilometres of paths through {w} forest.",
        ],
    ),
    "costs": (
        "How expensive is it to stay in {c}?",
        [
            "A hostel bed in {c} costs about {n} euros a night, and a coffee in the {w} quarter costs two.",
            "Prices in {c} are high by regional standards: budget at least {n} a day for food and rooms.",
            "{c} is cheap outside the {w} season, when hotels cut their rates by half.",
        ],
    ),
    "safety": (
        "Is {c} safe for tourists?",
        [
            "{c} is generally safe, though pickpockets work the crowded {w} tram and the main station.",
            "Crime against visitors in {c} is rare; keep to lit streets near the {w} park after midnight.",
            "Police in {c} patrol the old town day and night, and the emergency number is {n}.",
        ],
    ),
    "beaches": (
        "What are the beaches like near {c}?",
        [
            "The beaches near {c} have fine sand and calm water; the {w} cove is reached by a {n}-minute walk.",
            "Surfers come to {c} for the Atlantic swell on the {w} shore, best from September.",
            "Swimming near {c} is possible from June, when the sea warms to about {n} degrees at the {w} beach.",
        ],
    ),
}
DETAILS = ["north", "copper", "olive", "harbour", "saffron", "granite", "willow", "amber", "cedar", "river", "salt"]


def labelled_set(seed: int = 7) -> tuple[list[str], list[str], list[set[int]]]:
    """(questions, passages, per question the indices of its relevant passages), the same for the same seed."""
    import random

    rng = random.Random(seed)
    questions, passages, relevant = [], [], []
    for city in CITIES:
        for question, wordings in ASPECTS.values():
            first = len(passages)
            for wording in wordings:
                passages.append(wording.format(c=city, n=rng.randint(3, 1900), w=rng.choice(DETAILS)))
            questions.append(question.format(c=city))
            relevant.append(set(range(first, len(passages))))
    return questions, passages, relevant


def embed_all(handler, context, texts: list[str], input_type: str, batch: int) -> dict[str, list]:
    """Every type of every text, as /v2/embed answers them."""
    from scripts.ops.handler_loader import set_requests, statuses

    result: dict[str, list] = {kind: [] for kind in TYPES}
    for start in range(0, len(texts), batch):
        body = {"texts": texts[start : start + batch], "input_type": input_type, "embedding_types": list(TYPES)}
        set_requests(context, [{"Content-Type": "application/json", "url_path": "v2/embed"}])
        [answer] = handler.handle([{"body": body}], context)
        [status] = statuses(context, 1)
        if status != 200:
            raise RuntimeError(f"/v2/embed answered {status}: {answer[:300]}")
        for kind, values in json.loads(answer)["embeddings"].items():
            result[kind].extend(values)
    return result


def bits(packed: np.ndarray, dimension: int) -> np.ndarray:
    return np.unpackbits(packed.astype(np.uint8), axis=-1)[:, :dimension]


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a**2).sum(1)[:, None] - 2 * a @ b.T + (b**2).sum(1)[None, :]


def rankings(questions: dict[str, list], passages: dict[str, list]) -> dict[str, np.ndarray]:
    """Per type, each question's passages best first (indices), as a vector store ranks that type."""
    q_float, p_float = (np.array(x["float"], dtype=np.float32) for x in (questions, passages))
    dimension = q_float.shape[1]
    scores = {"float": q_float @ p_float.T}
    q8, p8 = (np.array(x["int8"], dtype=np.float64) for x in (questions, passages))
    scores["int8 (dot product)"] = q8 @ p8.T
    scores["int8"] = -squared_distances(q8, p8)
    scores["uint8"] = -squared_distances(*(np.array(x["uint8"], dtype=np.float64) for x in (questions, passages)))
    q_bits, p_bits = (bits(np.array(x["ubinary"]), dimension) for x in (questions, passages))
    hamming = q_bits.astype(np.int32) @ (1 - p_bits).T + (1 - q_bits).astype(np.int32) @ p_bits.T
    scores["binary"] = -hamming.astype(np.float64)
    orders = {name: np.argsort(-value, axis=1, kind="stable") for name, value in scores.items()}
    signs = p_bits.astype(np.float32) * 2 - 1
    rescored = []
    for row, candidates in enumerate(orders["binary"][:, : RESCORE_FACTOR * K]):
        values = signs[candidates] @ q_float[row]
        rescored.append(candidates[np.argsort(-values, kind="stable")])
    orders["binary + rescore"] = np.array(rescored)
    return orders


def recall_at(order: np.ndarray, relevant: list[set[int]], k: int = K) -> float:
    return float(
        np.mean(
            [len(set(row[:k].tolist()) & wanted) / len(wanted) for row, wanted in zip(order, relevant, strict=True)]
        )
    )


def time_answers(handler, context, texts: list[str], repeats: int) -> list[dict]:
    """Server time and size of one 16-text answer per encoding (the same texts; the worker's cache is off)."""
    from scripts.ops.handler_loader import set_requests

    cases = {
        "float": ("v1/embeddings", {"input": texts, "encoding_format": "float"}),
        "base64": ("v1/embeddings", {"input": texts, "encoding_format": "base64"}),
        "int8": ("v1/embeddings", {"input": texts, "encoding_format": "int8"}),
        "binary": ("v1/embeddings", {"input": texts, "encoding_format": "binary"}),
        "all six (Cohere)": ("v2/embed", {"texts": texts, "embedding_types": list(TYPES)}),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    sizes = {}
    for _ in range(repeats):  # interleaved, so that a slower moment of the machine costs every encoding alike
        for name, (path, body) in cases.items():
            set_requests(context, [{"Content-Type": "application/json", "url_path": path}])
            started = time.perf_counter()
            [answer] = handler.handle([{"body": body}], context)
            seconds[name].append(time.perf_counter() - started)
            sizes[name] = len(answer.encode("utf-8"))
    return [
        {"encoding": name, "median_ms": round(1000 * statistics.median(values), 2), "bytes": sizes[name]}
        for name, values in seconds.items()
    ]


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.embedding_quality", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--archive", type=Path, default=REPO / "model_store" / "minilm.mar", help="an embedding .mar")
    parser.add_argument(
        "--model-dir", type=Path, help="a staged model folder with its model-config.yaml, instead of --archive"
    )
    parser.add_argument("--precision", default="auto", help="handler.precision of the worker (default: as served)")
    parser.add_argument("--backend", default="auto", help="handler.backend of the worker (default: as served)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per encoding (default 15)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "reports", help="folder for the report files")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.model_dir is None and not args.archive.is_file():
        parser.error(f"{args.archive} is not a file (build it with: python -m scripts.package minilm)")
    return args


def markdown(report: dict) -> str:
    lines = [
        f"Retrieval quality of compressed embeddings ({report['model']}, {report['served']}; {report['set']}; "
        f"{report['machine']})",
        "",
        "| type | recall@10 | of float's | bytes per vector | target |",
        "|---|---:|---:|---:|---|",
    ]
    for row in report["quality"]:
        target = f">= {TARGETS[row['type']]}" if row["type"] in TARGETS else ""
        lines.append(f"| {row['type']} | {row['recall@10']:.4f} | {row['relative']:.4f} | {row['bytes']} | {target} |")
    lines += ["", "| answer of 16 texts | server time (median) | bytes |", "|---|---:|---:|"]
    lines += [f"| {r['encoding']} | {r['median_ms']} ms | {r['bytes']} |" for r in report["timing"]]
    return "\n".join(lines) + f"\n\n`{report['command']}`\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.WARNING)
    from scripts.bench_embeddings import unpack
    from scripts.ops import machine
    from scripts.ops.handler_loader import load_handler

    name = args.archive.stem if args.model_dir is None else args.model_dir.name
    model_dir = args.model_dir or unpack(args.archive, REPO / "build" / "quality" / name)
    overrides = {"cache_size": 0, "precision": args.precision, "backend": args.backend}
    handler, context = load_handler(model_dir, "minilm" if args.model_dir else name, overrides)
    questions, passages, relevant = labelled_set()
    batch = 16  # texts per request: 16 passages stay within max_request_tokens (1024 for minilm)
    asked = embed_all(handler, context, questions, "search_query", batch)
    stored = embed_all(handler, context, passages, "search_document", batch)
    orders = rankings(asked, stored)
    dimension = len(stored["float"][0])
    sizes = {"float": 4 * dimension, "int8": dimension, "uint8": dimension, "binary": (dimension + 7) // 8}
    sizes["binary + rescore"], sizes["int8 (dot product)"] = sizes["binary"], dimension
    float_recall = recall_at(orders["float"], relevant)
    quality = [
        {
            "type": name,
            "recall@10": round(recall_at(order, relevant), 4),
            "relative": round(recall_at(order, relevant) / float_recall, 4),
            "bytes": sizes[name],
        }
        for name, order in orders.items()
    ]
    report = {
        "model": name,
        "served": f"{handler.backend} {handler.precision}",
        "set": f"{len(questions)} questions, {len(passages)} passages, {len(relevant[0])} relevant each",
        "machine": machine.describe(),
        "command": "python -m scripts.embedding_quality " + " ".join(sys.argv[1:] if argv is None else argv),
        "quality": quality,
        "timing": time_answers(handler, context, passages[:16], args.repeats),
        "base64_check": len(base64.b64decode(stored["base64"][0])) == 4 * dimension,
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"embedding-quality-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"embedding-quality-{stamp}.md").write_text(markdown(report))
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    met = all(row["relative"] >= TARGETS[row["type"]] for row in quality if row["type"] in TARGETS)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
