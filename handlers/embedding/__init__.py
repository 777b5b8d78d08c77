"""The embedding model kind: request bodies and answers (``requests``), batch assembly with the cache
(``batch``, ``cache``, ``buckets``) and the model with its files (``encoder``)."""
