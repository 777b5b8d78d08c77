"""Custom TorchServe handlers of this project, in layers.

TorchServe loads one entry module per model (``handler:`` in models/<name>/model.yaml); each defines exactly one
class, a thin list of stages that call the model kind's subpackage. ``core`` holds what every handler shares.

Where each model's request is parsed, batched, computed and answered (paths under handlers/):

- classifier (``classifier.py``): parsed in classification/requests.py ``parse_classifier_request``; batched there as
  a ``ClassifierBatch`` (every request's rows in one tensor); computed by classification/nets.py ``MLPClassifier``;
  answered by classification/requests.py ``answer_requests``.
- minilm (``embeddings.py``): parsed in embedding/requests.py ``parse_embedding_request``; batched by
  embedding/batch.py ``assemble_batch`` (the LRU cache in embedding/cache.py, length buckets in embedding/buckets.py);
  computed by embedding/encoder.py ``SentenceEncoder`` through the backend that serves it (embedding/backends.py:
  eager, jit, aot, openvino); answered by embedding/batch.py ``answer_requests`` (shapes:
  embedding/requests.py ``format_response``).
- generator (``generator.py``): parsed in generation/requests.py ``parse_generation_request``; batched by
  generation/requests.py ``start_generations``; computed by generation/decoding.py ``generate`` (model loading:
  generation/model.py); answered by ``GeneratorHandler.postprocess``, streamed pieces by generation/streaming.py.

Every handler answers through core/base.py (``answer``/``reject``: status, content type, strict JSON).

Entry modules: ``classifier.py`` (ClassifierHandler), ``embeddings.py`` (EmbeddingHandler),
``generator.py`` (GeneratorHandler). Each model's files are loaded by ``classification/nets.py``,
``embedding/encoder.py`` and ``generation/model.py`` into a typed ``Loaded*`` object.

core/: ``base.py`` the batch orchestration every handler inherits (load, the backend walk with its accuracy gate,
warm-up; per batch: parse each request, preprocess -> inference -> postprocess, one result per request, a failed batch
retried one request at a time, errors mapped to statuses), ``http.py`` request headers and bodies, strict JSON out
(``to_json``), ``errors.py`` per-request errors, ``config.py`` the ``handler:`` config schema, ``metrics.py`` the custom
metrics (config/metrics.yaml is generated from it), ``runtime.py`` device/threads/precision/compile/CPU flags,
``logging_setup.py``, ``memory.py``.
"""
