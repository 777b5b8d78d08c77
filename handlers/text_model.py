"""Handler for every text model packaged from its folder, of whatever kind the archive holds: an embedding model, a
classifier or reranker, a sparse (SPLADE) or a multi-vector (ColBERT-style) encoder.

The kind is what the packaging step recorded in the archive's ``text_model.json`` (read from the folder itself,
handlers/text/kinds/); everything else is the one text-model path, :class:`handlers.text.handler.TextModelHandler`.
"""

from __future__ import annotations

from handlers.text.handler import TextModelHandler


class TextHandler(TextModelHandler):
    kind_name = None
