"""The similarity cache's verdict on two texts, and why: the check an operator runs (`modelctl paraphrase`) and the
report's simulation (loadtests/semantic_cache_report.py) share it.

The verdict always comes from the worker's own code (handlers/generation/semantic_cache/cache.py): the stored text
goes into a one-entry cache and the new text is looked up in it, with the settings of the archive (or given ones).
The vectors and verifier scores come from where the operator says: the models packed in a generator archive, loaded
in process exactly as a worker loads them (no server needed), or an embedding model and a text-classifier / reranker
served by a running TorchServe (through its inference URL). What explains the verdict is printed beside it: the
cosine similarity against the threshold, the group (numbers and negations), each lexical reason, the verifier's score.
"""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import torch

from handlers.text.cache import CachedRow
from scripts.ops.auth import KeySource, send_renewing


class CheckError(Exception):
    """The check cannot run (an archive without an embedder, a server that refuses); the message says why."""


# ------------------------------------------------------------------------------------------------ stand-ins
class Vectors:
    """Stands in for the cache's embedder: each text's unit vector, computed beforehand by the real model."""

    def __init__(self, dimension: int, vectors: dict[str, torch.Tensor]) -> None:
        self.dimension = dimension
        self.vectors = vectors

    def embed(self, texts: list[str]) -> list[Any]:
        return [CachedRow(self.vectors[text], tokens=0, truncated=False) for text in texts]


class Scores:
    """Stands in for the cache's verifier: each (new, stored) pair's score, computed beforehand by the real model."""

    def __init__(self, scores: dict[tuple[str, str], float]) -> None:
        self.scores = scores

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        return [self.scores[pair] for pair in pairs]


def simulated_cache(settings: dict[str, Any], vectors: Vectors, scores: Scores | None) -> Any:
    """A worker's SemanticCache (no shared tier) over stand-ins."""
    from handlers.generation.semantic_cache.cache import SemanticCache

    model = {"name": "check", "version": "1", "info": ""}
    return SemanticCache(settings, vectors, model, None, scores)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ models
def unpacked(archive: Path, into: Path) -> Path:
    with zipfile.ZipFile(archive) as mar:
        mar.extractall(into)
    if not (into / "embedder").is_dir():
        raise CheckError(f"{archive} packs no embedder/; package it with --var embedder=... (docs/semantic-cache.md)")
    return into


