"""The one engine of every text model: embeddings, classifiers and cross-encoder rerankers, sparse (SPLADE) and
multi-vector (ColBERT-style) encoders, of any architecture transformers loads.

``folder.py`` reads what a model's own folder says and refuses what cannot be served; ``kinds/`` holds one class per
kind (reading its folder, the reference library's answers, the gate's measure, what a computed row is, its requests);
``modules.py`` computes sentence-transformers' module chains; ``model.py`` builds the torch module; ``tokenization.py``
serves the tokenizer exactly as transformers builds it; ``engine.py`` is the text engine (caches, one
tokenizer call per batch, length buckets, compiled backends; no TorchServe in it), ``handler.py`` its TorchServe
adapter; ``requests/`` parses each kind's requests and shapes its
answers. Nothing here branches on a kind's name.
"""
