"""The APIs text models speak, one module per dialect: its typed request(s), the parser that validates a body into one
(raising RequestError), the answer writer that shapes the computed rows, and its route rows
(:class:`handlers.text.routes.Route`: path, parser, answer writer, error shape). A kind lists the rows it serves
(handlers/text/kinds/base.py ``routes()``); once a request is routed, nothing tests its URL or dialect again.

- native.py: the embedding kind's own body at ``/predictions/<model>`` (the other kinds' own bodies are their
  request modules, handlers/text/requests/);
- openai.py: ``/v1/embeddings``;
- cohere.py: ``/v2/embed``, ``/v2/rerank``, and Cohere v1's rerank body;
- jina.py: ``/v1/rerank``, where Cohere v1's and Jina's rerank clients both post;
- tei.py: text-embeddings-inference's ``/embed``, ``/embed_sparse``, ``/rerank``, ``/tokenize``, ``/decode``, ``/info``.

What the dialects share (text lists, limits, prompts, vector sizes and encodings, the rerank ranking) lives in
handlers/text/requests/. Adding a dialect is a new module here and its rows in the kinds' ``routes()``.
"""
