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

Accepted messages: ``role`` system, developer (rendered as system), user or assistant; ``content`` a string or a list
of ``{"type": "text", "text": ...}`` parts (joined with newlines, as vLLM does); ``name`` optional. Tool calls, tool
messages, images and audio are refused with a message naming the place; other keys are refused unless null or empty.
"""

from __future__ import annotations

import json
from typing import Any

from handlers.core.errors import shown, surrogate_at
from handlers.generation.requests import FieldError, GenerationLimits, prompt_tokens
from handlers.generation.semantic_cache.options import CacheRequest, PromptLookup

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MESSAGE_KEYS = ("role", "content", "name")
PLAIN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ message['role'] }}{% if message.get('name') %} ({{ message['name'] }}){% endif %}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}assistant:{% endif %}"
)


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


def checked_message(message: Any, index: int) -> dict[str, str]:
    """One message as the template sees it: {role, content[, name]}."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise refuse(f"'{where}' must be an object with 'role' and 'content', got {type(message).__name__}")
    extra = sorted(key for key, value in message.items() if key not in MESSAGE_KEYS and value not in (None, [], {}))
    if extra:
        raise refuse(f"'{where}' has {extra}: tool calls, tool results and audio are not served"[:300])
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise refuse(f"'{where}.role' is {shown(role)}; the roles served are {sorted(ROLES)}")
    if "content" not in message:
        raise refuse(f"'{where}' has no 'content'")
    rendered = {"role": ROLES[role], "content": message_content(message["content"], where)}
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise refuse(f"'{where}.name' must be a string, got {type(name).__name__}")
        rendered["name"] = name
    return rendered


def checked_messages(messages: Any, limits: GenerationLimits) -> list[dict[str, str]]:
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
    characters = sum(len(m["content"]) + len(m.get("name", "")) for m in checked)
    if characters > limits.max_prompt_chars:
        raise refuse(
            f"'messages' have {characters} characters; they cannot fit the limit of {limits.max_prompt_tokens} "
            "tokens (handler.max_prompt_tokens)"
        )
    for index, message in enumerate(checked):
        if surrogate_at("".join(message.values())) is not None:
            raise refuse(f"'messages[{index}]' is not valid Unicode (unpaired surrogate)")
    return checked


def chat_prompt_ids(messages: list[dict[str, str]], tokenizer: Any, limits: GenerationLimits) -> list[int]:
    """The checked messages rendered with the model's chat template (else PLAIN_TEMPLATE) and tokenized, refused
    when the template refuses them or the prompt is over handler.max_prompt_tokens."""
    from jinja2 import TemplateError

    template = None if has_chat_template(tokenizer) else PLAIN_TEMPLATE
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=True,
            sanitize_control_tokens=True,
            return_dict=False,
        )
    except TemplateError as error:  # e.g. raise_exception('Conversation roles must alternate user/assistant/...')
        raise refuse(f"the model's chat template refused 'messages': {error}"[:500]) from None
    return prompt_tokens(list(ids), "'messages'", limits)


def chat_lookup(messages: list[dict[str, str]], seed_given: bool, option: CacheRequest) -> PromptLookup:
    """What the similarity cache compares of a chat: its last message, when it is the user's; every earlier message
    (system prompt, history) and that message's name must match exactly."""
    last = messages[-1]
    context = json.dumps([*messages[:-1], {k: v for k, v in last.items() if k != "content"}], sort_keys=True)
    if last["role"] != "user":
        return PromptLookup(None, context, "chat", seed_given, option, skip="not_user_message")
    return PromptLookup(last["content"], context, "chat", seed_given, option)
