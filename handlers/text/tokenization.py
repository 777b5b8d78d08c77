"""The served tokenizer: exactly the one transformers builds from the folder, run with ``tokenizers`` alone.

transformers does not take a folder's ``tokenizer.json`` as it is: its tokenizer class rebuilds parts of it from
``tokenizer_config.json`` (a BERT's lower-casing and accent stripping, a decoder's end-of-text token), and its
``model_input_names`` decide which inputs reach the model (a BERT pair classifier whose tokenizer does not list
``token_type_ids`` is fed none, so both texts of a pair are segment 0). The packaging step therefore loads the folder
with transformers' ``AutoTokenizer`` once, writes the fast tokenizer it built to ``served_tokenizer.json``, records
what it feeds the model in ``text_model.json``, and proves on the reference rows (texts and pairs, truncation
included) that the served ids equal transformers' (:func:`export_tokenizer`). The worker loads that file with
``tokenizers`` (:func:`load_served_tokenizer`): no transformers import on the plain-BERT path, the same ids as the
reference library everywhere.

Padding is the handler's (handlers/text/buckets.py: per length bucket, always on the right: the attention mask keeps a
padded row's tokens what they are alone, for decoders too; or to a fixed length where the model reads its padding,
SigLIP's text tower); truncation is transformers' (longest first for pairs, on the side its tokenizer says).

The export and the loader need three things of a folder (:class:`TokenizerFolder`): where its tokenizer is, its token
limit, whether its own code may run. A text model's :class:`TextModelFolder` says them (text_model.json records the
tokenizer); so does the image-text kind's text tower (handlers/image/image_text_model.py, image_model.json).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from handlers.text.folder import TOKENIZER_FILE, FolderError, read_served

SERVED_TOKENIZER = "served_tokenizer.json"


class TokenizerFolder(Protocol):
    """What exporting and loading a folder's tokenizer needs of it (a TextModelFolder is one)."""

    @property
    def transformer_dir(self) -> str: ...  # folder (relative to the model folder) holding the tokenizer files

    @property
    def max_tokens(self) -> int: ...  # texts (and pairs) are truncated to this many tokens

    @property
    def remote_code(self) -> bool: ...  # the folder's own code may run (trust_remote_code)


@dataclass
class ServedTokenizer:
    """A ``tokenizers.Tokenizer`` that truncates at the model's limit and never pads, and what the model is fed."""

    tokenizer: Any
    pad_id: int
    special_ids: frozenset[int]
    max_tokens: int
    truncation_side: str = "right"
    limited: dict[int, Any] = field(default_factory=dict)  # copies truncating at a shorter limit

    def encode(self, row: Any) -> Any:
        """One text's (or pair's) encoding, truncated at the model's limit."""
        return self.tokenizer.encode(*row) if isinstance(row, tuple) else self.tokenizer.encode(row)

    def encode_batch(self, rows: list[Any], max_tokens: int = 0) -> list[Any]:
        """Encodings of texts and pairs, truncated at ``max_tokens`` (0: the model's own limit)."""
        return self.truncating_at(max_tokens).encode_batch(rows)

    def truncating_at(self, max_tokens: int) -> Any:
        if not max_tokens or max_tokens == self.max_tokens:
            return self.tokenizer
        if max_tokens not in self.limited:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(self.tokenizer.to_str())
            self.limited[max_tokens] = configure(copy, max_tokens, self.truncation_side)
        return self.limited[max_tokens]

    def untruncated(self) -> Any:
        """A copy that keeps every token (what /tokenize answers, so that a client can count and chunk)."""
        if -1 not in self.limited:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(self.tokenizer.to_str())
            copy.no_padding()
            copy.no_truncation()
            self.limited[-1] = copy
        return self.limited[-1]

    def prompt_length(self, prompt: str) -> int:
        """Tokens of a prompt at the start of a text, as sentence-transformers counts them for ``include_prompt:
        false``: the prompt tokenized alone, without a trailing special token (an end-of-text or [SEP])."""
        if not prompt:
            return 0
        ids = self.tokenizer.encode(prompt).ids
        return len(ids) - 1 if ids and ids[-1] in self.special_ids else len(ids)


