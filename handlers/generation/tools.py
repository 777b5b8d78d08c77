"""Tools on chat: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, and the tool calls in answers.

A request's tools are checked here (:func:`checked_tools`), rendered into the prompt by the chat template
(:func:`handlers.generation.chat.chat_prompt_ids` passes them as ``tools=``, as transformers' ``apply_chat_template``
takes them), and the answer is constrained by the grammar machinery of ``response_format``
(:mod:`handlers.generation.structured`, llguidance) to the tool-call format every model folder gets here, the
Hermes/Qwen one that vLLM's ``hermes`` parser reads::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

(compact JSON, ``name`` first; several calls are separated by a newline). What ``tool_choice`` asks for:

- ``"none"``: the tools are in the prompt, the answer is free text (no grammar);
- ``"auto"`` (the default with tools): either free text that never contains the marker ``<tool_call>``, or one or
  more tool calls (one grammar: ``start: TEXT | calls``, the text a regex that excludes the marker), so a model
  that starts a call has to finish a valid one;
- ``"required"``: one or more calls of any of the tools;
- ``{"type": "function", "function": {"name": ...}}``: calls of that tool only.

Every call's ``arguments`` follow its function's ``parameters`` JSON schema (a function without ``parameters``
takes an empty object); ``parallel_tool_calls: false`` allows one call, true (the default) several.
:class:`ToolCallReader` turns the generated text back into OpenAI's ``message.tool_calls`` (and
``delta.tool_calls`` when streamed), with ``finish_reason: "tool_calls"``; text cut by ``max_tokens`` in the middle
of a call stays text with ``finish_reason: "length"``.

Refused with a 400 naming the field: more than :data:`MAX_TOOLS` tools or :data:`structured.MAX_SCHEMA_CHARS`
characters of them, a parameter schema nested deeper than :data:`structured.MAX_SCHEMA_DEPTH` (the same bounds as a
response_format schema, so the grammar compiles in bounded time), names that are not ``^[a-zA-Z0-9_-]{1,64}$`` or
repeat, a named ``tool_choice`` that is not in ``tools``, ``tool_choice`` other than "none" without tools, tools
with a ``response_format`` other than text unless ``tool_choice`` is "none" (two grammars for one answer), and a
folder whose own chat template does not reference ``tools`` (it cannot show them to the model; folders without a
template get the project's plain template, which does).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

import llguidance

from handlers.core.errors import shown
from handlers.generation import structured
from handlers.generation.requests import FieldError, Served

FIELD = "tools"
CHOICE_FIELD = "tool_choice"
PARALLEL_FIELD = "parallel_tool_calls"
MAX_TOOLS = 128  # OpenAI's own limit on functions per request
MARKER = "<tool_call>"
END = "</tool_call>"
SEPARATOR = "\n"
CHOICES = ("none", "auto", "required")
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    spec: dict[str, Any]  # as the request gave it ({"type": "function", "function": {...}}), for the template


@dataclass(frozen=True)
class ToolCalling:
    """A request's checked tools and what ``tool_choice`` asks: ``choice`` "none", "auto", "required" or
    "function" (then ``name`` is the one tool to call)."""

    tools: tuple[Tool, ...]
    choice: str
    name: str | None
    parallel: bool

    @property
    def specs(self) -> list[dict[str, Any]]:
        """The tools as the chat template gets them (transformers' ``tools=``: OpenAI's shape)."""
        return [tool.spec for tool in self.tools]

    @property
    def constrained(self) -> bool:
        return self.choice != "none"

    def grammar(self) -> str:
        """The llguidance lark grammar of the answer (only when constrained)."""
        callable_tools = [tool for tool in self.tools if self.choice != "function" or tool.name == self.name]
        call_schema = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for tool in callable_tools
            ],
            "x-guidance": structured.JSON_OPTIONS,  # compact JSON, as response_format's answers
        }
        calls = f"call ({json.dumps(SEPARATOR)} call)*" if self.parallel else "call"
        lines = [
            "%llguidance {}",
            "start: TEXT | calls" if self.choice == "auto" else "start: calls",
            f"calls: {calls}",
            f"call: {json.dumps(MARKER)} %json {json.dumps(call_schema)} {json.dumps(END)}",
        ]
        if self.choice == "auto":  # free text that never writes the marker: a started call must be a valid one
            lines.append(f"TEXT: /(?s:.*)/ & ~/(?s:.*{MARKER}.*)/")
        return "\n".join(lines) + "\n"


def field_error(field: str, message: str) -> FieldError:
    return FieldError(field, message[:500])


def checked_function(tool: Any, index: int) -> Tool:
    where = f"{FIELD}[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) - {"type", "function"}:
        shape = '{"type": "function", "function": {...}}'
        raise field_error(FIELD, f"'{where}' must be {shape}, got {shown(tool)}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise field_error(FIELD, f"'{where}.function' must be an object with a 'name', got {shown(function)}")
    unknown = sorted(set(function) - FUNCTION_KEYS)
    if unknown:
        raise field_error(FIELD, f"'{where}.function' has unknown field(s) {unknown}")
    name = function.get("name")
    if not isinstance(name, str) or not structured.NAME_PATTERN.fullmatch(name):
        raise field_error(
            FIELD, f"'{where}.function.name' is {shown(name)}; it must be 1 to 64 letters, digits, _ or - characters"
        )
    for key, kinds, wanted in (("description", (str,), "a string"), ("strict", (bool,), "true or false")):
        if function.get(key) is not None and not isinstance(function[key], kinds):
            raise field_error(FIELD, f"'{where}.function.{key}' must be {wanted}, got {shown(function[key])}")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = EMPTY_PARAMETERS  # OpenAI: no parameters is an empty parameter list
    elif not isinstance(parameters, dict):
        raise field_error(FIELD, f"'{where}.function.parameters' must be a JSON schema object, got {shown(parameters)}")
    elif structured.nesting(parameters) > structured.MAX_SCHEMA_DEPTH:
        raise field_error(
            FIELD,
            f"'{where}.function.parameters' nests objects and arrays more than {structured.MAX_SCHEMA_DEPTH} levels "
            f"deep; at most {structured.MAX_SCHEMA_DEPTH} are allowed",
        )
    return Tool(name, parameters, tool)


def checked_choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if isinstance(value, str):
        if value not in CHOICES:
            raise field_error(
                CHOICE_FIELD, f"'{CHOICE_FIELD}' is {shown(value)}; it must be one of {list(CHOICES)} or a function"
            )
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str) or len(value) > 2:
        raise field_error(
            CHOICE_FIELD,
            f"'{CHOICE_FIELD}' must be one of {list(CHOICES)} or "
            f'{{"type": "function", "function": {{"name": ...}}}}, got {shown(value)}',
        )
    if name not in names:
        raise field_error(CHOICE_FIELD, f"'{CHOICE_FIELD}' names the function {shown(name)}, which is not in 'tools'")
    return "function", name


def parse_tools(body: dict[str, Any]) -> ToolCalling | None:
    """The body's tools fields, checked (None: no tools, as with ``[]``)."""
    tools = body.get(FIELD, [])
    if not isinstance(tools, list):
        raise field_error(FIELD, f"'{FIELD}' must be a list of functions, got {shown(tools)}")
    parallel = body.get(PARALLEL_FIELD, True)
    if not isinstance(parallel, bool):
        raise field_error(PARALLEL_FIELD, f"'{PARALLEL_FIELD}' must be true or false, got {shown(parallel)}")
    if not tools:
        choice = body.get(CHOICE_FIELD, "none")
        if choice != "none":
            raise field_error(CHOICE_FIELD, f"'{CHOICE_FIELD}' is {shown(choice)} but no 'tools' are given")
        return None
    if len(tools) > MAX_TOOLS:
        raise field_error(FIELD, f"'{FIELD}' has {len(tools)} functions; at most {MAX_TOOLS} are allowed")
    chars = len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False))
    if chars > structured.MAX_SCHEMA_CHARS:
        raise field_error(
            FIELD, f"'{FIELD}' has {chars} characters as JSON; at most {structured.MAX_SCHEMA_CHARS} are allowed"
        )
    checked = [checked_function(tool, index) for index, tool in enumerate(tools)]
    names = [tool.name for tool in checked]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise field_error(FIELD, f"'{FIELD}' names the function(s) {repeated} more than once")
    choice, name = checked_choice(body.get(CHOICE_FIELD, "auto"), names)
    return ToolCalling(tuple(checked), choice, name, parallel)


