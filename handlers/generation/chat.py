"""Chat messages (OpenAI's ``messages``) checked and rendered into one prompt's token ids.

Rendering is transformers' own ``apply_chat_template`` on the model's tokenizer, with ``add_generation_prompt=True``
(the text ends where the assistant's answer starts) and ``sanitize_control_tokens=True`` (a special token written in
a message, e.g. ``<|endoftext|>``, is encoded as ordinary text: only the template's own control tokens are tokens, so
a message cannot forge a turn or end the prompt). The template is the model's when its tokenizer has one
(``chat_template`` in the folder's tokenizer_config.json or chat_template.jinja), else :data:`PLAIN_TEMPLATE`::

    system: You are brief.
    user: Hello
    assistant:

(one ``role: content`` line per message, ``role (name): content`` when the message has a ``name``, then
``assistant:``). A model trained without a chat template has no format of its own to follow; this one is plain text
that any causal LM continues, and a model folder can always bring its own.

Accepted messages: ``role`` system, developer (rendered as system), user, assistant or tool; ``content`` a string or
a list of ``{"type": "text", "text": ...}`` parts (joined with newlines, as vLLM does); ``name`` optional. An
assistant message may carry ``tool_calls`` (OpenAI's shape; its ``content`` may then be null), whose ``arguments``
JSON string the template gets parsed (templates write them with ``tojson``, as vLLM passes them); a tool message
needs ``tool_call_id``. Images and audio are refused with a message naming the place; other keys are refused unless
null or empty.

Tools (:mod:`handlers.generation.tools`) are rendered by the template: transformers passes ``tools=`` to it. A
folder's own template must reference ``tools`` (else a 400 naming the template); :data:`PLAIN_TEMPLATE` lists them
in a first ``tools`` line (compact JSON) with the format a call takes, and writes an assistant's earlier calls in
that format.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from handlers.core.errors import shown, surrogate_at
from handlers.generation.requests import FieldError, GenerationLimits, prompt_tokens
from handlers.generation.semantic_cache.options import CacheRequest, PromptLookup

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
# Without tools or tool messages this renders exactly what it did before tools were served (the prefix and
# similarity caches' entries stay valid).
PLAIN_TEMPLATE = (
    '{%- if tools %}tools (<tool_call>{"name": ..., "arguments": ...}</tool_call>):'
    "{% for tool in tools %} {{ tool['function'] | tojson(separators=(',', ':')) }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{%- for message in messages %}"
    "{{ message['role'] }}{% if message.get('name') %} ({{ message['name'] }}){% endif %}"
    "{% if message.get('tool_call_id') %} ({{ message['tool_call_id'] }}){% endif %}: {{ message['content'] }}"
    "{% for call in message.get('tool_calls') or [] %}{% if message['content'] or not loop.first %}{{ '\\n' }}"
    "{% endif %}<tool_call>{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} "
    "| tojson }}</tool_call>{% endfor %}{{ '\\n' }}"
    "{% endfor %}"
    "{%- if add_generation_prompt %}assistant:{% endif %}"
)
# (a literal newline right after a block tag would be dropped: transformers renders with trim_blocks)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def refuse(message: str) -> FieldError:
    return FieldError("messages", message)


def message_content(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(f"'{where}.content' must be a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for index, part in enumerate(content):
        place = f"'{where}.content[{index}]'"
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise refuse(f'{place} must be an object {{"type": "text", "text": "..."}}, got {shown(part)}')
        if part.get("type") != "text" or set(part) - {"type", "text"}:
            raise refuse(f"{place} has type {shown(part.get('type'))}; only text parts are served (no images, audio)")
        texts.append(part["text"])
    return "\n".join(texts)


def checked_message(message: Any, index: int) -> dict[str, Any]:
    """One message as the template sees it: {role, content[, name][, tool_calls][, tool_call_id]}."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise refuse(f"'{where}' must be an object with 'role' and 'content', got {type(message).__name__}")
    extra = sorted(key for key, value in message.items() if key not in MESSAGE_KEYS and value not in (None, [], {}))
    if extra:
        raise refuse(f"'{where}' has {extra}: images, audio and other parts are not served"[:300])
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise refuse(f"'{where}.role' is {shown(role)}; the roles served are {sorted(ROLES)}")
    calls = message.get("tool_calls") or []
    for key, owner in (("tool_calls", "assistant"), ("tool_call_id", "tool")):
        if message.get(key) not in (None, []) and role != owner:
            raise refuse(f"'{where}' has '{key}'; only a message of role {owner} can carry it")
    if "content" not in message and not calls:
        raise refuse(f"'{where}' has no 'content'")
    content = message.get("content")
    rendered: dict[str, Any] = {
        "role": ROLES[role],
        "content": "" if content is None and calls else message_content(content, where),
    }
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise refuse(f"'{where}.name' must be a string, got {type(name).__name__}")
        rendered["name"] = name
    return {**rendered, **tool_parts(message, role, calls, where)}


