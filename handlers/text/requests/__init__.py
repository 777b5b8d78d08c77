"""What a request to a text model may say, per kind, and how its answer is shaped: one module per kind (embedding,
classification, sparse, multi_vector) on top of ``common`` (body decoding, text and size checks)."""