def configure(tokenizer: Any, max_tokens: int, truncation_side: str) -> Any:
    tokenizer.no_padding()  # a saved tokenizer may pad every text to a fixed length
    tokenizer.enable_truncation(max_length=max_tokens, strategy="longest_first", direction=truncation_side)
    return tokenizer


def load_served_tokenizer(model_dir: str | os.PathLike[str], info: TokenizerFolder) -> ServedTokenizer:
    """The packaged tokenizer of a staged text model folder (text_model.json says it); a folder that was not staged
    by the packaging step is refused."""
    served = read_served(Path(model_dir)).get("tokenizer")
    if not served:
        raise FolderError(
            "text_model.json",
            "is missing: the folder was not staged by the packaging step",
            "package the model with python -m scripts.package (or stage it with python -m scripts.prepare_text_model)",
        )
    return served_tokenizer(model_dir, served, info.max_tokens)


def served_tokenizer(model_dir: str | os.PathLike[str], served: dict[str, Any], max_tokens: int) -> ServedTokenizer:
    """The tokenizer :func:`export_tokenizer` wrote into ``model_dir``, from what it returned (``served``: the file,
    the pad id, the special ids, the truncation side), truncating at ``max_tokens``; ``tokenizers`` only."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / served["file"]))
    side = str(served.get("truncation_side", "right"))
    configure(tokenizer, max_tokens, side)
    special = frozenset(int(i) for i in served.get("special_ids") or ())
    return ServedTokenizer(tokenizer, int(served["pad_id"]), special, max_tokens, side)


# ----------------------------------------------------------------------------------------------- package time
# Files a tokenizer can be rebuilt from when tokenizer.json is missing (WordPiece, SentencePiece, BPE vocabularies).
TOKENIZER_SOURCES = ("vocab.txt", "sentencepiece.bpe.model", "spiece.model", "vocab.json", "merges.txt")


def ensure_tokenizer_file(source: Path, out: Path, info: TokenizerFolder) -> str:
    """tokenizer.json in the staged folder: the folder's own, else transformers' offline conversion of its
    tokenizer files (``source``: the folder as given, ``out``: its staged copy); refuses a folder whose tokenizer
    cannot be loaded offline, naming the file and the fix."""
    where = Path(info.transformer_dir)
    target = out / where / TOKENIZER_FILE
    if target.is_file():
        try:
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(target))
        except Exception as error:
            raise FolderError(
                str(where / TOKENIZER_FILE), f"does not load ({error})", "save the tokenizer again"
            ) from None
        return "the folder's tokenizer.json"
    present = sorted(p.name for p in (source / where).iterdir() if p.name in TOKENIZER_SOURCES)
    if not present:
        # transformers would still build a tokenizer from config.json alone (special tokens only: every word
        # unknown), and the model would answer the same vector for every text: refuse instead.
        raise FolderError(
            str(where / TOKENIZER_FILE),
            f"is missing, and so is every other tokenizer file ({', '.join(TOKENIZER_SOURCES)})",
            "save the model's tokenizer into the folder with tokenizer.save_pretrained(folder), which writes "
            "tokenizer.json",
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(source / where), local_files_only=True)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("only a slow (Python) tokenizer loaded")
        tokenizer.save_pretrained(str(out / where))
    except Exception as error:
        raise FolderError(
            str(where / TOKENIZER_FILE),
            f"is missing, and no tokenizer loads offline from the folder's other files ({present or 'none'}: "
            f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''})",
            "save the model's tokenizer into the folder with tokenizer.save_pretrained(folder), which writes "
            "tokenizer.json",
        ) from None
    if not target.is_file():
        raise FolderError(str(where / TOKENIZER_FILE), "could not be written by transformers", "save it yourself")
    return "converted by transformers from the folder's tokenizer files"


def transformers_tokenizer(folder: Path, info: TokenizerFolder) -> Any:
    """The tokenizer transformers builds from the folder (offline); a folder without a fast one is refused."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    where = folder / info.transformer_dir
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True, trust_remote_code=info.remote_code)
    except Exception as error:
        raise FolderError(
            f"{info.transformer_dir + '/' if info.transformer_dir else ''}tokenizer_config.json",
            f"transformers cannot load the folder's tokenizer offline ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200] if str(error) else ''})",
            "save the model's tokenizer into the folder with tokenizer.save_pretrained(folder)",
        ) from None
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise FolderError(
            "tokenizer.json",
            f"transformers loads only a slow {type(tokenizer).__name__} from the folder",
            "save a fast tokenizer (tokenizer.json) with tokenizer.save_pretrained(folder)",
        )
    return tokenizer


