"""The classifier model kind: its network (``nets``) and its request bodies and answers (``requests``)."""
