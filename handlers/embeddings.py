"""Handler for embedding models: minilm and any sentence-transformers model packaged from its folder.

Sentence embeddings as the model's folder defines them (pooling and the modules after it, token limit, named prompts):
the same vector as sentence-transformers' ``encode()``. Everything a batch goes through is the one text-model path,
:class:`handlers.text.handler.TextModelHandler`; this entry serves archives of the embedding kind
(handlers/text/kinds/embedding.py), at /predictions/<model> (every body shape) and at
/predictions/<model>/<version>/v1/embeddings, OpenAI's embeddings API as its official client sends it
(docs/clients.md).
"""

from __future__ import annotations

from handlers.text.handler import TextModelHandler


class EmbeddingHandler(TextModelHandler):
    kind_name = "embedding"
