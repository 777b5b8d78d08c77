"""The one serving path for text models of every kind: embeddings, text classifiers, cross-encoder rerankers.

``folder.py`` reads what a model's own folder says (kind, architecture, pooling, prompts, labels, token limit) and
refuses what cannot be served; ``model.py`` builds the torch module and the tokenizer from it; ``gate.py`` is the
accuracy gate's measure per kind; ``handler.py`` is the shared handler base (caches, one tokenizer call per batch,
length buckets, compiled backends). The entry modules ``embeddings.py`` and ``text_classifier.py`` add only what a
request of their kind may say and how a computed row is answered.
"""