def checked_tools(
    body: dict[str, Any], served: Served, response_format: structured.CompiledFormat | None
) -> tuple[ToolCalling | None, structured.CompiledFormat | None]:
    """The request's tools and the grammar its answer follows: the tools' grammar when ``tool_choice`` constrains
    the answer, else ``response_format``'s (either may be None)."""
    calling = parse_tools(body)
    if calling is None or not calling.constrained:
        return calling, response_format
    if response_format is not None:
        raise field_error(
            structured.FIELD,
            f"'{structured.FIELD}' and 'tools' with '{CHOICE_FIELD}' {shown(body.get(CHOICE_FIELD, 'auto'))} ask "
            f"for two output formats; give '{CHOICE_FIELD}': \"none\" or leave '{structured.FIELD}' out",
        )
    grammars = structured.grammars_for(served.tokenizer, served.limits.vocab_size)
    grammar = llguidance.LLMatcher.grammar_from_lark(calling.grammar())
    matcher = grammars.matcher(grammar, FIELD, "parameter schemas")
    return calling, structured.CompiledFormat(None, matcher, grammars.vocab_size, FIELD)


# ------------------------------------------------------------------------------------------------------ answers
def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallReader:
    """One choice's generated text read back as content and tool calls, as it streams in (``feed``) and at its end
    (``finish``). Each returns ``(content, calls)``: text to show as content, and complete calls as
    ``{"id", "type", "function": {"name", "arguments"}}`` (``arguments`` a JSON string, as OpenAI sends it)."""

    def __init__(self) -> None:
        self.buffer = ""
        self.mode = "start"  # "start": undecided, "text": a plain answer, "calls": tool calls
        self.calls = 0  # calls read so far

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self.buffer += text
        if self.mode == "start":
            if self.buffer.startswith(MARKER):
                self.mode = "calls"
            elif MARKER.startswith(self.buffer):
                return "", []  # could still become the marker
            else:
                self.mode = "text"
        if self.mode == "text":
            content, self.buffer = self.buffer, ""
            return content, []
        calls: list[dict[str, Any]] = []
        while True:
            block = self.buffer.lstrip(SEPARATOR)
            end = block.find(END)
            if not block.startswith(MARKER) or end < 0:
                return "", calls
            call = read_call(block[len(MARKER) : end])
            if call is None:  # not a call (only without a grammar, e.g. cut by a stop sequence): leave it as text
                return "", calls
            calls.append(call)
            self.calls += 1
            self.buffer = block[end + len(END) :]

    def finish(self) -> str:
        """What is left: text that never became a call (a call cut by max_tokens or a stop sequence)."""
        rest, self.buffer = self.buffer, ""
        return rest.lstrip(SEPARATOR) if self.mode == "calls" else rest


def read_call(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or "arguments" not in value:
        return None
    arguments = json.dumps(value["arguments"], ensure_ascii=False)
    return {"id": call_id(), "type": "function", "function": {"name": value["name"], "arguments": arguments}}
