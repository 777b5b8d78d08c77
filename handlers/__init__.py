"""Custom TorchServe handlers of this project, in layers.

TorchServe loads one entry module per model (``handler:`` in models/<name>/model.yaml); each defines exactly one
class, a thin list of stages that call the model kind's subpackage. ``core`` holds what every handler shares.

Where each model's request is parsed, batched, computed and answered (paths under handlers/):

- every team's own network (``network_model.py``), the classifier among them: parsed by network/oip.py (the Open
  Inference Protocol, JSON or binary; the native JSON form) or by the archive's own ``handler.py`` preprocess hook
  (network/hooks.py; the classifier's is models/classifier/handler.py), each request's tensors checked against the
  program's signature (network/inputs.py); batched and computed by network/engine.py ``NetworkEngine`` (requests of
  equal shapes concatenated, passes of bounded rows) through the program (network/program.py) or the backend that
  serves it (network/backends.py); answered by network/handler.py ``NetworkHandler.encode`` in the protocol it was
  asked in, or by the archive's postprocess hook.
- minilm and every text model packaged from its folder, of any kind (``embeddings.py``, ``text_classifier.py``,
  ``text_model.py``): routed by the URL path to one row of the kind's route table (text/routes.py ``Route``; the rows
  are listed by the kind's class, handlers/text/kinds/), and parsed by that row's parser: one module per API dialect,
  text/dialects/ (native.py, openai.py, cohere.py, jina.py, tei.py), the other kinds' own bodies in text/requests/
  (classification.py, zero_shot.py, sparse.py, multi_vector.py); batched by text/batch.py ``assemble_batch``, called
  from text/engine.py ``TextEngine.prepare`` (the LRU cache in text/cache.py, the shared tier in
  text/shared_cache.py, length buckets in text/buckets.py); computed by text/model.py ``TextModule`` (text/bert.py's
  plain-torch BERT or the transformers class the packaging step recorded, then the folder's sentence-transformers
  modules, text/modules.py) through the backend that serves it (text/backends.py: eager, jit, aot, openvino), each row
  turned into its kind's value (``TextKind.row_value``); answered by text/batch.py ``answer_requests`` with the route's
  answer writer, refusals in the route's error shape (core/errors.py ``error_body``).
- image models packaged from their folder (``image_model.py``: an image classifier): routed by the URL path to a row
  of the kind's route table (image/kinds/), parsed by the kind (its images' bytes from the body:
  image/requests.py, image/inputs.py); batched by image/engine.py ``ImageEngine.prepare`` (the LRU of text/cache.py
  keyed by the image bytes' digest, image/decode.py for the misses, image/preprocess.py as the folder's image
  processor does, one tensor per pixel shape); computed by the kind's module (the transformers class the packaging
  step recorded, image_model.json); answered by ``ImageEngine.finish`` with the kind's answer writer.
- generator (``generator.py``, the TorchServe adapter): routed by the URL path to one of its API surfaces
  (generation/routes.py ``GENERATION_ROUTES``: the native API, OpenAI's completions and chat, describe), and parsed by
  that route's dialect module: generation/native.py ``parse_generation_request``, generation/openai_api.py
  ``parse_completion`` / ``parse_chat`` (chat messages rendered by generation/chat.py), the checks they share in
  generation/requests.py; batched by generation/loop.py ``GenerationLoop`` (per step: generation/scheduler.py; whole
  batch: generation/requests.py ``start_generations``); computed by generation/running.py (``RunningBatch``,
  ``generate``; model loading: generation/model.py, limits: generation/limits.py); answered by
  ``GenerationLoop.postprocess`` / ``GenerationLoop.step`` in the request's dialect shape (its route's answer writer,
  generation/answers.py), streamed pieces by generation/streaming.py (NDJSON, or server-sent events for the OpenAI
  routes).

Every handler answers through core/base.py (``answer``/``reject``: status, content type, strict JSON).

Entry modules: ``network_model.py`` (NetworkModelHandler), ``embeddings.py`` (EmbeddingHandler), ``text_classifier.py``
(TextClassifierHandler), ``text_model.py`` (TextHandler, any kind), ``image_model.py`` (ImageHandler, any image
kind), ``generator.py`` (GeneratorHandler). Each model's
files are loaded by ``network/program.py``, ``text/model.py`` (``read_model_files``, ``build_module``; into
text/engine.py's ``LoadedTextModel``) and ``generation/model.py`` into a typed ``Loaded*`` object.

text/: the one engine of every text model (docs/your-model.md): ``folder.py`` reads and checks a model's folder,
``kinds/`` holds one class per kind in one table (what a kind reads, computes, measures and answers), ``modules.py``
the sentence-transformers module chain as torch steps, ``model.py`` the torch module, ``tokenization.py`` the
tokenizer exactly as transformers builds it, ``engine.py`` the text engine ``TextEngine`` (load, then rows in and
values or per-row errors out, with no TorchServe in it), ``handler.py`` its TorchServe adapter ``TextModelHandler``,
``batch.py``/``cache.py``/``shared_cache.py``/``buckets.py``/``backends.py`` the batch path, ``dialects/`` one
module per API dialect (typed requests, parsers, answer writers, route rows), ``requests/`` each kind's own body and
what the dialects share.

core/: ``engine.py`` what every model family does at load (device, threads, the backend walk with its accuracy gate,
warm-up), ``base.py`` the batch orchestration every handler inherits (TorchServe's context -> an engine; per batch:
parse each request, preprocess -> inference -> postprocess, one result per request, a failed batch
retried one request at a time, errors mapped to statuses), ``http.py`` request headers and bodies, strict JSON out
(``to_json``), ``errors.py`` per-request errors, ``config.py`` the ``handler:`` config schema, ``metrics.py`` the custom
metrics (config/metrics.yaml is generated from it), ``runtime.py`` device/threads/precision/compile/CPU flags,
``logging_setup.py``, ``memory.py``.
"""
