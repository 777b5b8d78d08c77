"""The tokenizer's routes, served by every text model in text-embeddings-inference's (TEI's) shapes, so that a client
counts tokens and chunks texts without loading the model's tokenizer:

- ``/tokenize``: ``{"inputs": "..." | ["...", ...], "add_special_tokens": bool?, "prompt_name": str?}`` ->
  one list per input of ``{"id", "text", "special", "start", "stop"}`` (character offsets into the input; ``null``
  for a special token, whose ``text`` is the token itself). Texts are tokenized whole, not cut at the model's limit:
  that limit is ``max_input_length`` at ``/info``.
- ``/decode``: ``{"ids": [int, ...] | [[int, ...], ...], "skip_special_tokens": bool?}`` -> one text per id list.
- ``/info``: the model's limits as TEI reports them: ``max_input_length`` (tokens a text is cut to),
  ``max_client_batch_size`` (texts per request), ``max_batch_tokens`` (tokens per request after truncation).

A tokenizer request computes no row: it is answered from its parse (its payload carries the answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handlers.core.errors import RequestError, shown, too_large
from handlers.core.http import RequestView
from handlers.text.requests.common import (
    RequestContext,
    check_bool,
    check_fields,
    check_request_chars,
    json_object,
    text_list,
)
from handlers.text.rows import RowOptions

TOKENIZE_FIELDS = {"inputs", "add_special_tokens", "prompt_name"}
DECODE_FIELDS = {"ids", "skip_special_tokens"}


@dataclass
class TokenizerRequest:
    """A request answered without the model: its answer is made when it is parsed."""

    answer: Any
    texts: list[str] = field(default_factory=list)  # no rows
    names: list[str] = field(default_factory=list)
    truncate: bool = True
    options: list[RowOptions] | None = None


def prompt_of(api: RequestContext, body: dict[str, Any]) -> str:
    """The named prompt a tokenize request asks for, as the model's own requests read it (none by default)."""
    name = body.get("prompt_name")
    if name is None:
        return ""
    if not isinstance(name, str) or name not in api.info.prompts:
        known = sorted(api.info.prompts) if api.info.prompts else "none"
        raise RequestError(f"'prompt_name' {shown(name)} is not a prompt of this model (its prompts: {known})")
    return api.info.prompts[name]


def parse_tokenize(api: RequestContext, body: Any, request: RequestView) -> TokenizerRequest:
    body = json_object(body, request.content_type, "'inputs' (a text or a list of texts)")
    check_fields(body, TOKENIZE_FIELDS)
    if "inputs" not in body:
        raise RequestError("missing field 'inputs' (a text or a list of texts)")
    texts, _ = text_list(body["inputs"], "inputs", api.limits)
    special = check_bool(body, "add_special_tokens", True)
    prompt = prompt_of(api, body)
    texts = [prompt + text for text in texts]
    check_request_chars(sum(map(len, texts)), api.limits)
    if api.info.lowercase:  # the model reads lower-cased text: count what it reads
        texts = [text.lower() for text in texts]
    encodings = api.tokenizer.untruncated().encode_batch(texts, add_special_tokens=special)
    specials = api.tokenizer.special_ids
    answer = []
    for text, encoding in zip(texts, encodings, strict=True):
        tokens = []
        for token_id, token, (start, stop), is_special in zip(
            encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
        ):
            if is_special or token_id in specials:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append(
                    {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                )
        answer.append(tokens)
    return TokenizerRequest(answer)


def id_list(value: Any, where: str, vocabulary: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{where} must be a non-empty list of token ids")
    for index, token in enumerate(value):
        if type(token) is not int or not 0 <= token < vocabulary:
            raise RequestError(f"{where}[{index}] is {shown(token)}; token ids are integers in 0..{vocabulary - 1}")
    return value


def parse_decode(api: RequestContext, body: Any, request: RequestView) -> TokenizerRequest:
    body = json_object(body, request.content_type, "'ids' (a list of token ids, or a list of them)")
    check_fields(body, DECODE_FIELDS)
    if "ids" not in body:
        raise RequestError("missing field 'ids' (a list of token ids, or a list of such lists)")
    ids = body["ids"]
    vocabulary = api.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    lists = ids if isinstance(ids, list) and ids and all(isinstance(item, list) for item in ids) else [ids]
    if len(lists) > api.limits.max_inputs:
        raise too_large(
            f"'ids' has {len(lists)} lists; at most {api.limits.max_inputs} are allowed per request "
            "(handler.max_inputs)"
        )
    where = ["'ids'"] if lists is not ids else [f"'ids'[{i}]" for i in range(len(lists))]
    checked = [id_list(item, name, vocabulary) for item, name in zip(lists, where, strict=True)]
    total, bound = sum(map(len, checked)), api.max_request_tokens or api.limits.max_text_chars
    if total > bound:
        raise too_large(f"'ids' has {total} ids together; handler.max_request_tokens is {bound}")
    skip = check_bool(body, "skip_special_tokens", True)
    return TokenizerRequest(api.tokenizer.tokenizer.decode_batch(checked, skip_special_tokens=skip))


def parse_info(api: RequestContext, body: Any, request: RequestView) -> TokenizerRequest:
    """Any body (TEI's /info is a GET; TorchServe hands the handler a POST's body, or none)."""
    info = api.info
    return TokenizerRequest(
        {
            "model_id": api.served_name,
            "model_type": info.kind,
            "architecture": info.model_type,
            "max_input_length": info.max_tokens,
            "max_client_batch_size": api.limits.max_inputs,
            "max_batch_tokens": api.max_request_tokens,
            "prompts": sorted(info.prompts),
        }
    )


def answer_tokenizer(api: RequestContext, request: TokenizerRequest, rows: list[Any]) -> Any:
    return request.answer
