"""Baselines for the side-by-side comparison (loadtests/compare.py). Each is deliberately what a first attempt looks
like, not a straw man: the same model, the same request and answer shapes, the same machine.

- naive_handler.py: a TorchServe handler as a first version is written: fp32, eager, batchSize 1, one tokenizer call
  and one forward pass per request (archive spec: naive-model-config.yaml, built by compare.py);
- flask_server.py: the plain Flask pattern: one request, one forward pass;
- ray_serve_app.py: Ray Serve with @serve.batch around sentence-transformers (its own venv: baseline_env.py);
- inprocess.py: the ceiling: this project's own handler called directly in a loop (no HTTP, no queue).
"""
