"""The one engine of every image model: image classifiers (any folder transformers' AutoModelForImageClassification
loads) and, through their kind, image-text embedders.

``folder.py`` reads what a model folder (and the archive's ``image_model.json``) says; ``preprocess.py`` makes an
image into the model's pixels exactly as the folder's image processor does, batched; ``reference.py`` the generated
images of the parity check and the accuracy gate; ``kinds/`` holds one class per kind (reading its folder, the
reference library's answers, the gate's measure, what a computed row is, its requests and answers); ``engine.py`` is
the image engine (the worker's LRU keyed by the image bytes' digest, decode, preprocess, one forward pass per pixel
shape; no TorchServe in it), ``handler.py`` its TorchServe adapter. Decoding an image's bytes (limits, formats,
orientation) is ``decode.py``'s, reading images out of a request ``inputs.py``'s. Nothing here branches on a kind's
name.
"""