def load_models(model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The embedder and verifier (None without one) a generator folder packs, loaded as a worker loads them, and its
    similarity-cache settings."""
    import yaml

    from handlers.generation.semantic_cache.embedder import load_embedder
    from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION
    from handlers.generation.semantic_cache.verifier import load_verifier

    handler = (yaml.safe_load((model_dir / "model-config.yaml").read_text()) or {}).get("handler") or {}
    settings = SEMANTIC_CACHE_OPTION.check("semantic_cache", handler.get("semantic_cache", {}))
    embedder = load_embedder(str(model_dir), settings["embedder"], settings["embedder_handler"], "check", "1", 1, None)
    verifier = load_verifier(
        str(model_dir),
        settings["verifier"],
        settings["verifier_handler"],
        settings["verifier_label"],
        "check",
        "1",
        1,
        None,
    )
    return embedder, verifier, settings


# ------------------------------------------------------------------------------------------------ the check
@dataclass
class Sources:
    """Where a check's numbers come from: vectors of texts, and (optionally) scores of (new, stored) pairs."""

    embed: Callable[[list[str]], list[torch.Tensor]]
    score: Callable[[list[tuple[str, str]]], list[float]] | None
    describe: dict[str, Any]


def archive_sources(archive: Path, folder: Path) -> tuple[Sources, dict[str, Any]]:
    embedder, verifier, settings = load_models(unpacked(archive, folder))
    sources = Sources(
        lambda texts: [row.value for row in embedder.embed(texts)],
        verifier.score if verifier is not None else None,
        {
            "archive": str(archive),
            "embedder": embedder.describe(),
            "verifier": verifier.describe() if verifier is not None else None,
        },
    )
    return sources, settings


def served_sources(inference_url: str, embedder: str, verifier: str | None, token: str | KeySource | None) -> Sources:
    """An embedding model and a text-classifier / reranker that a running TorchServe serves (`token`: a token, or a
    KeySource whose key is renewed after a rotation)."""
    keys = KeySource.of(token)

    def post(model: str, body: dict[str, Any]) -> Any:
        url = f"{inference_url.rstrip('/')}/predictions/{model}"
        try:
            response = send_renewing(lambda headers: requests.post(url, json=body, headers=headers, timeout=60), keys)
        except requests.RequestException as error:
            raise CheckError(f"{url}: {type(error).__name__}: {error}") from None
        if response.status_code != 200:
            raise CheckError(f"{url} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def embed(texts: list[str]) -> list[torch.Tensor]:
        answer = post(embedder, {"input": texts})
        rows = [torch.tensor(item["embedding"], dtype=torch.float32) for item in answer["data"]]
        return [torch.nn.functional.normalize(row, dim=0) for row in rows]

    def score(pairs: list[tuple[str, str]]) -> list[float]:
        from handlers.generation.semantic_cache.verifier import positive_label

        assert verifier is not None
        answer = post(verifier, {"inputs": [list(pair) for pair in pairs], "top_k": None})
        results = []
        for result in answer["results"]:
            labels = {item["label"]: float(item["score"]) for item in result["scores"]}
            results.append(labels[positive_label(list(labels), "auto")])
        return results

    return Sources(embed, score if verifier else None, {"embedder": embedder, "verifier": verifier})


def check(new: str, stored: str, sources: Sources, settings: dict[str, Any]) -> dict[str, Any]:
    """Would ``stored``'s answer answer ``new``, and why: the verdict of the worker's own cache code, with each
    figure behind it."""
    from handlers.generation.semantic_cache import lexical
    from handlers.generation.semantic_cache.cache import SemanticQuery, exact_terms, group_hash
    from handlers.generation.semantic_cache.store import StoredAnswer

    new_vector, stored_vector = sources.embed([new, stored])
    similarity = float(new_vector @ stored_vector)
    score = sources.score([(new, stored)])[0] if sources.score is not None else None
    scores = Scores({(new, stored): score}) if score is not None else None
    cache = simulated_cache(
        settings, Vectors(int(new_vector.shape[0]), {new: new_vector, stored: stored_vector}), scores
    )
    groups = {text: group_hash([exact_terms(text) if settings["exact_terms"] else ""]) for text in (new, stored)}
    [kept] = cache.lookup([SemanticQuery(groups[stored], stored, 1.0)])
    cache.remember([(groups[stored], kept.vector, StoredAnswer("stored", "stop", 1))])
    [looked] = cache.lookup([SemanticQuery(groups[new], new, settings["threshold"])])
    new_reading, stored_reading = lexical.read(new), lexical.read(stored)
    reasons = lexical.compare(new_reading, stored_reading)
    result: dict[str, Any] = {
        "new": new,
        "stored": stored,
        "verdict": "hit" if looked.hit is not None else "miss",
        "similarity": round(similarity, 4),
        "threshold": settings["threshold"],
        "same_group": groups[new] == groups[stored],
        "exact_terms": {"new": exact_terms(new), "stored": exact_terms(stored)} if settings["exact_terms"] else None,
        "lexical_check": settings["lexical_check"],
        "lexical_reasons": reasons,
        "readings": {"new": described(new_reading), "stored": described(stored_reading)},
        "verifier_score": None if score is None else round(score, 4),
        "verifier_threshold": settings["verifier_threshold"] if score is not None else None,
        "sources": sources.describe,
    }
    result["why"] = why(result)
    return result


def described(reading: Any) -> dict[str, Any]:
    """What the lexical check read in a text, for people."""
    return {
        "numbers": list(reading.numbers),
        "negations": reading.negations,
        "relations": sorted(reading.relations),
        "comparatives": list(reading.degrees),
        "asks_for": sorted(reading.targets),
        "roles": [f"{role} {word}" for role, word in reading.roles],
        "names": [" ".join(name) for name in reading.names],
    }


def why(result: dict[str, Any]) -> str:
    """One line: what decided the verdict."""
    if not result["same_group"]:
        terms = result["exact_terms"]
        return f"numbers or negations differ ({terms['new']} / {terms['stored']}): never compared (exact_terms)"
    if result["similarity"] < result["threshold"]:
        return f"cosine similarity {result['similarity']} is below the threshold {result['threshold']}"
    if result["lexical_check"] and result["lexical_reasons"]:
        return "the lexical check refused: " + "; ".join(result["lexical_reasons"])
    score = result["verifier_score"]
    if score is not None and score < result["verifier_threshold"]:
        return f"the verifier scored {score}, below its threshold {result['verifier_threshold']}"
    passed = "no lexical reason to refuse" if result["lexical_check"] else "the lexical check is off"
    verified = f", the verifier scored {score}" if score is not None else ""
    return f"similar enough ({result['similarity']} >= {result['threshold']}), {passed}{verified}"


def lines(result: dict[str, Any]) -> list[str]:
    """The check as text for a terminal."""
    out = [
        f"new:     {result['new']}",
        f"stored:  {result['stored']}",
        f"verdict: {result['verdict'].upper()}: {result['why']}",
        "",
        f"cosine similarity {result['similarity']} (candidate at >= {result['threshold']})",
    ]
    if result["exact_terms"] is not None:
        terms = result["exact_terms"]
        same = "same group" if result["same_group"] else "different groups"
        out.append(f"numbers|negations: {terms['new']!r} / {terms['stored']!r} ({same})")
    state = "on" if result["lexical_check"] else "off (shown for information)"
    out.append(f"lexical check ({state}): " + ("; ".join(result["lexical_reasons"]) or "nothing differs"))
    for key in ("numbers", "relations", "comparatives", "asks_for", "roles", "names"):
        new, stored = result["readings"]["new"][key], result["readings"]["stored"][key]
        if new or stored:
            out.append(f"  {key:12} {', '.join(map(str, new)) or '-'}  /  {', '.join(map(str, stored)) or '-'}")
    if result["verifier_score"] is not None:
        out.append(f"verifier score {result['verifier_score']} (passes at >= {result['verifier_threshold']})")
    else:
        out.append("verifier: none")
    return out


def settings_with(base: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The similarity cache's settings with the given ones replaced (None: keep), validated as a model's are."""
    from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION

    chosen = {key: value for key, value in overrides.items() if value is not None}
    keys = ("threshold", "candidates", "lexical_check", "exact_terms", "verifier_threshold")
    return SEMANTIC_CACHE_OPTION.check("semantic_cache", {**{k: base[k] for k in keys if k in base}, **chosen})


def run_check(
    new: str,
    stored: str,
    *,
    archive: Path | None = None,
    inference_url: str = "",
    embedder: str | None = None,
    verifier: str | None = None,
    token: str | KeySource | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The check with the models of an archive (in process) or served ones (through the inference URL)."""
    if archive is not None:
        if not archive.is_file():
            raise CheckError(f"{archive} does not exist")
        with tempfile.TemporaryDirectory(prefix="paraphrase-check-") as folder:
            sources, settings = archive_sources(archive, Path(folder))
            return check(new, stored, sources, settings_with(settings, **(overrides or {})))
    if not embedder:
        raise CheckError("name the models: --archive a generator .mar, or --embedder a served embedding model")
    sources = served_sources(inference_url, embedder, verifier, token)
    return check(new, stored, sources, settings_with({}, **(overrides or {})))