def tool_parts(message: dict[str, Any], role: str, calls: Any, where: str) -> dict[str, Any]:
    """An assistant message's ``tool_calls`` and a tool message's ``tool_call_id``, checked."""
    if calls:
        return {"tool_calls": checked_calls(calls, where)}
    if role != "tool":
        return {}
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise refuse(f"'{where}' is a tool message; its 'tool_call_id' must name the call it answers")
    return {"tool_call_id": call_id}


def checked_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's earlier tool calls, with their ``arguments`` parsed for the template."""
    if not isinstance(calls, list):
        raise refuse(f"'{where}.tool_calls' must be a list, got {type(calls).__name__}")
    checked = []
    for index, call in enumerate(calls):
        place = f"'{where}.tool_calls[{index}]'"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise refuse(f'{place} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            given = shown(function.get("arguments"))
            raise refuse(f"{place}.function.arguments must be a JSON string, got {given}") from None
        rendered = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            rendered["id"] = call["id"]
        checked.append(rendered)
    return checked


def message_text(message: dict[str, Any]) -> str:
    """A checked message's text as the limits count it: content, name, call id and earlier calls."""
    calls = json.dumps(message["tool_calls"], ensure_ascii=False) if "tool_calls" in message else ""
    return message["content"] + message.get("name", "") + message.get("tool_call_id", "") + calls


def checked_messages(messages: Any, limits: GenerationLimits) -> list[dict[str, Any]]:
    """The messages, refused before rendering when they are not a list of 1..handler.max_prompt_tokens valid messages
    or hold more text than the prompt limit can take."""
    if not isinstance(messages, list):
        raise refuse(f"'messages' must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise refuse("'messages' is empty")
    if len(messages) > limits.max_prompt_tokens:  # every message renders to at least one token
        raise refuse(
            f"'messages' has {len(messages)} messages; they cannot fit the limit of {limits.max_prompt_tokens} "
            "tokens (handler.max_prompt_tokens)"
        )
    checked = [checked_message(message, index) for index, message in enumerate(messages)]
    characters = sum(len(message_text(message)) for message in checked)
    if characters > limits.max_prompt_chars:
        raise refuse(
            f"'messages' have {characters} characters; they cannot fit the limit of {limits.max_prompt_tokens} "
            "tokens (handler.max_prompt_tokens)"
        )
    for index, message in enumerate(checked):
        if surrogate_at(message_text(message)) is not None:
            raise refuse(f"'messages[{index}]' is not valid Unicode (unpaired surrogate)")
    return checked


def chat_prompt_ids(
    messages: list[dict[str, Any]],
    tokenizer: Any,
    limits: GenerationLimits,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The checked messages (and tools, OpenAI's shape) rendered with the model's chat template (else PLAIN_TEMPLATE)
    and tokenized, refused when the template refuses them, cannot show tools, or the prompt is over
    handler.max_prompt_tokens."""
    from jinja2 import TemplateError

    template = None if has_chat_template(tokenizer) else PLAIN_TEMPLATE
    if tools and not takes_tools(tokenizer, tools):
        raise FieldError(
            "tools",
            "this model's chat template has no tools support (it never uses 'tools'), so they cannot be shown to "
            "the model; send the request without 'tools', or serve the model with a template that renders them",
        )
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=True,
            sanitize_control_tokens=True,
            return_dict=False,
        )
    except TemplateError as error:  # e.g. raise_exception('Conversation roles must alternate user/assistant/...')
        raise refuse(f"the model's chat template refused 'messages': {error}"[:500]) from None
    return prompt_tokens(list(ids), "'messages'", limits)


def takes_tools(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> bool:
    """Whether the chat template that renders a request with tools can show them (the plain template can)."""
    if not has_chat_template(tokenizer):
        return True
    # With tools transformers picks a folder's "tool_use" template where it has several.
    return template_takes_tools(tokenizer.get_chat_template(None, tools or [{"type": "function"}]))


@functools.lru_cache(maxsize=8)
def template_takes_tools(source: str) -> bool:
    """Whether a chat template's source uses the ``tools`` variable (transformers hands tools to it under that
    name); a template that does not would drop them silently."""
    from jinja2 import Environment, TemplateError, meta

    try:
        parsed = Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"]).parse(source)
    except TemplateError:  # a tag of transformers' own environment ({% generation %}): read the text instead
        return re.search(r"\btools\b", source) is not None
    return "tools" in meta.find_undeclared_variables(parsed)


def chat_lookup(messages: list[dict[str, Any]], seed_given: bool, option: CacheRequest) -> PromptLookup:
    """What the similarity cache compares of a chat: its last message, when it is the user's; every earlier message
    (system prompt, history) and that message's name must match exactly."""
    last = messages[-1]
    context = json.dumps([*messages[:-1], {k: v for k, v in last.items() if k != "content"}], sort_keys=True)
    if last["role"] != "user":
        return PromptLookup(None, context, "chat", seed_given, option, skip="not_user_message")
    return PromptLookup(last["content"], context, "chat", seed_given, option)
