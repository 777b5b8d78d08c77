"""A similarity ("semantic") cache in front of generation: a prompt close enough in meaning to one already answered,
with everything else that decides the answer equal, gets the stored answer instead of a new decode
(docs/semantic-cache.md).

- :mod:`.options`: the model's ``handler.semantic_cache`` section and a request's ``semantic_cache`` field;
- :mod:`.embedder`: the prompts' vectors, from an embedding model in the archive, through the embedding handler;
- :mod:`.store`: one worker's index (bounded, LRU, TTL), searched within a request's group only;
- :mod:`.shared`: the tier shared by workers and replicas (a Redis stream);
- :mod:`.cache`: the groups (what must match exactly), lookups per batch, storing answers, metrics.
"""
