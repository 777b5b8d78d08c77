"""Custom TorchServe handlers of this project, in layers.

TorchServe loads one entry module per model (``handler:`` in models/<name>/model.yaml); each defines exactly one
class, a thin list of stages that call the model kind's subpackage. ``core`` holds what every handler shares.

Where each model's request is parsed, batched, computed and answered (paths under handlers/):

- classifier (``classifier.py``): parsed in classification/requests.py ``parse_classifier_request``; batched there as
  a ``ClassifierBatch`` (every request's rows in one tensor); computed by classification/nets.py ``MLPClassifier``;
  answered by classification/requests.py ``answer_requests``.
- minilm and every embedding model packaged from its folder (``embeddings.py``): parsed in embedding/requests.py
  ``parse_embedding_request``; batched by embedding/batch.py ``assemble_batch``, called from text/handler.py
  ``TextModelHandler.preprocess`` (the LRU cache in embedding/cache.py, length buckets in embedding/buckets.py);
  computed by text/model.py ``SentenceEncoder`` (embedding/bert.py's plain-torch BERT or transformers' model, then
  the folder's pooling and normalisation) through the backend that serves it (embedding/backends.py: eager, jit,
  aot, openvino); answered by embedding/batch.py ``answer_requests`` (shapes: embedding/requests.py
  ``format_response``).
- text classifiers, NLI models and cross-encoder rerankers packaged from their folder (``text_classifier.py``):
  parsed in text/classification.py ``parse_classification_request``; batched like embeddings (rows are texts or text
  pairs); computed by text/model.py ``SequenceClassifier`` (logits) through the same backends; answered by
  embedding/batch.py ``answer_requests`` with text/classification.py ``format_answer`` (probabilities:
  text/gate.py ``probabilities``).
- generator (``generator.py``): parsed in generation/requests.py ``parse_generation_request`` (the OpenAI routes
  v1/completions and v1/chat/completions in generation/openai_api.py ``parse_openai_request``, chat messages rendered
  by generation/chat.py); batched by generation/requests.py ``start_generations``; computed by generation/decoding.py
  ``generate`` (model loading: generation/model.py, limits: generation/limits.py); answered by
  ``GeneratorHandler.postprocess`` in the request's API shape (generation/answers.py), streamed pieces by
  generation/streaming.py (NDJSON, or server-sent events for the OpenAI routes).

Every handler answers through core/base.py (``answer``/``reject``: status, content type, strict JSON).

Entry modules: ``classifier.py`` (ClassifierHandler), ``embeddings.py`` (EmbeddingHandler),
``text_classifier.py`` (TextClassifierHandler), ``generator.py`` (GeneratorHandler). Each model's files are loaded by
``classification/nets.py``, ``text/model.py`` (``read_model_files``, ``build_module``; into text/handler.py's
``LoadedTextModel``) and ``generation/model.py`` into a typed ``Loaded*`` object.

text/: the one path of every text model (docs/your-model.md): ``folder.py`` reads and checks a model's folder (kind,
architecture, pooling, prompts, labels, token limit; refusals name the file and the fix), ``model.py`` builds the
torch module and the tokenizer, ``gate.py`` the accuracy measure per kind, ``handler.py`` the shared handler base
``TextModelHandler``, ``classification.py`` classifier and reranker requests and answers.

core/: ``base.py`` the batch orchestration every handler inherits (load, the backend walk with its accuracy gate,
warm-up; per batch: parse each request, preprocess -> inference -> postprocess, one result per request, a failed batch
retried one request at a time, errors mapped to statuses), ``http.py`` request headers and bodies, strict JSON out
(``to_json``), ``errors.py`` per-request errors, ``config.py`` the ``handler:`` config schema, ``metrics.py`` the custom
metrics (config/metrics.yaml is generated from it), ``runtime.py`` device/threads/precision/compile/CPU flags,
``logging_setup.py``, ``memory.py``.
"""
