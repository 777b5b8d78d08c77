"""A team's own pre- and post-processing: plain functions in an optional ``handler.py`` beside the program.

::

    def preprocess(request):            # -> {input name: tensor, numpy array or nested list}
        values = [float(v) for v in request.text.split(",")]
        return {"features": torch.tensor([values])}

    def postprocess(outputs, request):  # outputs: {output name: tensor (this request's rows)} -> anything JSON
        return {"score": outputs["output0"].item()}

Either may be left out: without ``preprocess`` the request is the native JSON form (handlers/network/oip.py), without
``postprocess`` the answer is. :class:`HookRequest` is what both see of one request: its raw body bytes (a CSV line
sent as text/csv arrives as it was sent), the body as text or parsed JSON, its headers and content type.

The hooks run per request, around the batched computation: each request's tensors are checked against the signature
like any other request's (a refusal names the input), then batched with its neighbours. A hook that raises fails its
own request only, and the worker keeps serving:

- ``ValueError`` (also ``json.JSONDecodeError`` and ``UnicodeDecodeError``, its subclasses): the client sent something
  the hook cannot use: 400 with the exception's message;
- ``handlers.core.errors.RequestError(message, code=..., error_type=...)``: that status and error type (e.g. 413 for a
  request over a limit, 422 for one the model cannot compute);
- any other exception: our side failed: 500 naming the hook and the exception type (its traceback is logged).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from handlers.core.errors import RequestError, ServerError
from handlers.core.http import Float32List
from handlers.network.datatypes import of_dtype, to_bytes
from handlers.network.inputs import WireTensor, native_tensor
from handlers.network.signature import SignatureError

logger = logging.getLogger(__name__)

HOOKS_FILE = "handler.py"
HOOK_NAMES = ("preprocess", "postprocess")


class HookRequest:
    """One request as a hook sees it."""

    def __init__(self, body: Any, headers: Callable[[str], str | None], content_type: str) -> None:
        # TorchServe parses a body sent as application/json (a JSON string arrives as a str, JSON null as None) and
        # hands any other body over as bytes (text/* as str).
        self._is_parsed = not isinstance(body, bytes | bytearray | str | None) or (
            content_type == "application/json" and not isinstance(body, bytes | bytearray)
        )
        self._parsed: Any = body if self._is_parsed else None
        self._raw: bytes | None = None  # a parsed body is re-encoded only when a hook reads the bytes
        if not self._is_parsed:
            self._raw = body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")
        self._headers = headers
        self.content_type = content_type

    @property
    def body(self) -> bytes:
        """The raw body bytes (a body TorchServe parsed as JSON: that JSON again, NaN and Infinity tokens as sent)."""
        if self._raw is None:
            self._raw = json.dumps(self._parsed, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return self._raw

    @property
    def text(self) -> str:
        """The body as UTF-8 text (UnicodeDecodeError, a ValueError, when it is not)."""
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body parsed as JSON (json.JSONDecodeError, a ValueError, when it is not JSON, or nests too deeply)."""
        if self._is_parsed:
            return self._parsed
        try:
            return json.loads(self.text)
        except RecursionError:
            raise ValueError("body is not valid JSON: nested too deeply") from None

    def header(self, name: str) -> str | None:
        return self._headers(name)


@dataclass(frozen=True)
class Hooks:
    preprocess: Callable[..., Any] | None = None
    postprocess: Callable[..., Any] | None = None

    def __bool__(self) -> bool:
        return self.preprocess is not None or self.postprocess is not None

    def inputs(self, request: HookRequest) -> dict[str, WireTensor]:
        """preprocess(request) as the engine's wire tensors."""
        assert self.preprocess is not None
        made = call_hook("preprocess", self.preprocess, request)
        if not isinstance(made, Mapping) or not made:
            raise ServerError(
                f"{HOOKS_FILE} preprocess returned {type(made).__name__}; it must return a dict of the model's "
                "inputs by name (tensors, numpy arrays or nested lists)"
            )
        return {str(name): wire_tensor(str(name), value) for name, value in made.items()}

    def answer(self, outputs: Mapping[str, torch.Tensor], request: HookRequest) -> Any:
        """postprocess(outputs, request), as JSON values (tensors and arrays become nested lists)."""
        assert self.postprocess is not None
        return json_value(call_hook("postprocess", self.postprocess, dict(outputs), request))


def call_hook(name: str, hook: Callable[..., Any], *args: Any) -> Any:
    try:
        return hook(*args)
    except RequestError:
        raise
    except ValueError as error:
        raise RequestError(str(error) or f"{HOOKS_FILE} {name} refused the request ({type(error).__name__})") from None
    except Exception as error:
        logger.error("%s %s raised", HOOKS_FILE, name, exc_info=True)
        raise ServerError(f"{HOOKS_FILE} {name} failed: {type(error).__name__}: {str(error)[:200]}") from None


def wire_tensor(name: str, value: Any) -> WireTensor:
    """A hook's input as the engine takes any request's: a tensor or array keeps its dtype (checked like a binary
    input), a nested list is read like the native form."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        try:
            datatype = of_dtype(tensor.dtype)
        except ValueError as error:
            raise ServerError(f"{HOOKS_FILE} preprocess: input {name!r}: {error}") from None
        return WireTensor(name=name, shape=tuple(tensor.shape), datatype=datatype, raw=to_bytes(tensor))
    return native_tensor(name, value)


def json_value(value: Any) -> Any:
    if isinstance(value, Float32List):  # already JSON, and marked for float32's shortest text (handlers/core/http.py)
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    return value


def load_hooks(folder: str | Path) -> Hooks:
    """The folder's handler.py hooks (none when there is no such file); a file that does not import, or defines
    neither hook, is refused naming the fix."""
    path = Path(folder) / HOOKS_FILE
    if not path.is_file():
        return Hooks()
    module_name = f"network_hooks_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise SignatureError(
            f"{HOOKS_FILE} does not import: {type(error).__name__}: {str(error)[:300]}; fix it, or leave it out "
            "to serve the native JSON form"
        ) from None
    found = {name: getattr(module, name, None) for name in HOOK_NAMES}
    for name, hook in found.items():
        if hook is not None and not callable(hook):
            raise SignatureError(f"{HOOKS_FILE}: {name} is a {type(hook).__name__}; define it as a function")
    if not any(found.values()):
        raise SignatureError(
            f"{HOOKS_FILE} defines neither preprocess(request) nor postprocess(outputs, request); define one of them "
            "(docs/your-model.md, 'Your own network'), or leave the file out"
        )
    return Hooks(preprocess=found["preprocess"], postprocess=found["postprocess"])
