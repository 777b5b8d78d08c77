"""The generator model kind: its API surfaces (``routes``: one row per dialect, each a module with its parser and
answer writer: ``native``, OpenAI's completions and chat completions ``openai_api`` with chat templates in ``chat``;
the checks they share: ``requests``), the generation loop (``loop``: per-step scheduling in ``scheduler`` over
``running``, or a whole batch), the model and its files (``model``), the decoding steps (``decoding``), text pieces and
stop sequences as tokens arrive (``streaming``) and the shape of answers per API (``answers``). The routes and the loop
take no TorchServe types: handlers/generator.py adapts TorchServe's calls to them."""
