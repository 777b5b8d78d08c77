"""The ``classifier`` model: a multi-layer perceptron on rows of 128 numbers (not a text model; text classifiers are
``handlers/text/kinds/classification.py``). Its network (``nets``) and its request bodies and answers (``requests``)."""
