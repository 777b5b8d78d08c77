"""Custom TorchServe handlers of this project and their shared machinery.

Each model kind has one handler module (``classifier``, ``embeddings``) that defines exactly one class, as TorchServe
requires; everything they share (config, device and precision choice, compilation and warm-up, error mapping, metrics)
lives in ``base`` and the small modules beside it.
"""