def pad_id_of(tokenizer: Any) -> int:
    """The id rows are padded with: the tokenizer's pad token, else its end-of-text token, else 0. A right-padded
    token is masked, so for a model without a pad token (a decoder) any id computes the same."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if isinstance(value, int):
            return value
    return 0


def export_tokenizer(folder: Path, info: TokenizerFolder, body_inputs: set[str], rows: list[Any]) -> dict[str, Any]:
    """Write transformers' tokenizer of the staged ``folder`` as served_tokenizer.json and check it against
    transformers on ``rows`` (texts and pairs); returns what text_model.json records about it.

    ``body_inputs``: the arguments the model's forward takes; the model is fed what the tokenizer produces and the
    model takes (as transformers' pipelines and sentence-transformers feed it). ``tokenizer_inputs`` in the record:
    what transformers' tokenizer makes by itself (whether a mask is among them decides a fixed padding's mask,
    handlers/text/buckets.py PaddingRule)."""
    from tokenizers import Tokenizer

    tokenizer = transformers_tokenizer(folder, info)
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    truncation_side = str(getattr(tokenizer, "truncation_side", "right") or "right")
    configure(backend, info.max_tokens, truncation_side)
    backend.save(str(folder / SERVED_TOKENIZER))
    names = [str(name) for name in tokenizer.model_input_names]
    input_names = ["input_ids", "attention_mask"] + [
        name for name in names if name not in ("input_ids", "attention_mask") and name in body_inputs
    ]
    check_ids(tokenizer, backend, rows, info.max_tokens, "token_type_ids" in input_names)
    return {
        "file": SERVED_TOKENIZER,
        "class": type(tokenizer).__name__,
        "input_names": input_names,
        "tokenizer_inputs": names,
        "pad_id": pad_id_of(tokenizer),
        "special_ids": sorted(int(i) for i in tokenizer.all_special_ids),
        "truncation_side": truncation_side,
    }


def check_ids(tokenizer: Any, backend: Any, rows: list[Any], max_tokens: int, segments: bool) -> None:
    """The served ids (and segment ids, where the model takes them) equal transformers' for every row."""
    ours = backend.encode_batch(rows)
    for row, encoding in zip(rows, ours, strict=True):
        first, second = (row, None) if isinstance(row, str) else row
        expected = tokenizer(first, second, truncation=True, max_length=max_tokens)
        same = encoding.ids == list(expected["input_ids"])
        if same and segments and "token_type_ids" in expected:
            same = encoding.type_ids == list(expected["token_type_ids"])
        if not same:
            shown = row if isinstance(row, str) else " | ".join(row)
            raise FolderError(
                "tokenizer.json",
                f"the served tokenizer does not reproduce transformers' {type(tokenizer).__name__} on "
                f"{shown[:80]!r} ({len(encoding.ids)} vs {len(expected['input_ids'])} ids)",
                "save the tokenizer with tokenizer.save_pretrained(folder) so that tokenizer.json is what "
                "transformers uses",
            )
