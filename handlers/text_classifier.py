"""Handler for text classifiers, NLI models and cross-encoder rerankers packaged from a Hugging Face folder.

Labels from the folder's ``id2label``; softmax for a single-label model, a sigmoid per label for a multi-label one, a
relevance score per document for a one-output reranker (handlers/text/requests/classification.py). The batch path is
the one text-model path, :class:`handlers.text.handler.TextModelHandler`; this entry serves archives of the
classification kind (handlers/text/kinds/classification.py).
"""

from __future__ import annotations

from handlers.text.handler import TextModelHandler


class TextClassifierHandler(TextModelHandler):
    kind_name = "classification"
