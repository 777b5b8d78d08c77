"""The generator model kind: request bodies (``requests``; OpenAI's completions and chat completions mapped onto them:
``openai_api``, chat templates: ``chat``), the model and its files (``model``), the decoding loop (``decoding``), text
pieces and stop sequences as tokens arrive (``streaming``) and the shape of answers per API (``answers``)."""
